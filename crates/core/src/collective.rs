//! The `Collective` trait: what a world of ranks can do together.
//!
//! Calls take and fill flat, contiguous Candle tensors so each world moves data where it
//! lives (host memory for threads and MPI, device memory for NCCL). Outputs are written in
//! place into tensors the caller allocated once, so a training step allocates nothing for
//! its collectives after warm-up. Every rank must issue the same calls in the same order.

use crate::CollectiveError;
use candle_core::{DType, Tensor};

/// Writes `values`' bytes into `out`, element by element.
fn write_ne<T, const N: usize>(
    out: &mut [u8],
    values: candle_core::Result<Vec<T>>,
    bytes: impl Fn(T) -> [u8; N],
) -> candle_core::Result<()> {
    for (dst, v) in out.chunks_exact_mut(N).zip(values?) {
        dst.copy_from_slice(&bytes(v));
    }
    Ok(())
}

/// Checks a [`Collective::reduce_scatter_parts_start`] call's parts against the world and
/// the tensors; returns this rank's part length.
fn check_parts(
    rank: usize,
    full: &Tensor,
    shard: &Tensor,
    parts: &[usize],
    world_size: usize,
) -> Result<usize, CollectiveError> {
    let mismatch = |message: String| CollectiveError::Mismatch {
        rank,
        op: "reduce_scatter",
        message,
    };
    if parts.len() != world_size {
        return Err(mismatch(format!(
            "{} parts for a world of {world_size} ranks",
            parts.len()
        )));
    }
    let total: usize = parts.iter().sum();
    if total != full.elem_count() || parts[rank] != shard.elem_count() {
        return Err(mismatch(format!(
            "parts {parts:?} (sum {total}) against a full buffer of {} and a shard of {} elements",
            full.elem_count(),
            shard.elem_count()
        )));
    }
    Ok(parts[rank])
}

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
#[must_use = "a collective's output is only valid after wait()"]
pub struct Work {
    pending: Option<Box<dyn FnOnce() -> Result<(), CollectiveError> + Send>>,
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
    pub fn wait(self) -> Result<(), CollectiveError> {
        match self.pending {
            Some(wait) => wait(),
            None => Ok(()),
        }
    }
}

/// A world of ranks that can exchange tensors.
///
/// Tensors are flat (any shape, contiguous, read in row-major order), on the device the
/// world serves. In `all_gather_into` the output holds the ranks' shards concatenated in
/// rank order; in `reduce_scatter_into` the input is split into the ranks' shards.
///
/// Equal chunks are the contract every world meets: the full buffer is `world_size` times
/// the shard (the strategies' flat layouts pad to that). `NcclWorld` requires it; the host
/// worlds (`ThreadWorld`, `MpiWorld`) also accept shards whose lengths differ between
/// ranks. wick's own calls pass equal chunks, but for
/// [`Collective::reduce_scatter_parts_start`], which pads them where a world needs it, so
/// they run on every world.
pub trait Collective: Send + Sync {
    /// This rank's index, `0..world_size()`.
    fn rank(&self) -> usize;

    /// The number of ranks.
    fn world_size(&self) -> usize;

    /// Writes every rank's `shard`, in rank order, into `full`.
    fn all_gather_into(&self, shard: &Tensor, full: &Tensor) -> Result<(), CollectiveError>;

    /// Reduces `full` over the ranks and writes this rank's part of the result into `shard`.
    /// Rank r's part starts at the sum of the shard lengths of ranks before it.
    fn reduce_scatter_into(
        &self,
        full: &Tensor,
        shard: &Tensor,
        op: ReduceOp,
    ) -> Result<(), CollectiveError>;

    /// Reduces `tensor` over the ranks, in place; every rank ends with the same values.
    fn all_reduce_in_place(&self, tensor: &Tensor, op: ReduceOp) -> Result<(), CollectiveError>;

    /// Overwrites `tensor` on every rank with its value on `root`.
    fn broadcast_in_place(&self, tensor: &Tensor, root: usize) -> Result<(), CollectiveError>;

    /// Returns once every rank has called it.
    fn barrier(&self) -> Result<(), CollectiveError>;

