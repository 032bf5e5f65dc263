//! [`Call`]: one collective call, as a world receives it through [`Collective::start`],
//! and [`CallKind`], which collective it is; and the two ways to run a call in terms of others, for worlds that cannot run it as it is.

use crate::CollectiveExt;
use crate::{Collective, CollectiveError, ReduceOp, Work};
use candle_core::{DType, Tensor};

/// One collective call: which collective, the tensors it reads and the tensors it fills.
///
/// Tensors are flat (any shape, contiguous, read in row-major order) and on the device the
/// world serves. Outputs are written in place, into tensors the caller allocated.
pub enum Call<'a> {
    /// Every rank's `shard`, in rank order, into `full`.
    AllGather {
        /// This rank's part.
        shard: &'a Tensor,
        /// Filled with every rank's part.
        full: &'a Tensor,
    },
    /// [`Call::AllGather`] with the output in host memory: the bytes of `full`, of
    /// `shard`'s dtype, for code that must fill an owned host buffer (an autograd op's CPU
    /// forward). It borrows `full`, so it has completed when `start` returns.
    AllGatherHost {
        /// This rank's part.
        shard: &'a Tensor,
        /// Filled with every rank's part, as bytes.
        full: &'a mut [u8],
    },
    /// `full` reduced over the ranks; this rank's part of the result into `shard`. Rank r's
    /// part starts at the sum of the shard lengths of the ranks before it.
    ReduceScatter {
        /// This rank's contribution to every part.
        full: &'a Tensor,
        /// Filled with this rank's part of the reduction.
        shard: &'a Tensor,
        /// How the ranks' values combine.
        op: ReduceOp,
    },
    /// [`Call::ReduceScatter`] whose parts may differ in length between ranks. ZeRO-2
    /// reduces its gradient buckets with it, each cut where the ranks' ranges of the flat
    /// layout fall.
    ReduceScatterParts {
        /// This rank's contribution to every part, the parts in rank order.
        full: &'a Tensor,
        /// Filled with this rank's part (`parts[rank]` elements, possibly none).
        shard: &'a Tensor,
        /// Every rank's part length.
        parts: &'a [usize],
        /// How the ranks' values combine.
        op: ReduceOp,
    },
    /// `tensor` reduced over the ranks, in place: every rank ends with the same values.
    AllReduce {
        /// Read, then overwritten with the reduction.
        tensor: &'a Tensor,
        /// How the ranks' values combine.
        op: ReduceOp,
    },
    /// `tensor` overwritten on every rank with its value on `root`.
    Broadcast {
        /// Read on `root`, overwritten elsewhere.
        tensor: &'a Tensor,
        /// The rank whose value every rank ends with.
        root: usize,
    },
    /// Completes once every rank has made it.
    Barrier,
}

impl Call<'_> {
    /// Which collective this is, with its argument.
    pub fn kind(&self) -> CallKind {
        match *self {
            Call::AllGather { .. } | Call::AllGatherHost { .. } => CallKind::AllGather,
            Call::ReduceScatter { op, .. } | Call::ReduceScatterParts { op, .. } => {
                CallKind::ReduceScatter(op)
            }
            Call::AllReduce { op, .. } => CallKind::AllReduce(op),
            Call::Broadcast { root, .. } => CallKind::Broadcast(root),
            Call::Barrier => CallKind::Barrier,
        }
    }

    /// The collective's name, as errors give it.
    pub fn name(&self) -> &'static str {
        self.kind().name()
    }
}

/// Which collective a call is, with its argument (the reduction, the broadcast's root):
/// the one name every world gives a call, in its errors, in the headers its ranks compare
/// to check that they made the same call, and in an engine's dispatch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CallKind {
    /// [`Call::AllGather`] and [`Call::AllGatherHost`].
    AllGather,
    /// [`Call::ReduceScatter`] and [`Call::ReduceScatterParts`].
    ReduceScatter(ReduceOp),
    /// [`Call::AllReduce`].
    AllReduce(ReduceOp),
    /// [`Call::Broadcast`] from this root.
    Broadcast(usize),
    /// [`Call::Barrier`].
    Barrier,
    /// [`Collective::split`], where a world agrees on it as on a call.
    Split,
}

