//! `FrozenParam`: a parameter that takes no gradient as a replicated strategy keeps it: the
//! f32 tensor, or, born quantized (QLoRA's base, [`ParamRequest::quantize`]), its stored
//! blocks only.

use crate::layout::block_layout::decoded;
use crate::layout::init::{param_blocks, param_values};
use candle_core::{Shape, Tensor};
use wick_core::{BlockFormat, ParamRequest};

/// A frozen parameter: its name, its full shape and what is kept of it.
pub(crate) struct FrozenParam {
    pub(crate) name: String,
    /// The parameter's shape (of the f32 values, also when kept quantized).
    pub(crate) shape: Shape,
    /// The f32 tensor, or the u8 stored blocks of its quantized form.
    pub(crate) tensor: Tensor,
    /// The form of its blocks, when kept quantized.
    pub(crate) format: Option<BlockFormat>,
}

impl FrozenParam {
    /// The parameter `request` asks for, made from its init under `seed` (all of it),
    /// quantized when the request says so (or read as its weights hold its blocks).
    pub(crate) fn new(request: &ParamRequest<'_>, seed: u64) -> candle_core::Result<Self> {
        let (name, shape) = (request.name, request.shape);
        let all = 0..shape.elem_count();
        let tensor = match request.quantize {
            Some(format) => {
                let stored = param_blocks(request.init, seed, (name, shape), format, all)?;
                let len = stored.len();
                Tensor::from_vec(stored, len, request.device)?
            }
            None => {
                let values = param_values(request.init, seed, name, shape, all)?;
                Tensor::from_vec(values, shape, request.device)?
            }
        };
        Ok(FrozenParam {
            name: name.to_string(),
            shape: shape.clone(),
            tensor,
            format: request.quantize,
        })
    }

    /// Its f32 values as a tensor of its shape (decoded when kept quantized).
    pub(crate) fn full(&self) -> candle_core::Result<Tensor> {
        match self.format {
            Some(format) => decoded(format, &self.name, &self.tensor, &self.shape),
            None => self.tensor.copy(),
        }
    }
}
