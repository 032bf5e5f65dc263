//! `FrozenParam`: a parameter that takes no gradient as a replicated strategy keeps it: the
//! f32 tensor, or, born quantized (QLoRA's base, [`ParamRequest::quantize`]), its stored
//! blocks only.

use crate::layout::block_layout::decoded;
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
    /// The parameter `request` asks for, from its f32 `values` (all of them), quantized
    /// when the request says so.
    pub(crate) fn new(request: &ParamRequest<'_>, values: Vec<f32>) -> candle_core::Result<Self> {
        let tensor = match request.quantize {
            Some(format) => {
                let stored = format.quantize(&values, None)?;
                let len = stored.len();
                Tensor::from_vec(stored, len, request.device)?
            }
            None => Tensor::from_vec(values, request.shape, request.device)?,
        };
        Ok(FrozenParam {
            name: request.name.to_string(),
            shape: request.shape.clone(),
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
