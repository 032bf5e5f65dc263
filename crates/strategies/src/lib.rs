//! wick-strategies: how a model's parameters, gradients and optimizer state are laid out
//! over the ranks, on Candle tensors.
//!
//! It owns the counter-based parameter init that makes any slice of a parameter on its own
//! ([`init`]), wick's optimizers over plain or flat buffers ([`optim`]), and the strategies:
//! [`SingleDevice`], [`Ddp`] (bucketed gradient all-reduce) and [`Zero`] stages 1 and 2
//! (sharded optimizer state, then gradients), one [`Replicated`] type over how gradients are
//! reduced; [`Sharded`] (parameters born sharded, gathered per step by an autograd op):
//! ZeRO-3 as [`Zero3`], and the sharded modes [`Fsdp`] builds. A strategy reaches other
//! ranks only through wick-core's `Collective`, so it runs over any world (threads, MPI,
//! NCCL) without knowing which, and on any device: the autograd ops that move data have a
//! CUDA forward with the `cuda` feature.

// Functions of at most 80 lines (clippy.toml), in library code; tests may run longer.
#![warn(clippy::too_many_lines)]

mod isa;
mod layout;
pub mod optim;
mod replicated;
mod sharded;
mod spec;
mod step;
mod units;

pub use layout::{flat_layout, init};

pub use replicated::ddp::{BucketedAllReduce, Ddp};
pub use replicated::replicated_strategy::Replicated;
pub use replicated::single::{NoReduce, SingleDevice};
pub use replicated::zero::{Zero, ZeroReduce};
pub use sharded::fsdp::{Fsdp, FsdpSharding};
pub use sharded::sharded_strategy::{Sharded, Zero3};
pub use spec::registry::strategy_by_name;
pub use spec::strategy_spec::{StrategyKind, StrategyOptions, StrategySpec};
pub use step::precision::Precision;

// What a crate that uses wick-strategies alone (a hand-written loop) needs from wick-core;
// the rest of it is reachable as `wick_strategies::wick_core`.
pub use wick_core;
pub use wick_core::{
    Algorithm, BackwardReport, Collective, CollectiveExt, Error, GradSync, LrSchedule,
    OpenSharding, OptimizerConfig, RankStrategy, ReduceOp, ShardedContext, SoloWorld, StepOptions,
    StepReport, Strategy, StrategyState, StrategyStep, TrainModule, Wrapped,
};
