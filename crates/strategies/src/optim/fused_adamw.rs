//! AdamW's update of a CPU f32 buffer in three in-place passes (first moment, second moment,
//! parameter), allocating nothing. Each element gets exactly the arithmetic of the chunked
//! tensor path in `adamw.rs` (Candle's `affine` is `v * mul + add` in f32), so both paths
//! give the same bits.

use candle_core::{CpuStorage, DType, InplaceOp2, InplaceOp3, Layout, Result, Tensor};

/// The update's constants, as f32 the way Candle's `affine` casts them.
pub(super) struct AdamWConstants {
    /// `1 - lr * weight_decay`, or `None` without weight decay.
    pub(super) decay: Option<f64>,
    pub(super) beta1: f64,
    pub(super) beta2: f64,
    pub(super) step_size: f64,
    pub(super) inv_sqrt_bc2: f64,
    pub(super) eps: f64,
}

/// Whether the fused passes take these buffers: contiguous f32 on the CPU.
pub(super) fn applies(tensors: &[&Tensor]) -> bool {
    tensors
        .iter()
        .all(|t| t.device().is_cpu() && t.dtype() == DType::F32 && t.is_contiguous())
}

/// Updates `p`, `m` and `v` in place from `g` (all flat, of one length).
pub(super) fn step(
    p: &Tensor,
    g: &Tensor,
    m: &Tensor,
    v: &Tensor,
    c: &AdamWConstants,
) -> Result<()> {
    m.inplace_op2(
        g,
        &Moment {
            beta: c.beta1,
            square: false,
        },
    )?;
    v.inplace_op2(
        g,
        &Moment {
            beta: c.beta2,
            square: true,
        },
    )?;
    p.inplace_op3(m, v, c)
}

fn slice<'a>(s: &'a CpuStorage, l: &Layout) -> Result<&'a [f32]> {
    let (a, b) = l
        .contiguous_offsets()
        .ok_or_else(|| candle_core::Error::Msg("adamw: buffers must be contiguous".into()))?;
    Ok(&s.as_slice::<f32>()?[a..b])
}

fn slice_mut<'a>(s: &'a mut CpuStorage, l: &Layout) -> Result<&'a mut [f32]> {
    let (a, b) = l
        .contiguous_offsets()
        .ok_or_else(|| candle_core::Error::Msg("adamw: buffers must be contiguous".into()))?;
    match s {
        CpuStorage::F32(v) => Ok(&mut v[a..b]),
        _ => candle_core::bail!("adamw: f32 buffers only"),
    }
}

/// `m = m * beta + g * (1 - beta)`, or with `square`, `v = v * beta + g² * (1 - beta)`.
struct Moment {
    beta: f64,
    square: bool,
}

impl InplaceOp2 for Moment {
    fn name(&self) -> &'static str {
        "wick-adamw-moment"
    }

    fn cpu_fwd(
        &self,
        ms: &mut CpuStorage,
        ml: &Layout,
        gs: &CpuStorage,
        gl: &Layout,
    ) -> Result<()> {
        let (beta, rest) = (self.beta as f32, (1.0 - self.beta) as f32);
        let g = slice(gs, gl)?;
        for (m, &g) in slice_mut(ms, ml)?.iter_mut().zip(g) {
            let g = if self.square { g * g } else { g };
            *m = (*m * beta + 0.0) + (g * rest + 0.0);
        }
        Ok(())
    }
}

/// `p = p * decay - (m * step_size) / (sqrt(v) * inv_sqrt_bc2 + eps)`.
impl InplaceOp3 for AdamWConstants {
    fn name(&self) -> &'static str {
        "wick-adamw-param"
    }

    fn cpu_fwd(
        &self,
        ps: &mut CpuStorage,
        pl: &Layout,
        ms: &CpuStorage,
        ml: &Layout,
        vs: &CpuStorage,
        vl: &Layout,
    ) -> Result<()> {
        let (m, v) = (slice(ms, ml)?, slice(vs, vl)?);
        let decay = self.decay.map(|d| d as f32);
        let (step_size, inv, eps) = (
            self.step_size as f32,
            self.inv_sqrt_bc2 as f32,
            self.eps as f32,
        );
        for ((p, &m), &v) in slice_mut(ps, pl)?.iter_mut().zip(m).zip(v) {
            let theta = match decay {
                Some(d) => *p * d + 0.0,
                None => *p,
            };
            *p = theta - (m * step_size + 0.0) / (v.sqrt() * inv + eps);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::Device;

    #[test]
    fn the_same_bits_as_candles_tensor_ops() {
        let values = |k: f32| -> Tensor {
            let v: Vec<f32> = (0..1000).map(|i| (i as f32 * k).sin() * 3.0).collect();
            Tensor::new(v, &Device::Cpu).unwrap()
        };
        let (p, g, m) = (values(0.37), values(1.3), values(0.11));
        let v = values(0.71).abs().unwrap();
        let c = AdamWConstants {
            decay: Some(1.0 - 1e-3 * 0.01),
            beta1: 0.9,
            beta2: 0.95,
            step_size: 1e-3 / (1.0 - 0.9f64.powi(3)),
            inv_sqrt_bc2: 1.0 / (1.0 - 0.95f64.powi(3)).sqrt(),
            eps: 1e-8,
        };
        // adamw.rs's tensor path, op by op.
        let theta = p.affine(c.decay.unwrap(), 0.0).unwrap();
        let m2 = (m.affine(c.beta1, 0.0).unwrap() + g.affine(1.0 - c.beta1, 0.0).unwrap()).unwrap();
        let v2 = (v.affine(c.beta2, 0.0).unwrap()
            + g.sqr().unwrap().affine(1.0 - c.beta2, 0.0).unwrap())
        .unwrap();
        let denom = v2.sqrt().unwrap().affine(c.inv_sqrt_bc2, c.eps).unwrap();
        let p2 = (theta - (m2.affine(c.step_size, 0.0).unwrap() / denom).unwrap()).unwrap();
        let (pf, mf, vf) = (p.copy().unwrap(), m.copy().unwrap(), v.copy().unwrap());
        step(&pf, &g, &mf, &vf, &c).unwrap();
        let bits = |t: &Tensor| -> Vec<u32> {
            t.to_vec1::<f32>()
                .unwrap()
                .iter()
                .map(|x| x.to_bits())
                .collect()
        };
        assert_eq!(bits(&mf), bits(&m2));
        assert_eq!(bits(&vf), bits(&v2));
        assert_eq!(bits(&pf), bits(&p2));
    }
}
