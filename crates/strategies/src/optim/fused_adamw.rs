//! AdamW's update of CPU f32 buffers in one pass over the parameter, its gradient and both
//! moments, in parallel chunks on the calling thread's rayon pool, in the widest SIMD the
//! CPU has, allocating nothing. Each element gets exactly the arithmetic of the chunked
//! tensor path in `adamw.rs` (Candle's `affine` is `v * mul + add` in f32), so both paths
//! give the same bits on any number of threads and any CPU.

use candle_core::{CpuStorage, DType, InplaceOp1, InplaceOp2, Layout, Result, Tensor};
use rayon::prelude::*;
use std::cell::{Cell, RefCell};

use crate::isa::{in_each_isa, Isa};

/// Elements a parallel task updates: enough to outweigh handing the task out.
const CHUNK: usize = 16 * 1024;

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

/// Whether the fused pass takes these buffers: contiguous f32 on the CPU.
pub(super) fn applies(tensors: &[&Tensor]) -> bool {
    tensors
        .iter()
        .all(|t| t.device().is_cpu() && t.dtype() == DType::F32 && t.is_contiguous())
}

/// Updates `p`, `m` and `v` in place from `g` (all flat, of one length, four different
/// buffers).
pub(super) fn step(
    p: &Tensor,
    g: &Tensor,
    m: &Tensor,
    v: &Tensor,
    c: &AdamWConstants,
) -> Result<()> {
    // Candle lends a storage mutably only inside an in-place op, under its lock: the
    // parameter's and the first moment's ops hold their slices while the second moment's op,
    // innermost, reads the gradient and runs the pass.
    with_f32_mut(p, |p| {
        with_f32_mut(m, |m| {
            v.inplace_op2(
                g,
                &Update {
                    p: RefCell::new(p),
                    m: RefCell::new(m),
                    c,
                },
            )
        })
    })
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

/// Runs `f` on `t`'s elements, mutably, inside an in-place op on `t`.
fn with_f32_mut(t: &Tensor, f: impl FnOnce(&mut [f32]) -> Result<()>) -> Result<()> {
    t.inplace_op1(&Mutably(Cell::new(Some(f))))
}

/// [`with_f32_mut`]'s op: the closure, run once.
struct Mutably<F>(Cell<Option<F>>);

impl<F: FnOnce(&mut [f32]) -> Result<()>> InplaceOp1 for Mutably<F> {
    fn name(&self) -> &'static str {
        "wick-adamw-buffer"
    }

    fn cpu_fwd(&self, s: &mut CpuStorage, l: &Layout) -> Result<()> {
        match self.0.take() {
            Some(f) => f(slice_mut(s, l)?),
            None => candle_core::bail!("adamw: a buffer's op ran twice"),
        }
    }
}

/// The pass, as an in-place op on the second moment reading the gradient, with the
/// parameter and the first moment lent by the ops around it.
struct Update<'a> {
    p: RefCell<&'a mut [f32]>,
    m: RefCell<&'a mut [f32]>,
    c: &'a AdamWConstants,
}

impl InplaceOp2 for Update<'_> {
    fn name(&self) -> &'static str {
        "wick-adamw"
    }

    fn cpu_fwd(
        &self,
        vs: &mut CpuStorage,
        vl: &Layout,
        gs: &CpuStorage,
        gl: &Layout,
    ) -> Result<()> {
        let (mut p, mut m) = (self.p.borrow_mut(), self.m.borrow_mut());
        let (v, g) = (slice_mut(vs, vl)?, slice(gs, gl)?);
        let n = p.len();
        if m.len() != n || v.len() != n || g.len() != n {
            candle_core::bail!(
                "adamw: {n} parameters with {} gradients and moments of {} and {}",
                g.len(),
                m.len(),
                v.len()
            )
        }
        let c = self.c;
        let k = Coefficients {
            b1: c.beta1 as f32,
            rest1: (1.0 - c.beta1) as f32,
            b2: c.beta2 as f32,
            rest2: (1.0 - c.beta2) as f32,
            decay: c.decay.map(|d| d as f32),
            step_size: c.step_size as f32,
            inv: c.inv_sqrt_bc2 as f32,
            eps: c.eps as f32,
        };
        let isa = Isa::widest();
        p.par_chunks_mut(CHUNK)
            .zip(m.par_chunks_mut(CHUNK))
            .zip(v.par_chunks_mut(CHUNK))
            .zip(g.par_chunks(CHUNK))
            .for_each(|(((p, m), v), g)| update_chunk(isa, Chunk { p, m, v, g }, &k));
        Ok(())
    }
}

/// [`AdamWConstants`] as the f32 factors the update multiplies by.
struct Coefficients {
    b1: f32,
    rest1: f32,
    b2: f32,
    rest2: f32,
    decay: Option<f32>,
    step_size: f32,
    inv: f32,
    eps: f32,
}

/// One parallel task's slices of the parameter, its moments and its gradient.
struct Chunk<'a> {
    p: &'a mut [f32],
    m: &'a mut [f32],
    v: &'a mut [f32],
    g: &'a [f32],
}

/// The update, element by element.
#[inline(always)]
fn update(c: Chunk<'_>, k: &Coefficients) {
    for (((p, m), v), &g) in c.p.iter_mut().zip(c.m).zip(c.v).zip(c.g) {
        *m = (*m * k.b1 + 0.0) + (g * k.rest1 + 0.0);
        *v = (*v * k.b2 + 0.0) + (g * g * k.rest2 + 0.0);
        let theta = match k.decay {
            Some(d) => *p * d + 0.0,
            None => *p,
        };
        *p = theta - (*m * k.step_size + 0.0) / (v.sqrt() * k.inv + k.eps);
    }
}

in_each_isa! {
    /// One chunk's update in version `isa`, or in the baseline where this CPU cannot run
    /// it. Every version gives the same bits: square root and division are correctly
    /// rounded at any width.
    fn update_chunk(c: Chunk<'_>, k: &Coefficients) = update
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::Device;

    #[test]
    fn the_same_bits_as_candles_tensor_ops() {
        let values = |k: f32| -> Tensor {
            // Three parallel chunks and a part of one.
            let v: Vec<f32> = (0..2 * CHUNK + 1000)
                .map(|i| (i as f32 * k).sin() * 3.0)
                .collect();
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

    #[test]
    fn every_version_this_cpu_runs_gives_the_baselines_bits() {
        let values =
            |k: f32| -> Vec<f32> { (0..1001).map(|i| (i as f32 * k).sin() * 3.0).collect() };
        let g = values(1.3);
        for decay in [None, Some(1.0 - 1e-3 * 0.01)] {
            let k = Coefficients {
                b1: 0.9,
                rest1: 0.1,
                b2: 0.95,
                rest2: 0.05,
                decay,
                step_size: 1e-3,
                inv: 1.2,
                eps: 1e-8,
            };
            let run = |isa: Isa| {
                let (mut p, mut m) = (values(0.37), values(0.11));
                let mut v: Vec<f32> = values(0.71).iter().map(|x| x.abs()).collect();
                let c = Chunk {
                    p: &mut p,
                    m: &mut m,
                    v: &mut v,
                    g: &g,
                };
                update_chunk(isa, c, &k);
                [p, m, v].map(|xs| xs.iter().map(|x| x.to_bits()).collect::<Vec<_>>())
            };
            let baseline = run(Isa::Baseline);
            for isa in Isa::ALL.into_iter().filter(|isa| isa.runs_here()) {
                assert_eq!(run(isa), baseline, "{isa:?}, decay {decay:?}");
            }
        }
    }
}
