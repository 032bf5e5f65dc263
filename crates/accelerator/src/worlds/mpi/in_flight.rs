//! MPI's nonblocking calls while they are in flight: the request with every buffer MPI
//! reads or writes until its wait, and a reduction's all-to-all waiting to be summed.

use super::setup::mpi_lock;
use crate::worlds::reduce::reduce_ranks;
use candle_core::DType;
use wick_core::{CallKind, CollectiveError, ReduceOp};

/// The address of `bytes` for a raw MPI call: for an empty buffer an aligned dangling one,
/// never 1 (see `real` in `mod.rs`); MPI reads no byte of an empty buffer.
pub(super) fn address(bytes: &[u8]) -> *const std::ffi::c_void {
    if bytes.is_empty() {
        std::ptr::NonNull::<u64>::dangling()
            .as_ptr()
            .cast_const()
            .cast()
    } else {
        bytes.as_ptr().cast()
    }
}

/// A nonblocking MPI call in flight, with everything MPI reads or writes until it completes.
///
/// Dropped before [`InFlight::wait`], it waits for the call itself before its buffers go:
/// MPI may still read and write them (MPI cannot cancel a collective). `Work`'s drop
/// already completes a started call; this holds for any other path that drops one.
pub(super) struct InFlight {
    /// `None` once waited for.
    request: Option<mpi::ffi::MPI_Request>,
    /// Count arrays and buffers (tensors, byte vectors) MPI reads or writes until then.
    _keep: Box<dyn std::any::Any + Send>,
    rank: usize,
    op: CallKind,
}

// SAFETY: the request and the buffers are touched only by `wait`, under `MPI_LOCK`.
unsafe impl Send for InFlight {}

impl InFlight {
    /// Checks the code a nonblocking call returned and keeps `keep` alive until its wait.
    pub(super) fn new(
        code: i32,
        request: mpi::ffi::MPI_Request,
        keep: impl std::any::Any + Send,
        rank: usize,
        op: CallKind,
    ) -> Result<Self, CollectiveError> {
        if code != 0 {
            return Err(CollectiveError::Mismatch {
                rank,
                op: op.name(),
                message: format!("the nonblocking MPI call returned error code {code}"),
            });
        }
        Ok(InFlight {
            request: Some(request),
            _keep: Box::new(keep),
            rank,
            op,
        })
    }

    pub(super) fn wait(mut self) -> Result<(), CollectiveError> {
        self.complete()
    }

    fn complete(&mut self) -> Result<(), CollectiveError> {
        let Some(mut request) = self.request.take() else {
            return Ok(());
        };
        let _guard = mpi_lock();
        // SAFETY: `request` came from a nonblocking collective and is waited on once (it
        // was taken out of `self.request`).
        let code = unsafe { mpi::ffi::MPI_Wait(&mut request, mpi::ffi::RSMPI_STATUS_IGNORE) };
        if code != 0 {
            return Err(CollectiveError::Unsupported {
                rank: self.rank,
                op: self.op.name(),
                message: format!("MPI_Wait returned error code {code}"),
            });
        }
        Ok(())
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        // Runs before the fields drop, so `_keep` (and an `Exchange`'s `received`, a later
        // field) outlive MPI's use of them.
        if let Err(e) = self.complete() {
            log::debug!("a dropped MPI call completed with an error: {e}");
        }
    }
}

/// The all-to-all of a reduction in flight: each rank's chunk for this rank lands in
/// `received` (`mine` bytes apiece, in rank order), to be summed once it is complete.
pub(super) struct Exchange {
    pub(super) call: InFlight,
    pub(super) received: Vec<u8>,
    pub(super) mine: usize,
}

impl Exchange {
    /// Waits for every chunk and sums them in rank order into `out` (`mine` bytes), with
    /// the same code as the blocking calls, so both give the same bits.
    pub(super) fn reduce_into(
        self,
        dtype: DType,
        n: usize,
        out: &mut [u8],
        op: ReduceOp,
    ) -> Result<(), CollectiveError> {
        let Exchange {
            call,
            received,
            mine,
        } = self;
        call.wait()?;
        let base = received.as_ptr();
        let elem = dtype.size_in_bytes();
        // SAFETY: `received` holds n chunks of `mine` bytes; `out` is `mine` bytes of another
        // buffer.
        unsafe {
            reduce_ranks(
                dtype,
                out.as_mut_ptr(),
                mine / elem,
                n,
                |s| base.add(s * mine),
                op,
            );
        }
        Ok(())
    }
}
