//! The trainer's settings as every rank reads them, once `TrainerBuilder` has checked them.

use crate::{ModelCheckpoint, Preemption};
use std::path::PathBuf;
use wick_core::OnNonFinite;

/// Settings every rank reads.
pub(crate) struct Config {
    pub(crate) max_steps: Option<usize>,
    pub(crate) max_epochs: Option<usize>,
    pub(crate) seed: u64,
    /// Where runs are logged (`None`: no metrics file) and this run's name under it.
    pub(crate) log_dir: Option<PathBuf>,
    pub(crate) run_name: String,
    pub(crate) val_check_interval: Option<usize>,
    pub(crate) progress: bool,
    pub(crate) model_summary: bool,
    pub(crate) gradient_clip_val: Option<f64>,
    pub(crate) accumulate_grad_batches: usize,
    pub(crate) checkpoint: Option<ModelCheckpoint>,
    pub(crate) error_on_unused_parameters: bool,
    pub(crate) overlap_comm: bool,
    pub(crate) preemption: Option<Preemption>,
    pub(crate) on_nonfinite: OnNonFinite,
    /// The loggers rank 0 writes the steps to.
    pub(crate) loggers: Vec<crate::Logger>,
    /// The run's options, (name, value), as the loggers record them.
    pub(crate) run_options: Vec<(String, String)>,
    /// Where the mlflow logger goes.
    pub(crate) mlflow: Option<crate::MlflowTarget>,
}
