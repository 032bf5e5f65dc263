//! The `Collective` trait: what a world of ranks can do together.
//!
//! A world implements one call, [`Collective::start`], over the [`Call`] enum, and may
//! give [`Collective::run`], the same call waited for where it is made, a faster path
//! (a blocking MPI collective). The named forms (`all_gather_into`, `reduce_scatter_start`
//! and the rest) and the scalar reduction are [`CollectiveExt`]'s, on top of those two, for
//! every world and overridable by none. So a world that
//! wraps another (a clock, a recorder, one that completes calls at once) forwards
//! `position`, `start` and `run` and nothing else, and a collective added to `Call` cannot slip past it.
//!
//! Calls take and fill flat, contiguous Candle tensors so each world moves data where it
//! lives (host memory for threads and MPI, device memory for NCCL). Outputs are written in
//! place into tensors the caller allocated once, so a training step allocates nothing for
//! its collectives after warm-up. Every rank must issue the same calls in the same order.

use crate::{Call, CollectiveError};
use candle_core::Tensor;
use std::sync::Arc;

/// How values from the ranks are combined.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReduceOp {
    /// Sum over ranks.
    Sum,
    /// Sum over ranks divided by the world size.
    Mean,
}

/// A collective call that was issued and may still be in flight.
///
/// Worlds that complete calls at once return [`Work::done`]; asynchronous worlds return a
/// handle whose [`Work::wait`] blocks until the output tensor is filled.
///
/// Dropping a `Work` without waiting completes the call first (its outcome is dropped):
/// a started call's buffers are in use by the engine (MPI's progress, a CUDA stream) until
/// then, and an early return (an error in backward while reductions are in flight) must
/// not free them under it. The world's own completion runs, so it blocks as `wait` would.
#[must_use = "a collective's output is only valid after wait()"]
pub struct Work {
    pending: Option<Box<dyn FnOnce() -> Result<(), CollectiveError> + Send>>,
}

impl Drop for Work {
    fn drop(&mut self) {
        if let Some(complete) = self.pending.take() {
            // Whoever dropped it did not ask for the outcome; an error here is that of a
            // call the caller already abandoned, usually after a failure of its own.
            if let Err(e) = complete() {
                log::debug!("a dropped collective call completed with an error: {e}");
            }
        }
    }
}

impl Work {
    /// A call that already completed.
    pub fn done() -> Self {
        Work { pending: None }
    }

    /// A call that completes when `wait` runs.
    pub fn pending(wait: impl FnOnce() -> Result<(), CollectiveError> + Send + 'static) -> Self {
        Work {
            pending: Some(Box::new(wait)),
        }
    }

    /// Blocks until the call completed, returning its outcome.
    pub fn wait(mut self) -> Result<(), CollectiveError> {
        match self.pending.take() {
            Some(wait) => wait(),
            None => Ok(()),
        }
    }
}

/// Where a rank stands in its world: its index, `0..world_size`, and the number of ranks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Position {
    /// This rank's index.
    pub rank: usize,
    /// The number of ranks.
    pub world_size: usize,
}

impl Position {
    /// Rank `rank` of `world_size` ranks.
    pub fn new(rank: usize, world_size: usize) -> Self {
        Position { rank, world_size }
    }
}

/// A world of ranks that can exchange tensors.
///
/// Equal chunks are the contract every world meets: an all-gather's or reduce-scatter's
/// full buffer is `world_size` times the shard (the strategies' flat layouts pad to that).
/// `NcclWorld` requires it; the host worlds (`ThreadWorld`, `MpiWorld`) also accept shards
/// whose lengths differ between ranks. wick's own calls pass equal chunks, but for
/// [`Call::ReduceScatterParts`], which a world that needs equal chunks pads
/// ([`crate::reduce_scatter_padded`]), so it runs on every world.
///
/// Implement [`Collective::position`], [`Collective::start`] and,
/// where the world has a faster blocking path or can split, [`Collective::run`] and
/// [`Collective::split`]; the other methods are provided through those and are not meant
/// to be overridden.
pub trait Collective: Send + Sync {
    /// This rank's index and the number of ranks ([`CollectiveExt::rank`] and
    /// [`CollectiveExt::world_size`] read them).
    fn position(&self) -> Position;

    /// Issues `call`, to be waited on later: its outputs hold the result once
    /// [`Work::wait`] returns, and its inputs must not change before then. Worlds with a
    /// progress engine move the data meanwhile (a prefetched all-gather, a gradient's
    /// reduction overlapped with the rest of backward); others complete it here.
    fn start(&self, call: Call<'_>) -> Result<Work, CollectiveError>;

    /// Makes `call` and waits for it. The default is [`Collective::start`], then
    /// [`Work::wait`]; a world overrides it where a blocking call is faster than a started
    /// one (MPI's blocking collectives are better tuned than its nonblocking ones).
    fn run(&self, call: Call<'_>) -> Result<(), CollectiveError> {
        self.start(call)?.wait()
    }

    /// Splits the world: the ranks that pass the same `color` form a new world, ranked in
    /// their order here. A collective: every rank calls it at the same point.
    fn split(&self, color: usize) -> Result<Arc<dyn Collective>, CollectiveError> {
        let _ = color;
        Err(CollectiveError::Unsupported {
            rank: self.rank(),
            op: "split",
            message: "this world cannot be split".into(),
        })
    }
}

impl<C: Collective + ?Sized> Collective for Arc<C> {
    fn position(&self) -> Position {
        (**self).position()
    }
    fn start(&self, call: Call<'_>) -> Result<Work, CollectiveError> {
        (**self).start(call)
    }
    fn run(&self, call: Call<'_>) -> Result<(), CollectiveError> {
        (**self).run(call)
    }
    fn split(&self, color: usize) -> Result<Arc<dyn Collective>, CollectiveError> {
        (**self).split(color)
    }
}

/// The named forms of [`Collective::start`] and [`Collective::run`] (`all_gather_into`,
/// `reduce_scatter_start`, ...) and the scalar all-reduce, for every world. They live in an
/// extension trait implemented for every [`Collective`] and nowhere else, so no world can
/// make a named form behave unlike the [`Call`] it names: a world that wraps another
/// forwards `position`, `start` and `run`, and every call passes through the last two.
pub trait CollectiveExt: Collective {
    /// This rank's index, `0..world_size()`.
    fn rank(&self) -> usize {
        self.position().rank
    }

