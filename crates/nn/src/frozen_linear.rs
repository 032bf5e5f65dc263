//! `FrozenLinear`: a linear layer that takes no gradient, over a [`LayerWeight`] (QLoRA's
//! quantized base layers that carry no adapter).

use crate::cpu::{f32_inputs, fused};
use crate::fused_op::{CpuOp, CpuOut, Fused, GradsOf, Input};
use crate::layer_weight::LayerWeight;
use candle_core::{CpuStorage, Device, Module, Result, Tensor};

/// A linear layer whose weight and bias take no gradient: y = x Wᵀ + b. With a quantized
/// weight on the CPU in f32, one op that decodes W in forward and again for x's gradient
/// in backward, so the graph keeps only x; otherwise the decoded weight's matmul.
#[derive(Clone, Debug)]
pub struct FrozenLinear {
    weight: LayerWeight,
    bias: Option<Tensor>,
}

impl FrozenLinear {
    /// The layer of `weight` `[out, in]` and `bias` `[out]`.
    pub fn new(weight: LayerWeight, bias: Option<Tensor>) -> Self {
        FrozenLinear { weight, bias }
    }

    /// The weight.
    pub fn weight(&self) -> &LayerWeight {
        &self.weight
    }

    /// The bias, if the layer has one.
    pub fn bias(&self) -> Option<&Tensor> {
        self.bias.as_ref()
    }
}

impl Module for FrozenLinear {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let (out_dim, in_dim) = self.weight.out_in()?;
        let rows = x.elem_count() / in_dim.max(1);
        let mut dims = x.dims().to_vec();
        if let Some(last) = dims.last_mut() {
            *last = out_dim;
        }
        let x2 = x.reshape((rows, in_dim))?;
        let quantized = matches!(self.weight, LayerWeight::Quantized { .. });
        let mut all = vec![x];
        all.extend(&self.bias);
        let y = if quantized && fused(&all) {
            x2.contiguous()?.apply_op1(Fused(FrozenLinearOp {
                weight: self.weight.clone(),
            }))?
        } else {
            x2.matmul(&self.weight.decoded_for(&x2)?.t()?)?
        };
        let y = match &self.bias {
            Some(b) => y.broadcast_add(b)?,
            None => y,
        };
        y.reshape(dims)
    }
}

/// x Wᵀ over `[rows, in]`, W decoded where used.
struct FrozenLinearOp {
    weight: LayerWeight,
}

impl CpuOp<1> for FrozenLinearOp {
    const NAME: &'static str = "wick-frozen-linear";

    fn cpu(&self, inputs: [Input<'_>; 1]) -> CpuOut {
        let [x] = f32_inputs(Self::NAME, inputs)?;
        let x = Tensor::from_slice(x, inputs[0].1.shape(), &Device::Cpu)?;
        let y = x.matmul(&self.weight.decoded()?.t()?)?;
        let shape = y.shape().clone();
        Ok((CpuStorage::F32(y.flatten_all()?.to_vec1()?), shape))
    }

    fn grads(&self, [x]: [&Tensor; 1], _res: &Tensor, grad: &Tensor) -> GradsOf<1> {
        if !x.track_op() {
            return Ok([None]);
        }
        Ok([Some(grad.detach().matmul(&self.weight.decoded()?)?)])
    }
}