    /// Issues an all-gather to be waited on later (for prefetch). The default completes it
    /// at once; worlds with a progress engine override it.
    fn all_gather_start(&self, shard: &Tensor, full: &Tensor) -> Result<Work, CollectiveError> {
        self.all_gather_into(shard, full)?;
        Ok(Work::done())
    }

    /// Issues a reduce-scatter to be waited on later (a gradient's reduction overlapped
    /// with the rest of backward): `shard` holds the result once [`Work::wait`] returns,
    /// and `full` must not change before then. The default completes it at once; worlds
    /// with a progress engine override it.
    fn reduce_scatter_start(
        &self,
        full: &Tensor,
        shard: &Tensor,
        op: ReduceOp,
    ) -> Result<Work, CollectiveError> {
        self.reduce_scatter_into(full, shard, op)?;
        Ok(Work::done())
    }

    /// Issues a reduce-scatter whose parts may differ in length between ranks, to be waited
    /// on later: rank r's part is `parts[r]` elements, `full` holds the parts in rank order,
    /// and `shard` receives this rank's (`parts[rank]` elements, possibly none). ZeRO-2
    /// reduces its gradient buckets with it, each cut where the ranks' ranges of the flat
    /// layout fall.
    ///
    /// The default pads every part to the longest and issues an equal
    /// [`Collective::reduce_scatter_start`], which every world takes (NCCL needs equal
    /// chunks); the padding costs bytes on the wire, not the slowest rank's time, since the
    /// owner of the longest part receives as much either way. Worlds that take uneven parts
    /// as they are (the host worlds) override it to move no padding.
    fn reduce_scatter_parts_start(
        &self,
        full: &Tensor,
        shard: &Tensor,
        parts: &[usize],
        op: ReduceOp,
    ) -> Result<Work, CollectiveError> {
        let rank = self.rank();
        let len = check_parts(rank, full, shard, parts, self.world_size())?;
        let longest = parts.iter().copied().max().unwrap_or(0);
        if parts.iter().all(|&p| p == longest) {
            return self.reduce_scatter_start(full, shard, op);
        }
        let fail = move |e: candle_core::Error| CollectiveError::Unsupported {
            rank,
            op: "reduce_scatter",
            message: e.to_string(),
        };
        let pad = || -> candle_core::Result<(Tensor, Tensor)> {
            let full = full.flatten_all()?;
            let padded = Tensor::zeros(longest * parts.len(), full.dtype(), full.device())?;
            let mut at = 0;
            for (r, &part) in parts.iter().enumerate().filter(|(_, &part)| part > 0) {
                padded.slice_set(&full.narrow(0, at, part)?, 0, r * longest)?;
                at += part;
            }
            Ok((padded, Tensor::zeros(longest, full.dtype(), full.device())?))
        };
        let (padded, mine) = pad().map_err(fail)?;
        let work = self.reduce_scatter_start(&padded, &mine, op)?;
        let shard = shard.clone();
        Ok(Work::pending(move || {
            work.wait()?;
            drop(padded);
            match len {
                0 => Ok(()),
                _ => shard
                    .flatten_all()
                    .and_then(|s| s.slice_set(&mine.narrow(0, 0, len)?, 0, 0))
                    .map_err(fail),
            }
        }))
    }

    /// Issues an in-place all-reduce to be waited on later (a bucket of gradients reduced
    /// while backward goes on): `tensor` holds the result once [`Work::wait`] returns and
    /// must not be read or written before then. The default completes it at once.
    fn all_reduce_start(&self, tensor: &Tensor, op: ReduceOp) -> Result<Work, CollectiveError> {
        self.all_reduce_in_place(tensor, op)?;
        Ok(Work::done())
    }

