//! AdamW with decoupled weight decay and bias correction, as torch.optim.AdamW computes it.

use super::fused_adamw::{self, AdamWConstants};
use super::{chunks, flat_in_place};
use candle_core::{Result, Tensor, Var};

/// AdamW state and hyper-parameters.
#[derive(Debug, Clone)]
pub struct AdamW {
    /// Learning rate.
    pub lr: f64,
    /// First-moment decay.
    pub beta1: f64,
    /// Second-moment decay.
    pub beta2: f64,
    /// Denominator term.
    pub eps: f64,
    /// Decoupled weight decay.
    pub weight_decay: f64,
    step: usize,
    /// First and second moments per parameter, created at the first step.
    moments: Vec<(Tensor, Tensor)>,
}

impl AdamW {
    /// Fresh AdamW state.
    pub fn new(lr: f64, beta1: f64, beta2: f64, eps: f64, weight_decay: f64) -> Self {
        AdamW {
            lr,
            beta1,
            beta2,
            eps,
            weight_decay,
            step: 0,
            moments: Vec::new(),
        }
    }

    /// Steps taken so far.
    pub fn step_count(&self) -> usize {
        self.step
    }

    /// The first and second moments, per parameter (empty before the first step).
    pub fn moments(&self) -> &[(Tensor, Tensor)] {
        &self.moments
    }

    /// Replaces the state (for restoring a checkpoint).
    pub fn set_state(&mut self, step: usize, moments: Vec<(Tensor, Tensor)>) {
        self.step = step;
        self.moments = moments;
    }

    pub(super) fn state_bytes(&self) -> usize {
        self.moments
            .iter()
            .map(|(m, v)| super::bytes(m) + super::bytes(v))
            .sum()
    }

    /// One update of every parameter, in place, a chunk at a time.
    pub fn step(&mut self, params: &[Var], grads: &[Tensor]) -> Result<()> {
        if self.moments.is_empty() {
            self.moments = params
                .iter()
                .map(|p| Ok((p.zeros_like()?, p.zeros_like()?)))
                .collect::<Result<_>>()?;
        }
        self.step += 1;
        let t = self.step as i32;
        let step_size = self.lr / (1.0 - self.beta1.powi(t));
        let sqrt_bc2 = (1.0 - self.beta2.powi(t)).sqrt();
        let constants = AdamWConstants {
            decay: (self.weight_decay != 0.0).then_some(1.0 - self.lr * self.weight_decay),
            beta1: self.beta1,
            beta2: self.beta2,
            step_size,
            inv_sqrt_bc2: 1.0 / sqrt_bc2,
            eps: self.eps,
        };
        for ((p, g), (m, v)) in params.iter().zip(grads).zip(self.moments.iter_mut()) {
            let (pf, gf) = (flat_in_place(p, "a parameter")?, g.flatten_all()?);
            let (mf, vf) = (flat_in_place(m, "a moment")?, flat_in_place(v, "a moment")?);
            if fused_adamw::applies(&[&pf, &gf, &mf, &vf]) {
                fused_adamw::step(&pf, &gf, &mf, &vf, &constants)?;
                continue;
            }
            for (start, n) in chunks(pf.elem_count()) {
                let (p, g) = (pf.narrow(0, start, n)?, gf.narrow(0, start, n)?);
                let theta = if self.weight_decay != 0.0 {
                    p.affine(1.0 - self.lr * self.weight_decay, 0.0)?
                } else {
                    p
                };
                let m = (mf.narrow(0, start, n)?.affine(self.beta1, 0.0)?
                    + g.affine(1.0 - self.beta1, 0.0)?)?;
                let v = (vf.narrow(0, start, n)?.affine(self.beta2, 0.0)?
                    + g.sqr()?.affine(1.0 - self.beta2, 0.0)?)?;
                let denom = v.sqrt()?.affine(1.0 / sqrt_bc2, self.eps)?;
                let update = (m.affine(step_size, 0.0)? / denom)?;
                mf.slice_set(&m, 0, start)?;
                vf.slice_set(&v, 0, start)?;
                pf.slice_set(&(theta - update)?, 0, start)?;
            }
        }
        Ok(())
    }
}
