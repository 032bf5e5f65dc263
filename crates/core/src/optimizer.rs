//! What `configure_optimizers` returns: an optimizer's update rule with its
//! hyper-parameters, and its learning-rate schedule.
//!
//! The strategy builds the optimizer itself, over whatever buffers it holds (full
//! parameters, flat shards), so a module names the optimizer but never owns its state.

use crate::LrSchedule;

/// An optimizer and its learning-rate schedule:
/// `OptimizerConfig::adamw(3e-3).with_schedule(LrSchedule::warmup_cosine(40, 400, 0.1))`.
#[derive(Debug, Clone, PartialEq)]
pub struct OptimizerConfig {
    /// The update rule and its hyper-parameters (`lr` is the base rate).
    pub algorithm: Algorithm,
    /// The rate of each step as a factor of the base rate (default: constant).
    pub schedule: LrSchedule,
}

impl From<Algorithm> for OptimizerConfig {
    fn from(algorithm: Algorithm) -> Self {
        OptimizerConfig {
            algorithm,
            schedule: LrSchedule::constant(),
        }
    }
}

impl OptimizerConfig {
    /// AdamW with `lr` and PyTorch's defaults (betas 0.9/0.999, eps 1e-8, weight decay
    /// 0.01), at a constant rate.
    pub fn adamw(lr: f64) -> Self {
        Algorithm::adamw(lr).into()
    }

    /// Plain SGD with `lr`, no momentum, no weight decay, at a constant rate.
    pub fn sgd(lr: f64) -> Self {
        Algorithm::sgd(lr).into()
    }

    /// The same optimizer stepped along `schedule`.
    pub fn with_schedule(mut self, schedule: LrSchedule) -> Self {
        self.schedule = schedule;
        self
    }

    /// The optimizer's name (`adamw`, `sgd`).
    pub fn kind(&self) -> &'static str {
        self.algorithm.kind()
    }

    /// The hyper-parameters by name (booleans as 0 or 1), as a checkpoint records them.
    pub fn hyper_parameters(&self) -> Vec<(&'static str, f64)> {
        self.algorithm.hyper_parameters()
    }

    /// The base learning rate.
    pub fn lr(&self) -> f64 {
        self.algorithm.lr()
    }

    /// The learning rate of optimizer step `step` (from 0): the base rate times the
    /// schedule's factor.
    pub fn lr_at(&self, step: usize) -> f64 {
        self.lr() * self.schedule.factor(step)
    }
}

/// An optimizer's update rule and its hyper-parameters, with PyTorch's defaults.
#[derive(Debug, Clone, PartialEq)]
pub enum Algorithm {
    /// AdamW as in `torch.optim.AdamW`: decoupled weight decay, bias correction.
    AdamW {
        /// Learning rate.
        lr: f64,
        /// First-moment decay.
        beta1: f64,
        /// Second-moment decay.
        beta2: f64,
        /// Added to the denominator.
        eps: f64,
        /// Decoupled weight decay.
        weight_decay: f64,
    },
    /// SGD as in `torch.optim.SGD`: momentum, dampening 0, optional nesterov, L2 weight decay.
    Sgd {
        /// Learning rate.
        lr: f64,
        /// Momentum factor (0 disables the buffer).
        momentum: f64,
        /// Nesterov momentum.
        nesterov: bool,
        /// L2 penalty added to the gradient.
        weight_decay: f64,
    },
}

impl Algorithm {
    /// AdamW with `lr` and PyTorch's defaults (betas 0.9/0.999, eps 1e-8, weight decay 0.01).
    pub fn adamw(lr: f64) -> Self {
        Algorithm::AdamW {
            lr,
            beta1: 0.9,
            beta2: 0.999,
            eps: 1e-8,
            weight_decay: 0.01,
        }
    }

    /// Plain SGD with `lr`, no momentum, no weight decay.
    pub fn sgd(lr: f64) -> Self {
        Algorithm::Sgd {
            lr,
            momentum: 0.0,
            nesterov: false,
            weight_decay: 0.0,
        }
    }

    /// The optimizer's name (`adamw`, `sgd`).
    pub fn kind(&self) -> &'static str {
        match self {
            Algorithm::AdamW { .. } => "adamw",
            Algorithm::Sgd { .. } => "sgd",
        }
    }

    /// The hyper-parameters by name (booleans as 0 or 1), as a checkpoint records them.
    pub fn hyper_parameters(&self) -> Vec<(&'static str, f64)> {
        match *self {
            Algorithm::AdamW {
                lr,
                beta1,
                beta2,
                eps,
                weight_decay,
            } => vec![
                ("lr", lr),
                ("beta1", beta1),
                ("beta2", beta2),
                ("eps", eps),
                ("weight_decay", weight_decay),
            ],
            Algorithm::Sgd {
                lr,
                momentum,
                nesterov,
                weight_decay,
            } => vec![
                ("lr", lr),
                ("momentum", momentum),
                ("nesterov", f64::from(u8::from(nesterov))),
                ("weight_decay", weight_decay),
            ],
        }
    }

    /// The learning rate.
    pub fn lr(&self) -> f64 {
        match self {
            Algorithm::AdamW { lr, .. } | Algorithm::Sgd { lr, .. } => *lr,
        }
    }
}
