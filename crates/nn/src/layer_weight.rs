//! `LayerWeight`: a layer's weight as its ops read it: a dense tensor, or a quantized one
//! that takes no gradient (QLoRA's base, in a [`BlockFormat`]) and that each op decodes to
//! f32 each time it runs, in forward and again in backward, so that no decoded copy
//! outlives the op that needed it. An embedding table held so is decoded a row at a time
//! ([`LayerWeight::rows`]), and as an output head a slice of its rows at a time
//! ([`crate::head_score`]).

use candle_core::{DType, Result, Shape, Tensor};
use rayon::prelude::*;
use wick_core::{with_stored_bytes, BlockFormat};

/// A layer's weight (`[out, in]`, or an embedding's `[vocab, width]`): dense (trained or
/// not), or quantized, frozen and decoded on use.
#[derive(Clone, Debug)]
pub enum LayerWeight {
    /// A tensor, used as it is (a variable, where the layer trains it).
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

impl LayerWeight {
    /// `dense` quantized to `format`, decoded later to its own dtype and device.
    pub fn quantize(dense: &Tensor, format: BlockFormat) -> Result<Self> {
        let values = dense
            .to_dtype(DType::F32)?
            .flatten_all()?
            .to_vec1::<f32>()?;
        let stored = format.quantize(&values, None)?;
        let len = stored.len();
        Ok(LayerWeight::Quantized {
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
            (DType::U8, Some(format)) => Ok(LayerWeight::Quantized {
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
            _ => Ok(LayerWeight::Dense(param)),
        }
    }

    /// The weight's shape, `[out, in]`.
    pub fn dims(&self) -> &[usize] {
        match self {
            LayerWeight::Dense(t) => t.dims(),
            LayerWeight::Quantized { shape, .. } => shape.dims(),
        }
    }

    /// The weight as a tensor: the dense one, or the quantized one decoded (a new tensor
    /// each call, dropped by the caller when done; its stored blocks decoded in parallel).
    pub fn decoded(&self) -> Result<Tensor> {
        match self {
            LayerWeight::Dense(t) => Ok(t.clone()),
            LayerWeight::Quantized {
                stored,
                shape,
                dtype,
                ..
            } => {
                let mut values = vec![0f32; shape.elem_count()];
                self.decode_values(0, &mut values)?;
                Tensor::from_vec(values, shape, stored.device())?.to_dtype(*dtype)
            }
        }
    }

    /// The rows `ids` (`[n]`, any integer dtype) of the weight: `[n, width]`. A quantized
    /// weight decodes only the blocks that hold those rows, into its dtype.
    pub fn rows(&self, ids: &Tensor) -> Result<Tensor> {
        let (format, stored, dtype) = match self {
            LayerWeight::Dense(t) => return t.index_select(ids, 0),
            LayerWeight::Quantized {
                format,
                stored,
                dtype,
                ..
            } => (format, stored, dtype),
        };
        let (vocab, width) = self.out_in()?;
        let ids = ids.to_dtype(DType::U32)?.to_vec1::<u32>()?;
        if let Some(id) = ids.iter().find(|&&id| id as usize >= vocab) {
            candle_core::bail!("row {id} of a table of {vocab} rows")
        }
        let mut out = vec![0f32; ids.len() * width];
        with_stored_bytes(stored, |bytes| {
            (out.par_chunks_mut(width.max(1)).zip(&ids))
                .try_for_each(|(row, &id)| {
                    format.decode_values(bytes, vocab * width, id as usize * width, row)
                })
                .map_err(candle_core::Error::Msg)
        })?;
        Tensor::from_vec(out, (ids.len(), width), stored.device())?.to_dtype(*dtype)
    }

    /// Decodes values `start..start + out.len()` of a quantized weight (row-major) into
    /// `out`; a dense weight is an error (it is read as it is).
    pub(crate) fn decode_values(&self, start: usize, out: &mut [f32]) -> Result<()> {
        let LayerWeight::Quantized {
            format,
            stored,
            shape,
            ..
        } = self
        else {
            candle_core::bail!("a dense weight has no blocks to decode")
        };
        with_stored_bytes(stored, |bytes| {
            (format.decode_values(bytes, shape.elem_count(), start, out))
                .map_err(candle_core::Error::Msg)
        })
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
        matches!(self, LayerWeight::Dense(t) if t.track_op())
    }
}
