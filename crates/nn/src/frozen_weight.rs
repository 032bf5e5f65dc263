//! `FrozenWeight`: a weight that takes no gradient, as an op reads it: a dense tensor, or a
//! quantized one (QLoRA's NF4) that the op decodes to f32 each time it runs, in forward and
//! again in backward, so that no decoded copy outlives the op that needed it.

use candle_core::{DType, Result, Shape, Tensor};
use rayon::prelude::*;
use wick_core::{decode_nf4_stored, nf4_stored_len, Nf4Tensor, NF4_STORED_BLOCK, NF4_STORED_BYTES};

/// A frozen linear weight `[out, in]`: dense, or quantized and decoded on use.
#[derive(Clone, Debug)]
pub enum FrozenWeight {
    /// A tensor, used as it is.
    Dense(Tensor),
    /// NF4 with double quantization: its stored blocks ([`Nf4Tensor::to_stored`]), as a u8
    /// tensor on the device the decoded weight lives on, decoded to `dtype` where used.
    Nf4 {
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
    /// `dense` quantized to NF4, decoded later to its own dtype and device.
    pub fn nf4(dense: &Tensor) -> Result<Self> {
        let values = dense
            .to_dtype(DType::F32)?
            .flatten_all()?
            .to_vec1::<f32>()?;
        let stored = Nf4Tensor::quantize(&values, dense.dims()).to_stored();
        let len = stored.len();
        Ok(FrozenWeight::Nf4 {
            stored: Tensor::from_vec(stored, len, dense.device())?,
            shape: dense.shape().clone(),
            dtype: dense.dtype(),
        })
    }

    /// A parameter as a strategy handed it out for a weight of `shape`: the stored blocks of
    /// one born quantized (a u8 tensor, [`wick_core::ParamRequest::quantize`]), decoded to
    /// f32, or a dense tensor.
    pub fn from_param(param: Tensor, shape: impl Into<Shape>) -> Self {
        match param.dtype() {
            DType::U8 => FrozenWeight::Nf4 {
                stored: param,
                shape: shape.into(),
                dtype: DType::F32,
            },
            _ => FrozenWeight::Dense(param),
        }
    }

    /// The weight's shape, `[out, in]`.
    pub fn dims(&self) -> &[usize] {
        match self {
            FrozenWeight::Dense(t) => t.dims(),
            FrozenWeight::Nf4 { shape, .. } => shape.dims(),
        }
    }

    /// The weight as a tensor: the dense one, or the quantized one decoded (a new tensor
    /// each call, dropped by the caller when done; its stored blocks decoded in parallel).
    pub fn decoded(&self) -> Result<Tensor> {
        match self {
            FrozenWeight::Dense(t) => Ok(t.clone()),
            FrozenWeight::Nf4 {
                stored,
                shape,
                dtype,
            } => decode(stored, shape)?.to_dtype(*dtype),
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

/// The f32 weight of `shape` that the NF4 `stored` blocks hold, on their device; whole
/// stored blocks decode alone, one task each.
fn decode(stored: &Tensor, shape: &Shape) -> Result<Tensor> {
    let bytes: Vec<u8> = stored.to_vec1()?;
    let mut values = vec![0f32; shape.elem_count()];
    if bytes.len() != nf4_stored_len(values.len()) {
        candle_core::bail!(
            "{} bytes of NF4 blocks do not hold a weight of shape {shape:?}",
            bytes.len()
        )
    }
    (bytes.par_chunks(NF4_STORED_BYTES))
        .zip(values.par_chunks_mut(NF4_STORED_BLOCK))
        .try_for_each(|(b, v)| decode_nf4_stored(b, v))
        .map_err(candle_core::Error::Msg)?;
    Tensor::from_vec(values, shape, stored.device())
}
