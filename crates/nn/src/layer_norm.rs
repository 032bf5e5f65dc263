//! `LayerNorm`: y = (x - mean) / sqrt(var + eps) * weight + bias over the last dimension,
//! forward and backward each one pass over the rows.

use crate::cpu::{as_f32, f32_inputs, fused, map_rows, norm_grads, norm_width, NormRowGrad};
use crate::fused_op::{CpuOp, CpuOut, Fused, GradsOf, Input};
use crate::vector_math;
use candle_core::{CpuStorage, DType, Module, Result, Tensor, D};
use candle_nn::VarBuilder;

/// Layer normalisation over the last dimension, with a learned scale and shift.
///
/// Unlike candle-nn's `LayerNorm`, whose fused op has no backward (gradients stop at it,
/// silently), this one trains: its backward is fused too. Fused on the CPU in f32; the
/// composite ops elsewhere. 16-bit inputs are computed in f32 and rounded back.
#[derive(Clone, Debug)]
pub struct LayerNorm {
    weight: Tensor,
    bias: Tensor,
    eps: f64,
}

/// A [`LayerNorm`] of width `size`: `weight` (ones) and `bias` (zeros) from `vb`.
pub fn layer_norm(size: usize, eps: f64, vb: VarBuilder) -> Result<LayerNorm> {
    Ok(LayerNorm {
        weight: vb.get_with_hints(size, "weight", candle_nn::Init::Const(1.0))?,
        bias: vb.get_with_hints(size, "bias", candle_nn::Init::Const(0.0))?,
        eps,
    })
}

impl LayerNorm {
    /// A layer norm over given tensors.
    pub fn new(weight: Tensor, bias: Tensor, eps: f64) -> Self {
        LayerNorm { weight, bias, eps }
    }
}

impl Module for LayerNorm {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let dtype = x.dtype();
        if dtype != DType::F32 {
            // 16-bit inputs are normalised in f32 and the result rounded once.
            let (w, b) = (as_f32(&self.weight)?, as_f32(&self.bias)?);
            return LayerNorm::new(w, b, self.eps)
                .forward(&as_f32(x)?)?
                .to_dtype(dtype);
        }
        if !fused(&[x, &self.weight, &self.bias]) {
            return layer_norm_composite(x, &self.weight, &self.bias, self.eps);
        }
        let (w, b, eps) = (
            self.weight.contiguous()?,
            self.bias.contiguous()?,
            self.eps as f32,
        );
        x.contiguous()?.apply_op3(&w, &b, Fused(Forward { eps }))
    }
}

/// The same layer norm from Candle's basic ops (the fallback, and the reference in tests).
pub fn layer_norm_composite(
    x: &Tensor,
    weight: &Tensor,
    bias: &Tensor,
    eps: f64,
) -> Result<Tensor> {
    let centered = x.broadcast_sub(&x.mean_keepdim(D::Minus1)?)?;
    let var = centered.sqr()?.mean_keepdim(D::Minus1)?;
    let normed = centered.broadcast_div(&(var + eps)?.sqrt()?)?;
    normed.broadcast_mul(weight)?.broadcast_add(bias)
}

/// A row's mean and reciprocal standard deviation.
fn moments(row: &[f32], eps: f32) -> (f32, f32) {
    let n = row.len() as f32;
    let mean = vector_math::sum(row) / n;
    let var = vector_math::centered_square_sum(row, mean) / n;
    (mean, 1.0 / (var + eps).sqrt())
}

struct Forward {
    eps: f32,
}

impl CpuOp<3> for Forward {
    const NAME: &'static str = "wick-layer-norm";

    fn cpu(&self, inputs: [Input<'_>; 3]) -> CpuOut {
        let c = norm_width(Self::NAME, inputs[0].1, inputs[1].1)?;
        let [x, w, b] = f32_inputs(Self::NAME, inputs)?;
        let y = map_rows(x, c, |row, out| {
            let (mean, rstd) = moments(row, self.eps);
            vector_math::layer_norm_row(out, row, w, b, mean, rstd);
        });
        Ok((CpuStorage::F32(y), inputs[0].1.shape().clone()))
    }

    fn grads(&self, [x, w, _]: [&Tensor; 3], _res: &Tensor, grad: &Tensor) -> GradsOf<3> {
        norm_grads(Grad { eps: self.eps }, x, w, grad)
    }
}

/// Layer norm's backward of one row: dx, and its shares of dweight, then dbias.
struct Grad {
    eps: f32,
}

impl NormRowGrad for Grad {
    const NAME: &'static str = "wick-layer-norm-backward";
    const WEIGHT_GRADS: usize = 2;

    fn row(&self, row: &[f32], g: &[f32], w: &[f32], d: &mut [f32], dwb: &mut [f32]) {
        let (c, eps) = (row.len(), self.eps);
        // The partial sums hold dweight, then dbias.
        let (dw, db) = dwb.split_at_mut(c);
        let (mean, rstd) = moments(row, eps);
        // The row's sums in SIMD lanes: mean(dxhat) and mean(dxhat xhat), dxhat = g w.
        let mean_dxhat = vector_math::dot(g, w) / c as f32;
        let mean_dxhat_xhat = vector_math::centered_dot3(g, w, row, mean) * rstd / c as f32;
        vector_math::layer_norm_row_grad(
            d,
            dw,
            db,
            row,
            g,
            w,
            mean,
            rstd,
            mean_dxhat,
            mean_dxhat_xhat,
        );
    }
}
