//! `FrozenWeight`: a weight that takes no gradient, as an op reads it: a dense tensor, or a
//! quantized one (QLoRA's NF4) that the op decodes to f32 each time it runs, in forward and
//! again in backward, so that no decoded copy outlives the op that needed it.

use candle_core::{DType, Device, Result, Tensor};
use std::sync::Arc;
use wick_core::Nf4Tensor;

/// A frozen linear weight `[out, in]`: dense, or quantized and decoded on use.
#[derive(Clone, Debug)]
pub enum FrozenWeight {
    /// A tensor, used as it is.
    Dense(Tensor),
    /// NF4 with double quantization, decoded to `dtype` on `device` where used.
    Nf4 {
        /// The quantized weight, shared by the ops that use it.
        weight: Arc<Nf4Tensor>,
        /// Where the decoded weight lives.
        device: Device,
        /// What the decoded weight is computed in.
        dtype: DType,
    },
}

impl FrozenWeight {
    /// `dense` quantized to NF4, decoded later to its own dtype and device.
    pub fn nf4(dense: &Tensor) -> Result<Self> {
        let values = dense
            .to_dtype(DType::F32)?
            .flatten_all()?
            .to_vec1::<f32>()?;
        Ok(FrozenWeight::Nf4 {
            weight: Arc::new(Nf4Tensor::quantize(&values, dense.dims())),
            device: dense.device().clone(),
            dtype: dense.dtype(),
        })
    }

    /// The weight's shape, `[out, in]`.
    pub fn dims(&self) -> &[usize] {
        match self {
            FrozenWeight::Dense(t) => t.dims(),
            FrozenWeight::Nf4 { weight, .. } => weight.dims(),
        }
    }

    /// The weight as a tensor: the dense one, or the quantized one decoded (a new tensor
    /// each call, dropped by the caller when done).
    pub fn decoded(&self) -> Result<Tensor> {
        match self {
            FrozenWeight::Dense(t) => Ok(t.clone()),
            FrozenWeight::Nf4 {
                weight,
                device,
                dtype,
            } => Tensor::from_vec(weight.dequantize(), weight.dims(), device)?.to_dtype(*dtype),
        }
    }

    /// Whether the weight is part of a graph (a dense variable or computed from one).
    pub fn track_op(&self) -> bool {
        matches!(self, FrozenWeight::Dense(t) if t.track_op())
    }

    /// Bytes the weight holds as stored.
    pub fn storage_bytes(&self) -> usize {
        match self {
            FrozenWeight::Dense(t) => t.elem_count() * t.dtype().size_in_bytes(),
            FrozenWeight::Nf4 { weight, .. } => weight.storage_bytes(),
        }
    }
}
