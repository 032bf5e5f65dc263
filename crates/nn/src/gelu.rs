//! `Gelu`: the tanh approximation of GELU (what Candle's `Tensor::gelu` computes), with a
//! fused backward.

use crate::cpu::{f32_inputs, fused, map_pairs, new_in_chunks, ELEMENTWISE_CHUNK};
use crate::fused_op::{CpuOp, CpuOut, Fused, GradsOf, Input};
use crate::vector_math;
use candle_core::{CpuStorage, Module, Result, Tensor};

/// GELU, tanh approximation, as a layer. Fused on the CPU in f32; `Tensor::gelu` elsewhere.
#[derive(Clone, Copy, Debug, Default)]
pub struct Gelu;

impl Module for Gelu {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        gelu(x)
    }
}

/// GELU (tanh approximation) of `x`, element-wise; equal to Candle's `x.gelu()`.
pub fn gelu(x: &Tensor) -> Result<Tensor> {
    match fused(&[x]) {
        true => x.contiguous()?.apply_op1(Fused(Forward)),
        false => x.gelu(),
    }
}

struct Forward;

impl CpuOp<1> for Forward {
    const NAME: &'static str = "wick-gelu";

    fn cpu(&self, inputs: [Input<'_>; 1]) -> CpuOut {
        let [x] = f32_inputs(Self::NAME, inputs)?;
        let y = new_in_chunks(x.len(), ELEMENTWISE_CHUNK, |i, y| {
            let at = i * ELEMENTWISE_CHUNK;
            vector_math::gelu(y, &x[at..at + y.len()])
        });
        Ok((CpuStorage::F32(y), inputs[0].1.shape().clone()))
    }

    fn grads(&self, [x]: [&Tensor; 1], _res: &Tensor, grad: &Tensor) -> GradsOf<1> {
        Ok([Some(
            x.apply_op2_no_bwd(&grad.contiguous()?, &Fused(Backward))?,
        )])
    }
}

/// (x, dy) -> dx.
struct Backward;

impl CpuOp<2> for Backward {
    const NAME: &'static str = "wick-gelu-backward";

    fn cpu(&self, inputs: [Input<'_>; 2]) -> CpuOut {
        let [x, g] = f32_inputs(Self::NAME, inputs)?;
        let dx = map_pairs(Self::NAME, x, g, vector_math::gelu_backward)?;
        Ok((CpuStorage::F32(dx), inputs[0].1.shape().clone()))
    }
}
