//! wick: Lightning-style training with sharded data parallelism for Candle.
//!
//! This facade re-exports the layers: [`core`] (hook traits, collectives, strategy trait),
//! [`strategies`] (single, ddp, optimizers, sharded init), [`accelerator`] (devices, worlds,
//! sharded setup), [`trainer`] (the `Trainer`) and [`nn`] (fused training layers). The `wick`
//! program and the main job's model live in this package too, as the binary's own modules.
//!
//! The README follows; its example is compiled and run as a doctest.

// Functions of at most 80 lines (clippy.toml), in library code; tests may run longer.
#![warn(clippy::too_many_lines)]
#![doc = include_str!("../README.md")]

pub use wick_accelerator as accelerator;
pub use wick_core as core;
pub use wick_models as models;
pub use wick_nn as nn;
pub use wick_strategies as strategies;
pub use wick_trainer as trainer;

mod terminal_log;
pub use terminal_log::TerminalLog;

/// The user guide (`docs/guide.md`): choosing a strategy, writing a `TrainModule`,
/// checkpoints and resharding, launching. Its Rust example runs as a doctest;
/// `scripts/guide-check.sh` runs its commands.
#[doc = include_str!("../docs/guide.md")]
pub mod guide {}

/// The checkpoints page (`docs/checkpoints.md`), compiled here so that its example is a
/// doctest like the guide's.
#[cfg(doctest)]
#[doc = include_str!("../docs/checkpoints.md")]
pub struct CheckpointsPage;
