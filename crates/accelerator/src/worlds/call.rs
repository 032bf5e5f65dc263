//! What names a collective call on every world, and the one check that all ranks made the
//! same call: each rank describes its call in a [`CallHeader`], the world shows every rank
//! all the headers (shared memory, or one small all-gather under MPI), and every rank runs
//! the same checks on the same headers, so either all go on or all return the same
//! `Mismatch`.

use candle_core::DType;
use wick_core::CollectiveError;

/// A collective, as every world names it in errors and agreement checks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(usize)]
pub(crate) enum Op {
    AllGather = 1,
    ReduceScatter,
    AllReduce,
    Broadcast,
    Barrier,
    /// Only `MpiWorld` names it: `ThreadComm` splits through an all-gather of colors.
    #[cfg_attr(not(feature = "mpi"), allow(dead_code))]
    Split,
}

impl Op {
    pub(crate) fn name(self) -> &'static str {
        match self {
            Op::AllGather => "all_gather",
            Op::ReduceScatter => "reduce_scatter",
            Op::AllReduce => "all_reduce",
            Op::Broadcast => "broadcast",
            Op::Barrier => "barrier",
            Op::Split => "split",
        }
    }
}

/// The element types worlds move, as codes ranks exchange.
const DTYPES: [DType; 3] = [DType::F32, DType::BF16, DType::F16];

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
    /// The header of `op` over `src_len` and `dst_len` elements of `dtype`.
    pub(crate) fn new(op: Op, dtype: DType, arg: usize, src_len: usize, dst_len: usize) -> Self {
        CallHeader {
            op: op as usize,
            dtype: dtype_code(dtype),
            arg,
            src_len,
            dst_len,
        }
    }

    /// Words, in a fixed order, for a world that sends headers as integers.
    #[cfg_attr(not(feature = "mpi"), allow(dead_code))]
    pub(crate) fn to_words(self) -> [u64; 5] {
        [self.op, self.dtype, self.arg, self.src_len, self.dst_len].map(|w| w as u64)
    }

    /// The header [`CallHeader::to_words`] made.
    #[cfg_attr(not(feature = "mpi"), allow(dead_code))]
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
    pub(crate) op: Op,
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
            if h.op != self.op as usize {
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
