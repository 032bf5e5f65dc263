//! `Positions`: where each token of a packed batch stands in its own document, so that
//! attention stops at a document's boundary and rotary and learned positions restart at it.

use candle_core::{DType, Result, Tensor};
use std::sync::Arc;

/// The position of each token of a `[batch, time]` batch within its document: positions
/// count up from 0 through a document, and a 0 starts the next one (the `position_ids`
/// of a packed batch, as `transformers`' flattening collator makes them and flash
/// attention's variable-length kernels read them). A row of one document is `0..time`.
///
/// Attention given these never crosses a boundary: position i of a row attends to the
/// positions of its own document up to i, `i - positions[i] ..= i`.
#[derive(Clone, Debug)]
pub struct Positions {
    batch: usize,
    time: usize,
    /// Row-major, `batch * time`.
    of: Arc<[u32]>,
    /// The same as a `[batch, time]` u32 tensor on the model's device.
    tensor: Tensor,
}

impl Positions {
    /// The positions of `positions` (`[batch, time]`, u32), checked: each row starts at 0
    /// and each next position is 0 (a new document) or one more than the last.
    pub fn new(positions: &Tensor) -> Result<Self> {
        let (batch, time) = positions.dims2()?;
        if positions.dtype() != DType::U32 {
            candle_core::bail!("positions must be u32, got {:?}", positions.dtype())
        }
        let of: Vec<u32> = positions.flatten_all()?.to_vec1()?;
        for (b, row) in of.chunks(time.max(1)).enumerate() {
            let mut last: Option<u32> = None;
            for (i, &p) in row.iter().enumerate() {
                if p != 0 && last.map(|l| l + 1) != Some(p) {
                    candle_core::bail!(
                        "positions: row {b} has {p} at {i} after {last:?}; each document's \
                         positions count up from 0"
                    )
                }
                last = Some(p);
            }
        }
        Ok(Positions {
            batch,
            time,
            of: of.into(),
            tensor: positions.clone(),
        })
    }

    /// `[batch, time]`, u32.
    pub fn tensor(&self) -> &Tensor {
        &self.tensor
    }

    /// (batch, time).
    pub fn dims(&self) -> (usize, usize) {
        (self.batch, self.time)
    }

    /// Row `b`'s positions.
    pub(crate) fn row(&self, b: usize) -> &[u32] {
        &self.of[b * self.time..(b + 1) * self.time]
    }

    /// Checks that these are the positions of a batch of `batch` rows of `time` tokens.
    pub(crate) fn check(&self, op: &str, batch: usize, time: usize) -> Result<()> {
        if (self.batch, self.time) != (batch, time) {
            candle_core::bail!(
                "{op}: positions of [{}, {}] for a batch of [{batch}, {time}]",
                self.batch,
                self.time
            )
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::Device;

    #[test]
    fn positions_must_count_up_from_zero_in_each_document() {
        let ok = Tensor::new(&[[0u32, 1, 2, 0, 1, 0]], &Device::Cpu).unwrap();
        let p = Positions::new(&ok).unwrap();
        assert_eq!(p.row(0), [0, 1, 2, 0, 1, 0]);
        for bad in [[[1u32, 2, 3]], [[0, 1, 3]], [[0, 2, 3]]] {
            let e = Positions::new(&Tensor::new(&bad, &Device::Cpu).unwrap()).unwrap_err();
            assert!(e.to_string().contains("count up from 0"), "{e}");
        }
    }
}
