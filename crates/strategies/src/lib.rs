//! wick-strategies: how a model's parameters, gradients and optimizer state are laid out
//! over the ranks, on Candle tensors.
//!
//! It owns the counter-based parameter init that makes any slice of a parameter on its own
//! ([`init`]), wick's optimizers over plain or flat buffers ([`optim`]), and the strategies:
//! [`SingleDevice`], [`Ddp`] (bucketed gradient all-reduce) and [`Zero`] stages 1 and 2
//! (sharded optimizer state, then gradients), one [`Replicated`] type over how gradients are
//! reduced; [`Zero3`] (parameters born sharded, gathered per step by an autograd op), of
//! which [`Fsdp`] builds its sharded modes. A
//! strategy reaches other ranks only through wick-core's `Collective`, so it runs over any
//! world (threads, MPI, NCCL) without knowing which, and on any device: the autograd ops that
//! move data have a CUDA forward with the `cuda` feature.

// Functions of at most 80 lines (clippy.toml), in library code; tests may run longer.
#![warn(clippy::too_many_lines)]

mod bucket_reduce;
mod clip;
mod ddp;
#[cfg(feature = "cuda")]
mod device_storage;
mod flat_grad;
pub mod flat_layout;
mod fsdp;
mod gather_op;
mod grad_scaler;
mod grads;
pub mod init;
mod kept_grads;
mod nonfinite;
mod op_tensors;
pub mod optim;
mod param_request;
mod param_use;
mod precision;
mod prefetch;
mod recompute_op;
mod registry;
mod replicated;
mod replicated_strategy;
mod saved_state;
mod sharded_options;
mod sharded_params;
mod single;
mod spec;
mod storage_swap;
mod unit_op;
mod unit_views;
mod zero;
mod zero3;

pub use ddp::{BucketedAllReduce, Ddp};
pub use fsdp::{Fsdp, FsdpSharding};
pub use precision::Precision;
pub use registry::strategy_by_name;
pub use replicated_strategy::Replicated;
pub use single::{NoReduce, SingleDevice};
pub use spec::{FsdpSpec, StrategyKind, StrategySpec};
pub use zero::{Zero, ZeroReduce};
pub use zero3::Zero3;

// What a crate that uses wick-strategies alone (a hand-written loop) needs from wick-core;
// the rest of it is reachable as `wick_strategies::wick_core`.
pub use wick_core;
pub use wick_core::{
    Algorithm, BackwardReport, Collective, Error, GradSync, LrSchedule, OptimizerConfig, ReduceOp,
    ShardedContext, SoloWorld, StepOptions, StepReport, Strategy, StrategySetup, StrategyState,
    StrategyStep, TrainModule, Wrapped,
};
