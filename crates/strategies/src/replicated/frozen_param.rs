//! `FrozenParam`: a parameter that takes no gradient as a replicated strategy keeps it: the
//! f32 tensor, or, born quantized (QLoRA's base, [`ParamRequest::quantize`]), its NF4 stored
//! blocks only.

use crate::layout::block_layout::decoded;
use candle_core::{DType, Shape, Tensor};
use wick_core::{Nf4Tensor, ParamRequest};

/// A frozen parameter: its name, its full shape and what is kept of it.
pub(crate) struct FrozenParam {
    pub(crate) name: String,
    /// The parameter's shape (of the f32 values, also when kept quantized).
    pub(crate) shape: Shape,
    /// The f32 tensor, or the u8 stored blocks of its NF4 form.
    pub(crate) tensor: Tensor,
}

impl FrozenParam {
    /// The parameter `request` asks for, from its f32 `values` (all of them), quantized
    /// when the request says so.
    pub(crate) fn new(request: &ParamRequest<'_>, values: Vec<f32>) -> candle_core::Result<Self> {
        let tensor = match request.quantize {
            true => {
                let stored = Nf4Tensor::quantize(&values, request.shape.dims()).to_stored();
                let len = stored.len();
                Tensor::from_vec(stored, len, request.device)?
            }
            false => Tensor::from_vec(values, request.shape, request.device)?,
        };
        Ok(FrozenParam {
            name: request.name.to_string(),
            shape: request.shape.clone(),
            tensor,
        })
    }

    /// Whether it is kept as NF4 blocks.
    pub(crate) fn is_quantized(&self) -> bool {
        self.tensor.dtype() == DType::U8
    }

    /// Its f32 values as a tensor of its shape (decoded when kept quantized).
    pub(crate) fn full(&self) -> candle_core::Result<Tensor> {
        match self.is_quantized() {
            true => decoded(&self.name, &self.tensor, &self.shape),
            false => self.tensor.copy(),
        }
    }
}
