//! The collective engines. Each holds its transport only; what every engine checks of a
//! call (which collective, dtype, lengths) is `call.rs`, and the rank-order reduction and
//! host-byte access they share are `reduce.rs` and `host.rs`. An engine whose cargo feature
//! is off is a stand-in with the same names that returns a clear error, so the code that
//! picks an engine has one path.

/// `Collective` for an engine's stand-in, a type with no values (a field `never:
/// Infallible`): no method can ever be called.
#[cfg(any(not(feature = "mpi"), not(feature = "nccl")))]
macro_rules! stand_in_collective {
    ($ty:ty) => {
        impl wick_core::Collective for $ty {
            fn position(&self) -> wick_core::Position {
                match self.never {}
            }

            fn start(
                &self,
                _: wick_core::Call<'_>,
            ) -> Result<wick_core::Work, wick_core::CollectiveError> {
                match self.never {}
            }
        }
    };
}
#[cfg(any(not(feature = "mpi"), not(feature = "nccl")))]
pub(crate) use stand_in_collective;

pub(crate) mod call;
mod ended;
pub(crate) mod host;
mod host_calls;
#[cfg(feature = "mpi")]
mod mpi;
#[cfg(not(feature = "mpi"))]
mod mpi_stand_in;
#[cfg(feature = "nccl")]
mod nccl;
#[cfg(not(feature = "nccl"))]
mod nccl_stand_in;
pub(crate) mod reduce;
mod thread;

pub use ended::EndedWorld;
#[cfg(feature = "mpi")]
pub use mpi::MpiWorld;
#[cfg(not(feature = "mpi"))]
pub use mpi_stand_in::MpiWorld;
#[cfg(feature = "nccl")]
pub use nccl::NcclWorld;
#[cfg(not(feature = "nccl"))]
pub use nccl_stand_in::NcclWorld;
pub(crate) use thread::panic_message;
pub use thread::{RankError, ThreadComm, ThreadWorld};
