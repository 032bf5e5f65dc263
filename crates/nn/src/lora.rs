//! `lora_linear`: a frozen linear layer and LoRA's update in one op,
//! y = x Wᵀ + b + s · ((x ⊙ m) Aᵀ) Bᵀ.
//!
//! Candle's graph holds every op's inputs until backward, so the composite form keeps four
//! `[rows, out]` tensors per adapted layer where the layer alone keeps one (the base output,
//! the update, its scaled copy and the sum): under LoRA on every linear layer that is more
//! activation memory than full fine-tuning needs. The fused op keeps only its inputs (x and
//! the adapters) and its output, as PyTorch's autograd keeps for PEFT's layer; backward
//! recomputes the small `(x ⊙ m) Aᵀ`. A quantized frozen weight (QLoRA) is decoded inside the
//! op, in forward and again in backward, and never kept decoded between them.

use crate::cpu::{f32_inputs, fused};
use crate::fused_op::{CpuOp, CpuOut, Fused, GradsOf, Input};
use crate::layer_weight::LayerWeight;
use candle_core::{CpuStorage, Device, Result, Tensor};

/// A frozen linear layer's weight `[out, in]` and bias `[out]`, LoRA's `a` `[r, in]` and `b`
/// `[out, r]`, the update's `scale` (alpha / r) and, in training with dropout, the `mask`
/// (the kept elements' factor, 0 elsewhere) over the adapter's input, of `x`'s shape.
#[derive(Debug, Clone, Copy)]
pub struct LoraParts<'a> {
    /// The frozen weight, `[out, in]`, dense or quantized.
    pub weight: &'a LayerWeight,
    /// The frozen bias, `[out]`.
    pub bias: Option<&'a Tensor>,
    /// A, `[r, in]`.
    pub a: &'a Tensor,
    /// B, `[out, r]`.
    pub b: &'a Tensor,
    /// alpha / r.
    pub scale: f64,
    /// Dropout's factors over the adapter's input (`x`'s shape), if any.
    pub mask: Option<&'a Tensor>,
}

/// y = x Wᵀ + b + s · ((x ⊙ m) Aᵀ) Bᵀ over the last dimension of `x`, W and b taking no
/// gradient. Fused on the CPU in f32 when W and b are frozen (neither a variable nor
/// computed from one); [`lora_linear_composite`] otherwise.
pub fn lora_linear(x: &Tensor, p: LoraParts) -> Result<Tensor> {
    let frozen = !p.weight.track_op() && !p.bias.is_some_and(Tensor::track_op);
    let dense = match p.weight {
        LayerWeight::Dense(w) => Some(w),
        LayerWeight::Quantized { .. } => None,
    };
    let mut all = vec![x, p.a, p.b];
    all.extend(dense);
    all.extend(p.bias);
    all.extend(p.mask);
    if !(frozen && fused(&all)) {
        return lora_linear_composite(x, p);
    }
    let (out_dim, in_dim) = p.weight.out_in()?;
    let rows = x.elem_count() / in_dim;
    let op = LoraOp {
        weight: match p.weight {
            LayerWeight::Dense(w) => LayerWeight::Dense(w.contiguous()?),
            quantized => quantized.clone(),
        },
        bias: p.bias.map(Tensor::contiguous).transpose()?,
        scale: p.scale,
        mask: p
            .mask
            .map(|m| m.reshape((rows, in_dim))?.contiguous())
            .transpose()?,
    };
    let (a, b) = (p.a.contiguous()?, p.b.contiguous()?);
    let y = x
        .reshape((rows, in_dim))?
        .contiguous()?
        .apply_op3(&a, &b, Fused(op))?;
    let mut dims = x.dims().to_vec();
    if let Some(last) = dims.last_mut() {
        *last = out_dim;
    }
    y.reshape(dims)
}

/// The same from Candle's ops (the fallback, and the reference in tests), in PEFT's order:
/// the base layer's output plus the scaled update. A quantized weight is decoded once and
/// kept by the graph until backward.
pub fn lora_linear_composite(x: &Tensor, p: LoraParts) -> Result<Tensor> {
    let (out_dim, in_dim) = p.weight.out_in()?;
    let rows = x.elem_count() / in_dim;
    let x2 = x.reshape((rows, in_dim))?;
    let mut y = x2.matmul(&p.weight.decoded_for(&x2)?.t()?)?;
    if let Some(b) = p.bias {
        y = y.broadcast_add(b)?;
    }
    let dropped = match p.mask {
        Some(m) => (&x2 * m.reshape((rows, in_dim))?)?,
        None => x2,
    };
    let update = dropped
        .matmul(&p.a.t()?)?
        .matmul(&p.b.t()?)?
        .affine(p.scale, 0.0)?;
    let mut dims = x.dims().to_vec();
    if let Some(last) = dims.last_mut() {
        *last = out_dim;
    }
    (y + update)?.reshape(dims)
}

/// The fused op over (x `[rows, in]`, A, B); the frozen parts ride along.
struct LoraOp {
    weight: LayerWeight,
    bias: Option<Tensor>,
    scale: f64,
    mask: Option<Tensor>,
}

impl LoraOp {
    /// `x ⊙ m`, or `x` without dropout.
    fn dropped(&self, x: &Tensor) -> Result<Tensor> {
        match &self.mask {
            Some(m) => x * m,
            None => Ok(x.clone()),
        }
    }
}

impl CpuOp<3> for LoraOp {
    const NAME: &'static str = "wick-lora-linear";

    fn cpu(&self, inputs: [Input<'_>; 3]) -> CpuOut {
        // CPU tensors of the inputs' f32 elements.
        let [x, a, b] = f32_inputs(Self::NAME, inputs)?;
        let [x, a, b] = [(x, 0), (a, 1), (b, 2)]
            .map(|(data, i)| Tensor::from_slice(data, inputs[i].1.shape(), &Device::Cpu));
        let (x, a, b) = (x?, a?, b?);
        let mut y = x.matmul(&self.weight.decoded()?.t()?)?;
        if let Some(bias) = &self.bias {
            y = y.broadcast_add(bias)?;
        }
        let update = self.dropped(&x)?.matmul(&a.t()?)?.matmul(&b.t()?)?;
        let y = (y + update.affine(self.scale, 0.0)?)?;
        let shape = y.shape().clone();
        Ok((CpuStorage::F32(y.flatten_all()?.to_vec1()?), shape))
    }

    fn grads(&self, [x, a, b]: [&Tensor; 3], _res: &Tensor, grad: &Tensor) -> GradsOf<3> {
        // An input that takes no gradient (the first block's, under LoRA) costs no product.
        let x_tracks = x.track_op();
        let (x, a, b, g) = (x.detach(), a.detach(), b.detach(), grad.detach());
        let dropped = self.dropped(&x)?;
        // h = (x ⊙ m) Aᵀ, recomputed: [rows, r].
        let h = dropped.matmul(&a.t()?)?;
        let db = g.t()?.matmul(&h)?.affine(self.scale, 0.0)?;
        let dh = g.matmul(&b)?.affine(self.scale, 0.0)?;
        let da = dh.t()?.matmul(&dropped)?;
        let dx = match x_tracks {
            false => None,
            true => {
                let through_adapter = dh.matmul(&a)?;
                let through_adapter = match &self.mask {
                    Some(m) => (through_adapter * m)?,
                    None => through_adapter,
                };
                Some((g.matmul(&self.weight.decoded()?)? + through_adapter)?)
            }
        };
        Ok([dx, Some(da), Some(db)])
    }
}
