//! wick-accelerator: devices and worlds.
//!
//! It owns where a rank runs (its `candle_core::Device`), how ranks are launched and find
//! each other ([`ThreadWorld`]: ranks as threads of one process, the embedded default;
//! [`LaunchEnv`]: a launcher such as `mpirun` or `srun` started one process per rank, and
//! with the `mpi` feature they form an [`MpiWorld`]; with `nccl`, CUDA ranks form an
//! [`NcclWorld`]; without those features both are stand-ins that say so). A rank's world
//! and device ([`RankEnv`]) are what core's `configure_rank` opens a strategy's sharding
//! context on; the accelerator touches no parameter. Process-wide settings for CPU training (Candle's
//! element-wise pool, glibc's malloc) are a program's explicit choice, one call:
//! [`tune_host_process`]. What a device can tell of a step (its peak memory, its measured
//! matmul rate) is here too ([`memory_peak`], [`matmul_peak_flops`], [`rank_peak_flops`]). It knows wick-core only; strategies meet it through
//! core's `Strategy` and `Collective` traits.

// Functions of at most 80 lines (clippy.toml), in library code; tests may run longer.
#![warn(clippy::too_many_lines)]

mod accelerator;
mod device;
mod device_measures;
mod host_tuning;
mod launcher;
mod thread_budget;
mod worker_spin;
mod worlds;

pub use accelerator::{Accelerator, RankEnv, WorldLayer};
pub use device::{cuda_device_count, DeviceKind};
#[cfg(feature = "cuda")]
pub use device::{cuda_memory_peak, reset_cuda_memory_peak};
pub use device_measures::{matmul_peak_flops, memory_peak, rank_peak_flops, reset_memory_peak};
pub use host_tuning::{tune_host_process, HostTuning};
pub use launcher::{LaunchEnv, Launcher};
/// rsmpi, the MPI bindings `MpiWorld` uses, for code that calls MPI itself on the same
/// world (the bandwidth example measures Open MPI's own speed with it).
#[cfg(feature = "mpi")]
pub use mpi;
pub use thread_budget::ThreadBudget;
pub use worlds::{EndedWorld, MpiWorld, NcclWorld, RankError, ThreadComm, ThreadWorld};

// What a crate that uses wick-accelerator alone needs from wick-core to use its worlds and
// set a module up on them; the rest of wick-core is reachable as `wick_accelerator::wick_core`.
pub use wick_core;
pub use wick_core::{
    configure_rank, Collective, CollectiveError, CollectiveExt, Error, RankStrategy, ReduceOp,
    ShardedContext, SoloWorld, Strategy, TrainModule, Work,
};
