//! `SoloWorld`: the world of a single rank, where every collective is a local copy.
//!
//! It lets a strategy run with no engine at all: in single-device code, in tests, and in
//! examples that use wick-strategies alone. Copies are Candle's own, so it works on every
//! device.

use crate::{all_gather_through_tensor, Call, Collective, CollectiveError, Position, Work};
use candle_core::Tensor;

/// A world of one rank.
#[derive(Debug, Clone, Copy, Default)]
pub struct SoloWorld;

/// Copies `from` into `to`, in place, both read as flat buffers of the same length.
fn copy(op: &'static str, from: &Tensor, to: &Tensor) -> Result<(), CollectiveError> {
    if from.elem_count() != to.elem_count() {
        return Err(CollectiveError::Mismatch {
            rank: 0,
            op,
            message: format!(
                "input has {} elements, output {}",
                from.elem_count(),
                to.elem_count()
            ),
        });
    }
    to.flatten_all()
        .and_then(|to| to.slice_set(&from.flatten_all()?, 0, 0))
        .map_err(|e| CollectiveError::Unsupported {
            rank: 0,
            op,
            message: e.to_string(),
        })
}

impl Collective for SoloWorld {
    fn position(&self) -> Position {
        Position::new(0, 1)
    }

    fn start(&self, call: Call<'_>) -> Result<Work, CollectiveError> {
        match call {
            Call::AllGather { shard, full } => copy("all_gather", shard, full)?,
            Call::AllGatherHost { shard, full } => all_gather_through_tensor(self, shard, full)?,
            Call::ReduceScatter { full, shard, .. }
            | Call::ReduceScatterParts { full, shard, .. } => copy("reduce_scatter", full, shard)?,
            Call::Broadcast { root, .. } if root != 0 => {
                return Err(CollectiveError::Mismatch {
                    rank: 0,
                    op: "broadcast",
                    message: format!("root {root} is not a rank of a world of 1"),
                })
            }
            Call::AllReduce { .. } | Call::Broadcast { .. } | Call::Barrier => {}
        }
        Ok(Work::done())
    }

    /// The one rank's color makes a world of one again.
    fn split(&self, _: usize) -> Result<std::sync::Arc<dyn Collective>, CollectiveError> {
        Ok(std::sync::Arc::new(SoloWorld))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::CollectiveExt;
    use crate::ReduceOp;
    use candle_core::{DType, Device};

    #[test]
    fn copies_in_place_and_refuses_other_lengths() {
        let shard = Tensor::new(&[1f32, 2., 3.], &Device::Cpu).unwrap();
        let full = Tensor::zeros(3, DType::F32, &Device::Cpu).unwrap();
        SoloWorld.all_gather_into(&shard, &full).unwrap();
        assert_eq!(full.to_vec1::<f32>().unwrap(), [1., 2., 3.]);
        let mut bytes = vec![0u8; 12];
        SoloWorld.all_gather_host(&shard, &mut bytes).unwrap();
        assert_eq!(bytes[4..8], 2f32.to_ne_bytes());
        let short = Tensor::zeros(2, DType::F32, &Device::Cpu).unwrap();
        let err = SoloWorld
            .reduce_scatter_into(&full, &short, ReduceOp::Sum)
            .unwrap_err();
        assert!(err.to_string().contains("3 elements"), "{err}");
    }
}
