//! wick's optimizers: the update rules of torch.optim.AdamW and torch.optim.SGD over a list
//! of parameter buffers (whole parameters under ddp, flat shards under ZeRO), with state that
//! can be read and written for checkpoints.

mod adamw;
mod fused_adamw;
mod sgd;

pub use adamw::AdamW;
pub use sgd::Sgd;

use candle_core::{Result, Tensor, Var};
use wick_core::{Algorithm, OptimizerConfig};

/// An optimizer built from an [`OptimizerConfig`].
#[derive(Debug)]
pub enum Optimizer {
    /// AdamW.
    AdamW(AdamW),
    /// SGD.
    Sgd(Sgd),
}

impl Optimizer {
    /// The optimizer `config` names, with fresh state.
    pub fn new(config: &OptimizerConfig) -> Self {
        match config.algorithm {
            Algorithm::AdamW {
                lr,
                beta1,
                beta2,
                eps,
                weight_decay,
            } => Optimizer::AdamW(AdamW::new(lr, beta1, beta2, eps, weight_decay)),
            Algorithm::Sgd {
                lr,
                momentum,
                nesterov,
                weight_decay,
            } => Optimizer::Sgd(Sgd::new(lr, momentum, nesterov, weight_decay)),
        }
    }

    /// Updates `params` in place from `grads` (same order, same shapes).
    pub fn step(&mut self, params: &[Var], grads: &[Tensor]) -> Result<()> {
        if params.len() != grads.len() {
            candle_core::bail!(
                "optimizer step: {} parameters but {} gradients",
                params.len(),
                grads.len()
            )
        }
        // Profiled as one class, whatever ops it runs (the vendored candle-core's profiler).
        #[cfg(candle_op_profile)]
        let _profiled = candle_core::op_profile::scope("optimizer");
        match self {
            Optimizer::AdamW(o) => o.step(params, grads),
            Optimizer::Sgd(o) => o.step(params, grads),
        }
    }

    /// Sets the learning rate of the next steps (a schedule's rate for this step).
    pub fn set_lr(&mut self, lr: f64) {
        match self {
            Optimizer::AdamW(o) => o.lr = lr,
            Optimizer::Sgd(o) => o.lr = lr,
        }
    }

    /// Steps taken so far.
    pub fn step_count(&self) -> usize {
        match self {
            Optimizer::AdamW(o) => o.step_count(),
            Optimizer::Sgd(o) => o.step_count(),
        }
    }

    /// The state kinds this optimizer keeps per parameter, in torch's names.
    pub fn state_kinds(&self) -> &'static [&'static str] {
        match self {
            Optimizer::AdamW(_) => &["exp_avg", "exp_avg_sq"],
            Optimizer::Sgd(o) if o.momentum != 0.0 => &["momentum_buffer"],
            Optimizer::Sgd(_) => &[],
        }
    }

    /// The state per kind (in [`Optimizer::state_kinds`] order), one tensor per parameter;
    /// empty before the first step.
    pub fn state(&self) -> Vec<(&'static str, Vec<Tensor>)> {
        let per_kind: Vec<Vec<Tensor>> = match self {
            Optimizer::AdamW(o) if !o.moments().is_empty() => {
                let (m, v) = o.moments().iter().cloned().unzip();
                vec![m, v]
            }
            Optimizer::Sgd(o) if !o.momentum_buffers().is_empty() => {
                vec![o.momentum_buffers().to_vec()]
            }
            _ => Vec::new(),
        };
        self.state_kinds().iter().copied().zip(per_kind).collect()
    }

    /// Replaces the step count and the state, given per kind in
    /// [`Optimizer::state_kinds`] order (or none: the state of an optimizer before its first
    /// step). The tensors are updated in place by later steps.
    pub fn set_state(&mut self, step: usize, mut state: Vec<Vec<Tensor>>) -> Result<()> {
        let kinds = self.state_kinds();
        if !state.is_empty() && state.len() != kinds.len() {
            candle_core::bail!(
                "optimizer state: expected {} kinds ({kinds:?}), got {}",
                kinds.len(),
                state.len()
            )
        }
        match self {
            Optimizer::AdamW(o) => {
                let moments = match (state.pop(), state.pop()) {
                    (Some(v), Some(m)) => m.into_iter().zip(v).collect(),
                    _ => Vec::new(),
                };
                o.set_state(step, moments);
            }
            Optimizer::Sgd(o) => o.set_state(step, state.pop().unwrap_or_default()),
        }
        Ok(())
    }

    /// Bytes of optimizer state held.
    pub fn state_bytes(&self) -> usize {
        match self {
            Optimizer::AdamW(o) => o.state_bytes(),
            Optimizer::Sgd(o) => o.state_bytes(),
        }
    }
}

/// Elements updated at a time: the step's temporaries are a few chunks, not a few copies of
/// the whole (possibly multi-gigabyte) parameter or shard.
const CHUNK: usize = 1 << 16;

/// `(start, len)` of the consecutive chunks covering `numel` elements.
fn chunks(numel: usize) -> impl Iterator<Item = (usize, usize)> {
    (0..numel)
        .step_by(CHUNK)
        .map(move |start| (start, CHUNK.min(numel - start)))
}

/// A flat view sharing `t`'s storage, so that `slice_set` on it updates `t` in place.
fn flat_in_place(t: &Tensor, what: &str) -> Result<Tensor> {
    if !t.is_contiguous() {
        candle_core::bail!("optimizer step: {what} must be contiguous to be updated in place")
    }
    t.flatten_all()
}

fn bytes(t: &Tensor) -> usize {
    t.elem_count() * t.dtype().size_in_bytes()
}
