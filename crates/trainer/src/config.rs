//! The trainer's settings as every rank reads them, once `TrainerBuilder` has checked them.

use crate::{ModelCheckpoint, Preemption, TrainerError};
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

impl Default for Config {
    /// The trainer's defaults: one epoch, seed 0, metrics under `runs/run`, the default
    /// loggers, bars and summary on, no clipping or accumulation, errors on inf or NaN.
    fn default() -> Self {
        Config {
            max_steps: None,
            max_epochs: None,
            seed: 0,
            log_dir: Some(PathBuf::from("runs")),
            run_name: "run".into(),
            val_check_interval: None,
            progress: true,
            model_summary: true,
            gradient_clip_val: None,
            accumulate_grad_batches: 1,
            checkpoint: None,
            error_on_unused_parameters: false,
            overlap_comm: true,
            preemption: None,
            on_nonfinite: OnNonFinite::Error,
            loggers: crate::Logger::DEFAULT.to_vec(),
            run_options: Vec::new(),
            mlflow: None,
        }
    }
}

impl Config {
    /// The options that need no world or strategy to check: counts, the clip value, the
    /// checkpoint attachments' names, the run's name.
    pub(crate) fn check(&self) -> Result<(), TrainerError> {
        if self.accumulate_grad_batches == 0 {
            return Err(TrainerError::config(
                "accumulate_grad_batches",
                "must be at least 1, got 0",
            ));
        }
        if let Some(c) = self
            .gradient_clip_val
            .filter(|c| !(c.is_finite() && *c > 0.0))
        {
            return Err(TrainerError::config(
                "gradient_clip_val",
                format!("must be a positive number, got {c}"),
            ));
        }
        if self.val_check_interval == Some(0) {
            return Err(TrainerError::config(
                "val_check_interval",
                "must be at least 1 step, got 0",
            ));
        }
        if self.max_steps == Some(0) || self.max_epochs == Some(0) {
            return Err(TrainerError::config(
                "max_steps/max_epochs",
                "must be at least 1, got 0",
            ));
        }
        if let Some(mc) = &self.checkpoint {
            let reserved = |n: &str| {
                n == crate::checkpoint::MANIFEST_FILE
                    || n == crate::checkpoint::LAST_FILE
                    || n.starts_with("rank-")
            };
            if let Some((name, _)) = mc.attachments().iter().find(|(n, _)| {
                n.is_empty() || n.contains(['/', '\\']) || n.starts_with('.') || reserved(n)
            }) {
                return Err(TrainerError::config(
                    "checkpoint attachment",
                    format!(
                        "'{name}' must be a plain file name other than the checkpoint's own files"
                    ),
                ));
            }
        }
        if self.run_name.is_empty() || self.run_name.contains(['/', '\\']) {
            return Err(TrainerError::config(
                "run name",
                format!(
                    "'{}' must be a non-empty name without path separators",
                    self.run_name
                ),
            ));
        }
        Ok(())
    }
}
