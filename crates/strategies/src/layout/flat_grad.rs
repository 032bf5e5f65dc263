//! A unit's gradients laid end to end in one zero-padded flat buffer, the shape every
//! gradient collective takes.
//!
//! Candle may hand back a gradient as a strided view (a linear weight's gradient is the
//! transpose of the matmul's). Such a gradient is copied in row blocks, so flattening never
//! holds a second full-size copy of it.

use crate::layout::flat_layout::FlatLayout;
use candle_core::{DType, Device, Result, Tensor};

/// Elements copied at a time out of a strided gradient (256 KiB in f32).
const BLOCK: usize = 1 << 16;

/// The gradients, in `layout`'s order, laid end to end in one flat buffer of `dtype`; a
/// `None` leaves its parameter's range at zero. Each gradient is dropped as soon as it is
/// copied, so the peak is the flat buffer plus what is left to copy.
pub(crate) fn flatten_consuming(
    grads: impl IntoIterator<Item = Option<Tensor>>,
    layout: &FlatLayout,
    dtype: DType,
    device: &Device,
) -> Result<Tensor> {
    let flat = Tensor::zeros(layout.padded(), dtype, device)?;
    for (entry, grad) in layout.entries().iter().zip(grads) {
        if let Some(grad) = grad {
            write_at(&flat, entry.offset, &grad)?;
        }
    }
    Ok(flat)
}

/// Copies `grad`'s elements, in row-major order, into `flat` from `offset` on.
fn write_at(flat: &Tensor, offset: usize, grad: &Tensor) -> Result<()> {
    if grad.is_contiguous() {
        return flat.slice_set(&grad.flatten_all()?, 0, offset);
    }
    let rows = grad.dim(0)?;
    let row_len = grad.elem_count() / rows;
    let step = (BLOCK / row_len.max(1)).max(1);
    for start in (0..rows).step_by(step) {
        let block = grad.narrow(0, start, step.min(rows - start))?;
        flat.slice_set(
            &block.contiguous()?.flatten_all()?,
            0,
            offset + start * row_len,
        )?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn strided_and_missing_gradients_land_in_row_major_order() -> Result<()> {
        let device = Device::Cpu;
        // One row wider than a block, rows spanning several blocks, a contiguous vector and
        // a parameter without a gradient.
        let shapes = [(3, 70_000), (1_000, 300), (5, 1), (2, 1)];
        let layout = FlatLayout::new(
            shapes
                .iter()
                .enumerate()
                .map(|(i, &s)| (format!("p{i}"), s.into())),
            4,
        );
        let strided = |(r, c): (usize, usize)| -> Result<Tensor> {
            Tensor::arange(0f32, (r * c) as f32, &device)?
                .reshape((c, r))?
                .t()
        };
        let grads = [
            Some(strided(shapes[0])?),
            Some(strided(shapes[1])?),
            Some(Tensor::ones(shapes[2], DType::F32, &device)?),
            None,
        ];
        let mut expected = Vec::new();
        for g in grads.iter().flatten() {
            expected.extend(g.flatten_all()?.to_vec1::<f32>()?);
        }
        expected.resize(layout.padded(), 0.0);
        let flat = flatten_consuming(grads, &layout, DType::F32, &device)?;
        assert_eq!(flat.to_vec1::<f32>()?, expected);
        Ok(())
    }
}
