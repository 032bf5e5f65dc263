//! `Gelu`: the tanh approximation of GELU (what Candle's `Tensor::gelu` computes), with a
//! fused backward.

use crate::cpu::{f32s, fused};
use crate::vector_math;
use candle_core::{CpuStorage, CustomOp1, CustomOp2, Layout, Module, Result, Shape, Tensor};
use rayon::prelude::*;

/// Elements per parallel task.
const CHUNK: usize = 32 * 1024;

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
        true => x.contiguous()?.apply_op1(Forward),
        false => x.gelu(),
    }
}

struct Forward;

impl CustomOp1 for Forward {
    fn name(&self) -> &'static str {
        "wick-gelu"
    }

    fn cpu_fwd(&self, s: &CpuStorage, l: &Layout) -> Result<(CpuStorage, Shape)> {
        let x = f32s(self.name(), s, l)?;
        let mut y = vec![0f32; x.len()];
        y.par_chunks_mut(CHUNK)
            .zip(x.par_chunks(CHUNK))
            .for_each(|(y, x)| vector_math::gelu(y, x));
        Ok((CpuStorage::F32(y), l.shape().clone()))
    }

    fn bwd(&self, x: &Tensor, _res: &Tensor, grad: &Tensor) -> Result<Option<Tensor>> {
        Ok(Some(x.apply_op2_no_bwd(&grad.contiguous()?, &Backward)?))
    }
}

/// (x, dy) -> dx.
struct Backward;

impl CustomOp2 for Backward {
    fn name(&self) -> &'static str {
        "wick-gelu-backward"
    }

    fn cpu_fwd(
        &self,
        xs: &CpuStorage,
        xl: &Layout,
        gs: &CpuStorage,
        gl: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        let (x, g) = (f32s(self.name(), xs, xl)?, f32s(self.name(), gs, gl)?);
        let mut dx = vec![0f32; x.len()];
        dx.par_chunks_mut(CHUNK)
            .zip(x.par_chunks(CHUNK).zip(g.par_chunks(CHUNK)))
            .for_each(|(dx, (x, g))| vector_math::gelu_backward(dx, x, g));
        Ok((CpuStorage::F32(dx), xl.shape().clone()))
    }
}
