//! What names a collective call on every world, and the one check that all ranks made the
//! same call: each rank describes its call in a [`CallHeader`], the world shows every rank
//! all the headers (shared memory, or one small all-gather under MPI), and every rank runs
//! the same checks on the same headers, so either all go on or all return the same
//! `Mismatch`.

use candle_core::DType;
use wick_core::{CallKind, Collective, CollectiveError, CollectiveExt};

/// The element types worlds move, as codes ranks exchange.
const DTYPES: [DType; 4] = [DType::F32, DType::BF16, DType::F16, DType::U8];

fn dtype_code(dtype: DType) -> usize {
    DTYPES
        .iter()
        .position(|&d| d == dtype)
        .unwrap_or(usize::MAX)
}

/// One rank's description of the call it is making: which collective, the element type,
/// the call's argument (reduce op, broadcast root) and its two buffers' lengths in
/// elements (what it sends, what it receives; 0 where a call has one buffer).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) struct CallHeader {
    pub(crate) op: usize,
    pub(crate) dtype: usize,
    pub(crate) arg: usize,
    pub(crate) src_len: usize,
    pub(crate) dst_len: usize,
}

impl CallHeader {
    /// The header of a call of `kind` over `src_len` and `dst_len` elements of `dtype`.
    pub(crate) fn new(kind: CallKind, dtype: DType, src_len: usize, dst_len: usize) -> Self {
        CallHeader {
            op: kind.code(),
            dtype: dtype_code(dtype),
            arg: kind.arg(),
            src_len,
            dst_len,
        }
    }

    /// Words, in a fixed order, for a world that sends headers as integers.
    #[cfg_attr(not(any(feature = "mpi", feature = "nccl", test)), allow(dead_code))]
    pub(crate) fn to_words(self) -> [u64; 5] {
        [self.op, self.dtype, self.arg, self.src_len, self.dst_len].map(|w| w as u64)
    }

    /// The header [`CallHeader::to_words`] made.
    #[cfg_attr(not(any(feature = "mpi", feature = "nccl", test)), allow(dead_code))]
    pub(crate) fn from_words(w: &[u64]) -> Self {
        CallHeader {
            op: w[0] as usize,
            dtype: w[1] as usize,
            arg: w[2] as usize,
            src_len: w[3] as usize,
            dst_len: w[4] as usize,
        }
    }
}

/// Every rank's header of the call in progress, as rank `rank` sees them; the checks all
/// ranks run on them.
pub(crate) struct Headers<F: Fn(usize) -> CallHeader> {
    pub(crate) rank: usize,
    pub(crate) size: usize,
    pub(crate) op: CallKind,
    /// Rank s's header.
    pub(crate) of: F,
}

impl<F: Fn(usize) -> CallHeader> Headers<F> {
    pub(crate) fn mismatch(&self, message: String) -> CollectiveError {
        CollectiveError::Mismatch {
            rank: self.rank,
            op: self.op.name(),
            message,
        }
    }

    /// Every rank called this collective, with rank 0's argument and dtype.
    pub(crate) fn agree(&self) -> Result<(), CollectiveError> {
        let first = (self.of)(0);
        for s in 0..self.size {
            let h = (self.of)(s);
            if h.op != self.op.code() {
                return Err(self.mismatch(format!(
                    "rank {s} called a different collective at the same point"
                )));
            }
            if h.arg != first.arg {
                return Err(self.mismatch(format!(
                    "rank {s} passed {} where rank 0 passed {}",
                    h.arg, first.arg
                )));
            }
            if h.dtype != first.dtype {
                return Err(self.mismatch(format!("rank {s} passed another dtype than rank 0")));
            }
        }
        Ok(())
    }

    /// The length `len` reads from a header, when every rank passed the same.
    pub(crate) fn same_length(
        &self,
        len: impl Fn(CallHeader) -> usize,
    ) -> Result<usize, CollectiveError> {
        let first = len((self.of)(0));
        if (0..self.size).any(|s| len((self.of)(s)) != first) {
            return Err(self.mismatch("ranks passed buffers of different lengths".into()));
        }
        Ok(first)
    }

    /// The ranks' shards (`shard` of each header) add up to the full buffer's `total`.
    pub(crate) fn shards_add_up(
        &self,
        shard: impl Fn(CallHeader) -> usize,
        total: usize,
    ) -> Result<(), CollectiveError> {
        let sum: usize = (0..self.size).map(|s| shard((self.of)(s))).sum();
        if sum != total {
            return Err(self.mismatch(format!(
                "the ranks' shards add up to {sum} elements but the full buffer holds {total}"
            )));
        }
        Ok(())
    }
}

/// Every rank's header, in rank order, gathered over `world` (a host world): what a world
/// whose own transport cannot carry headers (NCCL, on device memory) checks its calls with.
/// Each word travels as two f32 whose bits are its halves, since host worlds copy bytes.
#[cfg_attr(not(any(feature = "nccl", test)), allow(dead_code))]
pub(crate) fn gather_headers(
    world: &dyn Collective,
    mine: CallHeader,
) -> Result<Vec<CallHeader>, CollectiveError> {
    let halves: Vec<f32> = mine
        .to_words()
        .iter()
        .flat_map(|&w| [f32::from_bits(w as u32), f32::from_bits((w >> 32) as u32)])
        .collect();
    let shard =
        candle_core::Tensor::new(halves.as_slice(), &candle_core::Device::Cpu).map_err(|e| {
            CollectiveError::Unsupported {
                rank: world.rank(),
                op: "header exchange",
                message: e.to_string(),
            }
        })?;
    let mut all = vec![0u8; halves.len() * 4 * world.world_size()];
    world.all_gather_host(&shard, &mut all)?;
    let words: Vec<u64> = all
        .chunks_exact(8)
        .map(|c| {
            let half = |h: &[u8]| u64::from(u32::from_ne_bytes([h[0], h[1], h[2], h[3]]));
            half(&c[..4]) | half(&c[4..]) << 32
        })
        .collect();
    Ok(words.chunks_exact(5).map(CallHeader::from_words).collect())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ThreadWorld;
    use wick_core::ReduceOp;

    #[test]
    fn headers_gathered_over_a_host_world_catch_a_rank_that_made_another_call() {
        let outcomes = ThreadWorld::new(3).run(|c| {
            // Rank 2 broadcasts from root 1 where the others all-reduce; lengths past 2^32
            // check that both halves of a word travel.
            let op = match c.rank() {
                2 => CallKind::Broadcast(1),
                _ => CallKind::AllReduce(ReduceOp::Sum),
            };
            let mine = CallHeader::new(op, DType::BF16, (1 << 33) + c.rank(), 7);
            let headers = gather_headers(&c, mine)?;
            assert_eq!(headers[2].src_len, (1 << 33) + 2);
            assert_eq!(headers[1].dtype, dtype_code(DType::BF16));
            let checks = Headers {
                rank: c.rank(),
                size: 3,
                op,
                of: |s| headers[s],
            };
            checks.agree()
        });
        for (rank, outcome) in outcomes.into_iter().enumerate() {
            let e = outcome.unwrap_err().to_string();
            assert!(
                e.contains("called a different collective"),
                "rank {rank}: {e}"
            );
        }
    }
}
