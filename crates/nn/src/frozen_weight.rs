//! `FrozenWeight`: a weight that takes no gradient, as an op reads it: a dense tensor, or a
//! quantized one (QLoRA's base, in a [`BlockFormat`]) that the op decodes to f32 each time
//! it runs, in forward and again in backward, so that no decoded copy outlives the op that
//! needed it.

use candle_core::{DType, Result, Shape, Tensor};
use wick_core::BlockFormat;

/// A frozen linear weight `[out, in]`: dense, or quantized and decoded on use.
#[derive(Clone, Debug)]
pub enum FrozenWeight {
    /// A tensor, used as it is.
    Dense(Tensor),
    /// Its stored blocks in `format` ([`BlockFormat::quantize`]), as a u8 tensor on the
    /// device the decoded weight lives on, decoded to `dtype` where used.
    Quantized {
        /// The form of its blocks.
        format: BlockFormat,
        /// The stored blocks, shared by the ops that use them (and the strategy that keeps
        /// them).
        stored: Tensor,
        /// The weight's shape.
        shape: Shape,
        /// What the decoded weight is computed in.
        dtype: DType,
    },
}

impl FrozenWeight {
    /// `dense` quantized to `format`, decoded later to its own dtype and device.
    pub fn quantize(dense: &Tensor, format: BlockFormat) -> Result<Self> {
        let values = dense
            .to_dtype(DType::F32)?
            .flatten_all()?
            .to_vec1::<f32>()?;
        let stored = format.quantize(&values, None)?;
        let len = stored.len();
        Ok(FrozenWeight::Quantized {
            format,
            stored: Tensor::from_vec(stored, len, dense.device())?,
            shape: dense.shape().clone(),
            dtype: dense.dtype(),
        })
    }

    /// A parameter as a strategy handed it out for a weight of `shape`: the stored blocks of
    /// one born quantized in `format` (a u8 tensor, [`wick_core::ParamRequest::quantize`]),
    /// decoded to f32, or a dense tensor. A u8 tensor with no format is an error.
    pub fn from_param(
        param: Tensor,
        shape: impl Into<Shape>,
        format: Option<BlockFormat>,
    ) -> Result<Self> {
        match (param.dtype(), format) {
            (DType::U8, Some(format)) => Ok(FrozenWeight::Quantized {
                format,
                stored: param,
                shape: shape.into(),
                dtype: DType::F32,
            }),
            (DType::U8, None) => {
                candle_core::bail!(
                    "a weight of stored blocks ({:?}) needs its block format",
                    shape.into()
                )
            }
            _ => Ok(FrozenWeight::Dense(param)),
        }
    }

    /// The weight's shape, `[out, in]`.
    pub fn dims(&self) -> &[usize] {
        match self {
            FrozenWeight::Dense(t) => t.dims(),
            FrozenWeight::Quantized { shape, .. } => shape.dims(),
        }
    }

    /// The weight as a tensor: the dense one, or the quantized one decoded (a new tensor
    /// each call, dropped by the caller when done; its stored blocks decoded in parallel).
    pub fn decoded(&self) -> Result<Tensor> {
        match self {
            FrozenWeight::Dense(t) => Ok(t.clone()),
            FrozenWeight::Quantized {
                format,
                stored,
                shape,
                dtype,
            } => format.decode_tensor(stored, shape)?.to_dtype(*dtype),
        }
    }

    /// The weight to multiply `x` by, in `x`'s dtype (a quantized weight decodes to the
    /// dtype its layer computes in, bf16 or f16 under mixed precision).
    pub fn decoded_for(&self, x: &Tensor) -> Result<Tensor> {
        self.decoded()?.to_dtype(x.dtype())
    }

    /// The weight's `(out, in)`: an error for a weight that is not `[out, in]`.
    pub fn out_in(&self) -> Result<(usize, usize)> {
        match self.dims() {
            &[out_dim, in_dim] => Ok((out_dim, in_dim)),
            dims => candle_core::bail!("a linear weight is [out, in], not {dims:?}"),
        }
    }

    /// Whether the weight is part of a graph (a dense variable or computed from one).
    pub fn track_op(&self) -> bool {
        matches!(self, FrozenWeight::Dense(t) if t.track_op())
    }
}