    /// [`Collective::all_gather_into`] with the output in host memory: the bytes of
    /// `full`, of `shard`'s dtype, for code that must produce an owned host buffer (an
    /// autograd op's CPU forward). The default gathers into a tensor and copies it out;
    /// worlds that work on host memory override it to copy once.
    fn all_gather_host(&self, shard: &Tensor, full: &mut [u8]) -> Result<(), CollectiveError> {
        let fail = |e: candle_core::Error| CollectiveError::Unsupported {
            rank: self.rank(),
            op: "all_gather",
            message: e.to_string(),
        };
        let dtype = shard.dtype();
        let out = Tensor::zeros(full.len() / dtype.size_in_bytes(), dtype, shard.device())
            .map_err(fail)?;
        self.all_gather_into(shard, &out)?;
        let out = out.to_device(&candle_core::Device::Cpu).map_err(fail)?;
        match dtype {
            DType::BF16 => write_ne(full, out.to_vec1::<half::bf16>(), half::bf16::to_ne_bytes),
            DType::F16 => write_ne(full, out.to_vec1::<half::f16>(), half::f16::to_ne_bytes),
            _ => write_ne(full, out.to_vec1::<f32>(), f32::to_ne_bytes),
        }
        .map_err(fail)
    }

    /// Splits the world: the ranks that pass the same `color` form a new world, ranked in
    /// their order here. A collective: every rank calls it at the same point.
    fn split(&self, color: usize) -> Result<std::sync::Arc<dyn Collective>, CollectiveError> {
        let _ = color;
        Err(CollectiveError::Unsupported {
            rank: self.rank(),
            op: "split",
            message: "this world cannot be split".into(),
        })
    }

    /// Reduces a scalar over the ranks (for metrics such as the logged loss).
    fn all_reduce_scalar(&self, value: f32, op: ReduceOp) -> Result<f32, CollectiveError> {
        let unsupported = |e: candle_core::Error| CollectiveError::Unsupported {
            rank: self.rank(),
            op: "all_reduce_scalar",
            message: e.to_string(),
        };
        let t = Tensor::new(&[value], &candle_core::Device::Cpu).map_err(unsupported)?;
        self.all_reduce_in_place(&t, op)?;
        let v = t.to_vec1::<f32>().map_err(unsupported)?;
        Ok(v[0])
    }
}

impl<C: Collective + ?Sized> Collective for std::sync::Arc<C> {
    fn rank(&self) -> usize {
        (**self).rank()
    }
    fn world_size(&self) -> usize {
        (**self).world_size()
    }
    fn all_gather_into(&self, shard: &Tensor, full: &Tensor) -> Result<(), CollectiveError> {
        (**self).all_gather_into(shard, full)
    }
    fn reduce_scatter_into(
        &self,
        full: &Tensor,
        shard: &Tensor,
        op: ReduceOp,
    ) -> Result<(), CollectiveError> {
        (**self).reduce_scatter_into(full, shard, op)
    }
    fn all_reduce_in_place(&self, tensor: &Tensor, op: ReduceOp) -> Result<(), CollectiveError> {
        (**self).all_reduce_in_place(tensor, op)
    }
    fn broadcast_in_place(&self, tensor: &Tensor, root: usize) -> Result<(), CollectiveError> {
        (**self).broadcast_in_place(tensor, root)
    }
    fn barrier(&self) -> Result<(), CollectiveError> {
        (**self).barrier()
    }
    fn all_gather_start(&self, shard: &Tensor, full: &Tensor) -> Result<Work, CollectiveError> {
        (**self).all_gather_start(shard, full)
    }
    fn all_gather_host(&self, shard: &Tensor, full: &mut [u8]) -> Result<(), CollectiveError> {
        (**self).all_gather_host(shard, full)
    }
    fn reduce_scatter_start(
        &self,
        full: &Tensor,
        shard: &Tensor,
        op: ReduceOp,
    ) -> Result<Work, CollectiveError> {
        (**self).reduce_scatter_start(full, shard, op)
    }
    fn reduce_scatter_parts_start(
        &self,
        full: &Tensor,
        shard: &Tensor,
        parts: &[usize],
        op: ReduceOp,
    ) -> Result<Work, CollectiveError> {
        (**self).reduce_scatter_parts_start(full, shard, parts, op)
    }
    fn all_reduce_start(&self, tensor: &Tensor, op: ReduceOp) -> Result<Work, CollectiveError> {
        (**self).all_reduce_start(tensor, op)
    }
    fn split(&self, color: usize) -> Result<std::sync::Arc<dyn Collective>, CollectiveError> {
        (**self).split(color)
    }
    fn all_reduce_scalar(&self, value: f32, op: ReduceOp) -> Result<f32, CollectiveError> {
        (**self).all_reduce_scalar(value, op)
    }
}
