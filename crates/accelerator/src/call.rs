//! What names a collective call on every world: its kind and its element type, as codes
//! that ranks compare to check they agree.

use candle_core::DType;

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

pub(crate) fn dtype_code(dtype: DType) -> usize {
    DTYPES
        .iter()
        .position(|&d| d == dtype)
        .unwrap_or(usize::MAX)
}
