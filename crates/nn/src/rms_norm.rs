//! `RmsNorm`: y = x / sqrt(mean(x²) + eps) * weight over the last dimension, as Hugging
//! Face's Llama computes it (in f32), forward and backward each one pass over the rows.

use crate::cpu::{as_f32, f32_inputs, fused, map_rows, norm_grads, norm_width, NormRowGrad};
use crate::fused_op::{CpuOp, CpuOut, Fused, GradsOf, Input};
use crate::vector_math;
use candle_core::{CpuStorage, DType, Module, Result, Tensor, D};
use candle_nn::VarBuilder;

/// Root-mean-square normalisation over the last dimension, with a learned scale (Llama's
/// `LlamaRMSNorm`).
///
/// Unlike candle-nn's `RmsNorm`, whose fused op has no backward, this one trains. Fused on
/// the CPU in f32; the composite ops elsewhere. 16-bit inputs are normalised in f32 and the
/// result rounded once, as Hugging Face does.
#[derive(Clone, Debug)]
pub struct RmsNorm {
    weight: Tensor,
    eps: f64,
    /// Gemma's norm scales by `1 + weight` (its weight starts at zero).
    unit_offset: bool,
}

/// An [`RmsNorm`] of width `size`: `weight` (ones) from `vb`.
pub fn rms_norm(size: usize, eps: f64, vb: VarBuilder) -> Result<RmsNorm> {
    Ok(RmsNorm::new(
        vb.get_with_hints(size, "weight", candle_nn::Init::Const(1.0))?,
        eps,
    ))
}

/// Gemma's [`RmsNorm`] of width `size`, which scales by `1 + weight`: `weight` (zeros) from
/// `vb`.
pub fn rms_norm_unit_offset(size: usize, eps: f64, vb: VarBuilder) -> Result<RmsNorm> {
    let weight = vb.get_with_hints(size, "weight", candle_nn::Init::Const(0.0))?;
    Ok(RmsNorm {
        unit_offset: true,
        ..RmsNorm::new(weight, eps)
    })
}

impl RmsNorm {
    /// An RMS norm over a given weight.
    pub fn new(weight: Tensor, eps: f64) -> Self {
        RmsNorm {
            weight,
            eps,
            unit_offset: false,
        }
    }

    /// The scale.
    pub fn weight(&self) -> &Tensor {
        &self.weight
    }
}

impl Module for RmsNorm {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let dtype = x.dtype();
        if self.unit_offset {
            // 1 + w in f32, as Gemma computes it; the gradient reaches w through the sum.
            let w = (as_f32(&self.weight)? + 1.0)?;
            return RmsNorm::new(w, self.eps).forward(x);
        }
        if dtype != DType::F32 {
            let w = as_f32(&self.weight)?;
            return RmsNorm::new(w, self.eps)
                .forward(&as_f32(x)?)?
                .to_dtype(dtype);
        }
        if !fused(&[x, &self.weight]) {
            return rms_norm_composite(x, &self.weight, self.eps);
        }
        let eps = self.eps as f32;
        x.contiguous()?
            .apply_op2(&self.weight.contiguous()?, Fused(Forward { eps }))
    }
}

/// The same norm from Candle's basic ops (the fallback, and the reference in tests).
pub fn rms_norm_composite(x: &Tensor, weight: &Tensor, eps: f64) -> Result<Tensor> {
    let ms = x.sqr()?.mean_keepdim(D::Minus1)?;
    x.broadcast_div(&(ms + eps)?.sqrt()?)?.broadcast_mul(weight)
}

/// A row's reciprocal root mean square.
fn rrms(row: &[f32], eps: f32) -> f32 {
    let ms = vector_math::dot(row, row) / row.len() as f32;
    1.0 / (ms + eps).sqrt()
}

struct Forward {
    eps: f32,
}

impl CpuOp<2> for Forward {
    const NAME: &'static str = "wick-rms-norm";

    fn cpu(&self, inputs: [Input<'_>; 2]) -> CpuOut {
        let c = norm_width(Self::NAME, inputs[0].1, inputs[1].1)?;
        let [x, w] = f32_inputs(Self::NAME, inputs)?;
        let y = map_rows(x, c, |row, out| {
            vector_math::rms_norm_row(out, row, w, rrms(row, self.eps));
        });
        Ok((CpuStorage::F32(y), inputs[0].1.shape().clone()))
    }

    fn grads(&self, [x, w]: [&Tensor; 2], _res: &Tensor, grad: &Tensor) -> GradsOf<2> {
        norm_grads(Grad { eps: self.eps }, x, w, grad)
    }
}

/// RMS norm's backward of one row: dx, and its share of dweight.
struct Grad {
    eps: f32,
}

impl NormRowGrad for Grad {
    const NAME: &'static str = "wick-rms-norm-backward";
    const WEIGHT_GRADS: usize = 1;

    fn row(&self, row: &[f32], g: &[f32], w: &[f32], d: &mut [f32], dw: &mut [f32]) {
        let (c, eps) = (row.len(), self.eps);
        let r = rrms(row, eps);
        // y = w x r, dr/dx_j = -r³ x_j / c:
        // dx_j = r (g_j w_j - x_j r² mean(g w x)).
        let mean_gwx = vector_math::centered_dot3(g, w, row, 0.0) / c as f32;
        vector_math::rms_norm_row_grad(d, dw, row, g, w, r, mean_gwx);
    }
}
