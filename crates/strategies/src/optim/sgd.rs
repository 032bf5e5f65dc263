//! SGD with momentum (dampening 0), nesterov and L2 weight decay, as torch.optim.SGD computes it.

use super::{chunks, flat_in_place};
use candle_core::{Result, Tensor, Var};

/// SGD state and hyper-parameters.
#[derive(Debug, Clone)]
pub struct Sgd {
    /// Learning rate.
    pub lr: f64,
    /// Momentum factor; 0 keeps no buffer.
    pub momentum: f64,
    /// Nesterov momentum.
    pub nesterov: bool,
    /// L2 penalty added to the gradient.
    pub weight_decay: f64,
    step: usize,
    buffers: Vec<Tensor>,
}

impl Sgd {
    /// Fresh SGD state.
    pub fn new(lr: f64, momentum: f64, nesterov: bool, weight_decay: f64) -> Self {
        Sgd {
            lr,
            momentum,
            nesterov,
            weight_decay,
            step: 0,
            buffers: Vec::new(),
        }
    }

    /// Steps taken so far.
    pub fn step_count(&self) -> usize {
        self.step
    }

    /// The momentum buffers, per parameter (empty before the first step or without momentum).
    pub fn momentum_buffers(&self) -> &[Tensor] {
        &self.buffers
    }

    /// Replaces the state (for restoring a checkpoint).
    pub fn set_state(&mut self, step: usize, buffers: Vec<Tensor>) {
        self.step = step;
        self.buffers = buffers;
    }

    pub(super) fn state_bytes(&self) -> usize {
        self.buffers.iter().map(super::bytes).sum()
    }

    /// One update of every parameter, in place, a chunk at a time.
    pub fn step(&mut self, params: &[Var], grads: &[Tensor]) -> Result<()> {
        let first = self.buffers.is_empty();
        for (i, (p, g)) in params.iter().zip(grads).enumerate() {
            let (pf, gf) = (flat_in_place(p, "a parameter")?, g.flatten_all()?);
            if self.momentum != 0.0 && first {
                self.buffers.push(p.zeros_like()?);
            }
            let bf = match self.buffers.get(i) {
                Some(b) if self.momentum != 0.0 => Some(flat_in_place(b, "a momentum buffer")?),
                _ => None,
            };
            for (start, n) in chunks(pf.elem_count()) {
                let (p, g) = (pf.narrow(0, start, n)?, gf.narrow(0, start, n)?);
                let mut d = if self.weight_decay != 0.0 {
                    (g + p.affine(self.weight_decay, 0.0)?)?
                } else {
                    g
                };
                if let Some(bf) = &bf {
                    let buf = if first {
                        d.copy()?
                    } else {
                        (bf.narrow(0, start, n)?.affine(self.momentum, 0.0)? + &d)?
                    };
                    d = if self.nesterov {
                        (d + buf.affine(self.momentum, 0.0)?)?
                    } else {
                        buf.clone()
                    };
                    bf.slice_set(&buf, 0, start)?;
                }
                pf.slice_set(&(p - d.affine(self.lr, 0.0)?)?, 0, start)?;
            }
        }
        self.step += 1;
        Ok(())
    }
}