impl CallKind {
    /// The collective's name, as errors give it (`all_gather`, `reduce_scatter`, ...).
    pub fn name(self) -> &'static str {
        match self {
            CallKind::AllGather => "all_gather",
            CallKind::ReduceScatter(_) => "reduce_scatter",
            CallKind::AllReduce(_) => "all_reduce",
            CallKind::Broadcast(_) => "broadcast",
            CallKind::Barrier => "barrier",
            CallKind::Split => "split",
        }
    }

    /// The collective as a number from 1, whatever its argument: what a call header
    /// carries, so that ranks compare it as an integer.
    pub fn code(self) -> usize {
        match self {
            CallKind::AllGather => 1,
            CallKind::ReduceScatter(_) => 2,
            CallKind::AllReduce(_) => 3,
            CallKind::Broadcast(_) => 4,
            CallKind::Barrier => 5,
            CallKind::Split => 6,
        }
    }

    /// The argument as a number for a call header: the reduction (`Sum` 0, `Mean` 1), the
    /// broadcast's root, 0 for the others.
    pub fn arg(self) -> usize {
        match self {
            CallKind::ReduceScatter(op) | CallKind::AllReduce(op) => match op {
                ReduceOp::Sum => 0,
                ReduceOp::Mean => 1,
            },
            CallKind::Broadcast(root) => root,
            CallKind::AllGather | CallKind::Barrier | CallKind::Split => 0,
        }
    }
}

/// Runs [`Call::ReduceScatterParts`] on a world that moves equal chunks only (NCCL): every
/// part padded to the longest, then one equal [`Call::ReduceScatter`]. The padding costs
/// bytes on the wire, not the slowest rank's time, since the owner of the longest part
/// receives as much either way. The host worlds take uneven parts as they are.
pub fn reduce_scatter_padded<C: Collective + ?Sized>(
    world: &C,
    full: &Tensor,
    shard: &Tensor,
    parts: &[usize],
    op: ReduceOp,
) -> Result<Work, CollectiveError> {
    let rank = world.rank();
    let len = check_parts(rank, full, shard, parts, world.world_size())?;
    let longest = parts.iter().copied().max().unwrap_or(0);
    if parts.iter().all(|&p| p == longest) {
        return world.start(Call::ReduceScatter { full, shard, op });
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
    let work = world.start(Call::ReduceScatter {
        full: &padded,
        shard: &mine,
        op,
    })?;
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

/// Runs [`Call::AllGatherHost`] on a world whose tensors are not host memory: a gather
/// into a tensor on `shard`'s device, then one copy out.
pub fn all_gather_through_tensor<C: Collective + ?Sized>(
    world: &C,
    shard: &Tensor,
    full: &mut [u8],
) -> Result<(), CollectiveError> {
    let fail = |e: candle_core::Error| CollectiveError::Unsupported {
        rank: world.rank(),
        op: "all_gather",
        message: e.to_string(),
    };
    let dtype = shard.dtype();
    let out =
        Tensor::zeros(full.len() / dtype.size_in_bytes(), dtype, shard.device()).map_err(fail)?;
    world.all_gather_into(shard, &out)?;
    let out = out.to_device(&candle_core::Device::Cpu).map_err(fail)?;
    match dtype {
        DType::BF16 => write_ne(full, out.to_vec1::<half::bf16>(), half::bf16::to_ne_bytes),
        DType::F16 => write_ne(full, out.to_vec1::<half::f16>(), half::f16::to_ne_bytes),
        DType::U8 => write_ne(full, out.to_vec1::<u8>(), |b: u8| [b]),
        _ => write_ne(full, out.to_vec1::<f32>(), f32::to_ne_bytes),
    }
    .map_err(fail)
}

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

/// Checks a [`Call::ReduceScatterParts`]' parts against the world and the tensors;
/// returns this rank's part length.
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
