//! wick-trainer: the `Trainer`, which sequences a run and nothing more.
//!
//! It owns the stage order of fit, validate, test and predict (docs/design.md), the training and
//! evaluation loops, callbacks (and the stock ones: [`EarlyStopping`], [`LearningRateMonitor`]),
//! how each global batch is split over the ranks ([`DataLoader`]), token files of text
//! tokenized once ([`TokenDataset`]) and the preference pairs of one ([`PreferenceDataset`]),
//! the metrics CSV, the progress bar, and checkpoints ([`checkpoint`]: sharded save, resume
//! at any world size, consolidation, [`ModelCheckpoint`]). Devices, worlds and the sharded setup belong to
//! wick-accelerator; parameter layout and optimizer state to the strategy.
//!
//! It prints nothing itself: warnings, notes and the model summary go through the `log`
//! crate, to whatever logger the program installs (the `wick` program's prints them as
//! before).

// Functions of at most 80 lines (clippy.toml), in library code; tests may run longer.
#![warn(clippy::too_many_lines)]

mod attached;
mod builder;
mod callbacks;
pub mod checkpoint;
mod config;
mod data;
mod error;
mod logging;
mod loops;
mod preemption;
mod replicate;
mod run_dirs;
mod stage_launcher;
mod trainer;

pub use attached::Attached;
pub use builder::{StrategyChoice, TrainerBuilder};
pub use callbacks::{EarlyStopping, LearningRateMonitor};
pub use checkpoint::{consolidate, Checkpoint, CheckpointError, Mode, ModelCheckpoint};
pub use data::data_loader::{DataLoader, Dataset};
pub use data::epoch_order::EpochOrder;
pub use data::packing::{best_fit_decreasing, Packing};
pub use data::preference_dataset::PreferenceDataset;
pub use data::token_dataset::TokenDataset;
pub use data::token_file::{
    write_token_file, Split, TokenSplit, PAIRS_KEY, TOKENIZER_KEY, VOCAB_KEY,
};
pub use data::token_file_writer::{TokenFileWriter, Written};
pub use error::TrainerError;
pub use logging::loggers::{LogDestination, Logger};
pub use logging::mlflow::MlflowTarget;
pub use logging::sinks::{StepRecord, StepSink};
pub use loops::Metrics;
pub use preemption::Preemption;
#[cfg(unix)]
pub use preemption::PREEMPTION_SIGNALS;
pub use replicate::Replicate;
pub use trainer::Trainer;

/// The `log` target of the model summary that rank 0 logs after the first step (a table,
/// one record), so that a logger can print it apart from warnings and notes.
pub const SUMMARY_TARGET: &str = "wick::summary";

// What a crate that uses wick-trainer alone needs to write a module and configure a run;
// the crates below are reachable whole under their own names.
pub use wick_accelerator::{self, Accelerator, DeviceKind};
pub use wick_core::{
    self, Algorithm, Callback, LrSchedule, OptimizerConfig, RunState, ShardedContext, Stage,
    TrainModule, Wrapped,
};
pub use wick_strategies::{self, Fsdp, FsdpSharding, Precision};
