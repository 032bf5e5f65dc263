//! The skeleton the host worlds (`ThreadComm`, `MpiWorld`) share: a [`Call`]'s tensors
//! lent as host bytes to the engine's byte-level calls, the check that needs no peer (a
//! broadcast's root), and host-access errors named by rank and collective. An engine
//! brings only its transport.

use crate::worlds::host::{
    check_reducible, with_bytes, with_bytes_mut, with_bytes_mut_from, HostAccessError,
};
use candle_core::DType;
use wick_core::{Call, CollectiveError, ReduceOp};

/// A host call that completed on this rank, or why it did not.
pub(crate) type Done = Result<(), CollectiveError>;

/// A host world's calls on bytes of `dtype`, every rank making the same call at the same
/// point. Lengths are in bytes; the engine checks them against its peers'.
pub(crate) trait HostEngine {
    /// This rank.
    fn rank(&self) -> usize;
    /// The number of ranks.
    fn size(&self) -> usize;
    /// Every rank's `src`, in rank order, into `dst`.
    fn gather_bytes(&self, dtype: DType, src: &[u8], dst: &mut [u8]) -> Done;
    /// `src` reduced over the ranks, this rank's part into `dst`.
    fn reduce_scatter_bytes(&self, dtype: DType, src: &[u8], dst: &mut [u8], op: ReduceOp) -> Done;
    /// `buf` reduced over the ranks, in place.
    fn all_reduce_bytes(&self, dtype: DType, buf: &mut [u8], op: ReduceOp) -> Done;
    /// `buf` overwritten with the root's (`root` is a rank of this world).
    fn broadcast_bytes(&self, dtype: DType, buf: &mut [u8], root: usize) -> Done;
    /// Returns once every rank made it.
    fn barrier(&self) -> Done;
}

/// Runs `call` on `engine` and waits for it, its tensors lent as host bytes.
pub(crate) fn run_on_host(engine: &impl HostEngine, call: Call<'_>) -> Result<(), CollectiveError> {
    let (rank, name) = (engine.rank(), call.name());
    let lent = |e: HostAccessError| CollectiveError::Unsupported {
        rank,
        op: name,
        message: e.0,
    };
    match call {
        Call::AllGather { shard, full } => with_bytes_mut_from(full, shard, |dst, src| {
            engine.gather_bytes(shard.dtype(), src, dst)
        }),
        Call::AllGatherHost { shard, full } => {
            with_bytes(shard, |src| engine.gather_bytes(shard.dtype(), src, full))
        }
        Call::ReduceScatter { full, shard, op }
        | Call::ReduceScatterParts {
            full, shard, op, ..
        } => check_reducible(full.dtype()).and_then(|()| {
            with_bytes_mut_from(shard, full, |dst, src| {
                engine.reduce_scatter_bytes(full.dtype(), src, dst, op)
            })
        }),
        Call::AllReduce { tensor, op } => check_reducible(tensor.dtype()).and_then(|()| {
            with_bytes_mut(tensor, |buf| {
                engine.all_reduce_bytes(tensor.dtype(), buf, op)
            })
        }),
        Call::Broadcast { tensor, root } => {
            if root >= engine.size() {
                return Err(CollectiveError::Mismatch {
                    rank,
                    op: name,
                    message: format!("root {root} is not a rank of a world of {}", engine.size()),
                });
            }
            with_bytes_mut(tensor, |buf| {
                engine.broadcast_bytes(tensor.dtype(), buf, root)
            })
        }
        Call::Barrier => return engine.barrier(),
    }
    .map_err(lent)?
}
