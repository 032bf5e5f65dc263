//! wick-core: the contracts every other wick crate meets in.
//!
//! It owns the hook traits a model and a callback implement ([`TrainModule`], [`Callback`]),
//! the [`Stage`]s, the [`Collective`] trait that worlds implement, the [`Strategy`] trait that
//! strategies implement, the [`ShardedContext`] handed to `configure_sharded_model`, the
//! optimizer configuration a module returns (with its learning-rate schedule), the
//! [`TokenBatch`] a language model trains on (and the [`PreferenceBatch`] it is tuned on by
//! preference), the state a checkpoint holds ([`RankState`],
//! [`StateReader`]), the forms a frozen base is kept in as blocks ([`BlockFormat`], whose
//! geometry the strategies shard by), and the error types. It knows no other wick crate
//! and no device or collective engine.

// Functions of at most 80 lines (clippy.toml), in library code; tests may run longer.
#![warn(clippy::too_many_lines)]

mod activation_checkpointing;
mod block_format;
mod blocking_world;
mod call;
mod callback;
mod collective;
mod context;
mod error;
mod grad_mode;
mod lock;
mod lr_schedule;
mod module;
mod nf4;
mod optimizer;
mod preference_batch;
mod safetensors_file;
mod solo_world;
mod splitmix;
mod stage;
mod state;
mod strategy;
mod token_batch;
mod wait_clock;
mod weights;

pub use activation_checkpointing::ActivationCheckpointing;
pub use block_format::{with_stored_bytes, BlockFormat};
pub use blocking_world::BlockingWorld;
pub use call::{all_gather_through_tensor, reduce_scatter_padded, Call, CallKind};
pub use callback::{Callback, CallbackClone, RunState};
pub use collective::{Collective, CollectiveExt, Position, ReduceOp, Work};
pub use context::{
    sharding_context_active, ContextGuard, ParamRequest, ParamSource, RecomputeFn, ShardedContext,
    UnitBlock, UnitFn, UnitRuns, Wrapped,
};
pub use error::{CollectiveError, Error, FileError, Result};
pub use grad_mode::{grad_enabled, no_grad};
pub use lock::lock;
pub use lr_schedule::{Decay, LrSchedule};
pub use module::{StepMetric, TrainModule, IGNORE_INDEX};
pub use nf4::{
    decode_nf4_stored, dynamic_code, nf4_absmax, nf4_offset, nf4_stored_len, Nf4Tensor,
    ABSMAX_BLOCK, NF4_BLOCK, NF4_LEVELS, NF4_STORED_BLOCK, NF4_STORED_BYTES,
};
pub use optimizer::{Algorithm, OptimizerConfig};
pub use preference_batch::PreferenceBatch;
pub use safetensors_file::SafetensorsFile;
pub use solo_world::SoloWorld;
pub use splitmix::splitmix64;
pub use stage::Stage;
pub use state::{FlatGroup, GroupRange, LossScale, RankState, StateReader, PARAM_KIND};
pub use strategy::{
    configure_rank, BackwardReport, CloseSharding, GradSync, OnNonFinite, OpenSharding,
    RankStrategy, Sharding, StateBytes, StepOptions, StepReport, Strategy, StrategyState,
    StrategyStep,
};
pub use token_batch::TokenBatch;
pub use wait_clock::WaitClock;
pub use weights::{BlockRead, ParamInit, PretrainedWeights, WeightSource};
