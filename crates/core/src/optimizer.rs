//! What `configure_optimizers` returns: an optimizer kind and its hyper-parameters.
//!
//! The strategy builds the optimizer itself, over whatever buffers it holds (full
//! parameters, flat shards), so a module names the optimizer but never owns its state.

/// An optimizer and its hyper-parameters, with PyTorch's defaults.
#[derive(Debug, Clone, PartialEq)]
pub enum OptimizerConfig {
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

impl OptimizerConfig {
    /// AdamW with `lr` and PyTorch's defaults (betas 0.9/0.999, eps 1e-8, weight decay 0.01).
    pub fn adamw(lr: f64) -> Self {
        OptimizerConfig::AdamW {
            lr,
            beta1: 0.9,
            beta2: 0.999,
            eps: 1e-8,
            weight_decay: 0.01,
        }
    }

    /// Plain SGD with `lr`, no momentum, no weight decay.
    pub fn sgd(lr: f64) -> Self {
        OptimizerConfig::Sgd {
            lr,
            momentum: 0.0,
            nesterov: false,
            weight_decay: 0.0,
        }
    }

    /// The optimizer's name (`adamw`, `sgd`).
    pub fn kind(&self) -> &'static str {
        match self {
            OptimizerConfig::AdamW { .. } => "adamw",
            OptimizerConfig::Sgd { .. } => "sgd",
        }
    }

    /// The hyper-parameters by name (booleans as 0 or 1), as a checkpoint records them.
    pub fn hyper_parameters(&self) -> Vec<(&'static str, f64)> {
        match *self {
            OptimizerConfig::AdamW {
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
            OptimizerConfig::Sgd {
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
            OptimizerConfig::AdamW { lr, .. } | OptimizerConfig::Sgd { lr, .. } => *lr,
        }
    }
}
