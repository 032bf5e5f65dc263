//! wick's optimizers: the update rules of torch.optim.AdamW and torch.optim.SGD over a list
//! of parameter buffers (whole parameters under ddp, flat shards under ZeRO), with state that
//! can be read and written for checkpoints.

mod adamw;
mod sgd;

pub use adamw::AdamW;
pub use sgd::Sgd;

use candle_core::{Result, Tensor, Var};
use wick_core::OptimizerConfig;

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
        match *config {
            OptimizerConfig::AdamW {
                lr,
                beta1,
                beta2,
                eps,
                weight_decay,
            } => Optimizer::AdamW(AdamW::new(lr, beta1, beta2, eps, weight_decay)),
            OptimizerConfig::Sgd {
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
        match self {
            Optimizer::AdamW(o) => o.step(params, grads),
            Optimizer::Sgd(o) => o.step(params, grads),
        }
    }

    /// Steps taken so far.
    pub fn step_count(&self) -> usize {
        match self {
            Optimizer::AdamW(o) => o.step_count(),
            Optimizer::Sgd(o) => o.step_count(),
        }
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