    /// The number of ranks.
    fn world_size(&self) -> usize {
        self.position().world_size
    }

    /// Writes every rank's `shard`, in rank order, into `full` ([`Call::AllGather`]).
    fn all_gather_into(&self, shard: &Tensor, full: &Tensor) -> Result<(), CollectiveError> {
        self.run(Call::AllGather { shard, full })
    }

    /// [`Call::AllGather`], started (for prefetch).
    fn all_gather_start(&self, shard: &Tensor, full: &Tensor) -> Result<Work, CollectiveError> {
        self.start(Call::AllGather { shard, full })
    }

    /// [`Call::AllGatherHost`]: the gather into host bytes.
    fn all_gather_host(&self, shard: &Tensor, full: &mut [u8]) -> Result<(), CollectiveError> {
        self.run(Call::AllGatherHost { shard, full })
    }

    /// Reduces `full` over the ranks and writes this rank's part of the result into
    /// `shard` ([`Call::ReduceScatter`]).
    fn reduce_scatter_into(
        &self,
        full: &Tensor,
        shard: &Tensor,
        op: ReduceOp,
    ) -> Result<(), CollectiveError> {
        self.run(Call::ReduceScatter { full, shard, op })
    }

    /// [`Call::ReduceScatter`], started (a gradient's reduction overlapped with the rest
    /// of backward).
    fn reduce_scatter_start(
        &self,
        full: &Tensor,
        shard: &Tensor,
        op: ReduceOp,
    ) -> Result<Work, CollectiveError> {
        self.start(Call::ReduceScatter { full, shard, op })
    }

    /// [`Call::ReduceScatterParts`], started: parts that may differ in length between
    /// ranks.
    fn reduce_scatter_parts_start(
        &self,
        full: &Tensor,
        shard: &Tensor,
        parts: &[usize],
        op: ReduceOp,
    ) -> Result<Work, CollectiveError> {
        self.start(Call::ReduceScatterParts {
            full,
            shard,
            parts,
            op,
        })
    }

    /// Reduces `tensor` over the ranks, in place ([`Call::AllReduce`]).
    fn all_reduce_in_place(&self, tensor: &Tensor, op: ReduceOp) -> Result<(), CollectiveError> {
        self.run(Call::AllReduce { tensor, op })
    }

    /// [`Call::AllReduce`], started (a bucket of gradients reduced while backward goes on):
    /// `tensor` must not be read or written before the wait.
    fn all_reduce_start(&self, tensor: &Tensor, op: ReduceOp) -> Result<Work, CollectiveError> {
        self.start(Call::AllReduce { tensor, op })
    }

    /// Overwrites `tensor` on every rank with its value on `root` ([`Call::Broadcast`]).
    fn broadcast_in_place(&self, tensor: &Tensor, root: usize) -> Result<(), CollectiveError> {
        self.run(Call::Broadcast { tensor, root })
    }

    /// Returns once every rank has called it ([`Call::Barrier`]).
    fn barrier(&self) -> Result<(), CollectiveError> {
        self.run(Call::Barrier)
    }

    /// Reduces a scalar over the ranks (for metrics such as the logged loss), through a
    /// host tensor of one element: a device world stages it.
    fn all_reduce_scalar(&self, value: f32, op: ReduceOp) -> Result<f32, CollectiveError> {
        let unsupported = |e: candle_core::Error| CollectiveError::Unsupported {
            rank: self.rank(),
            op: "all_reduce",
            message: e.to_string(),
        };
        let t = Tensor::new(&[value], &candle_core::Device::Cpu).map_err(unsupported)?;
        self.all_reduce_in_place(&t, op)?;
        let v = t.to_vec1::<f32>().map_err(unsupported)?;
        Ok(v[0])
    }
}

impl<C: Collective + ?Sized> CollectiveExt for C {}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};

    #[test]
    fn a_dropped_work_completes_its_call_once() {
        let completed = Arc::new(AtomicUsize::new(0));
        let counter = completed.clone();
        drop(Work::pending(move || {
            counter.fetch_add(1, Ordering::SeqCst);
            Ok(())
        }));
        assert_eq!(completed.load(Ordering::SeqCst), 1);
        let counter = completed.clone();
        Work::pending(move || {
            counter.fetch_add(1, Ordering::SeqCst);
            Ok(())
        })
        .wait()
        .unwrap();
        // Waited on, it does not run again when dropped.
        assert_eq!(completed.load(Ordering::SeqCst), 2);
    }
}
