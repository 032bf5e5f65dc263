//! A fit of either model the program trains (the character GPT or a Hugging Face model):
//! the trainer that `wick fit`'s options build, and what the run reports.

use crate::cli::FitArgs;
use anyhow::Context;
use std::sync::{Arc, Mutex};
use wick_accelerator::{cuda_device_count, DeviceKind, LaunchEnv};
use wick_core::{lock, Callback, RunState};
use wick_trainer::{
    Attached, DataLoader, LearningRateMonitor, LogDestination, ModelCheckpoint, Preemption, Trainer,
};

/// `--resume auto`: the newest checkpoint under `--checkpoint-dir` when it has one, and a
/// fresh start otherwise.
pub const RESUME_AUTO: &str = "auto";

/// The first and last training loss (averaged over ranks, so every rank records the same).
#[derive(Clone, Default)]
struct LossHistory(Arc<Mutex<Option<(f64, f64)>>>);

impl Callback for LossHistory {
    fn on_train_batch_end(&mut self, state: &RunState) -> candle_core::Result<()> {
        if let Some(&loss) = state.metrics.get("train_loss") {
            let mut h = lock(&self.0);
            *h = Some((h.map_or(loss, |(first, _)| first), loss));
        }
        Ok(())
    }
}

/// A trainer of `args`' ranks (accelerator, devices, strategy, threads, seed) that logs
/// and saves nothing: for a pass before the fit, as the reference of preference tuning.
pub fn bare_trainer(args: &FitArgs) -> anyhow::Result<Trainer> {
    Ok(ranks(args)?
        .no_logger()
        .progress(false)
        .model_summary(false)
        .build()?)
}

/// A builder of `args`' ranks: the accelerator, the devices (the main job's default is 2
/// ranks as threads; on CUDA one per GPU; under a launcher, its process count), the
/// strategy, the threads of each rank and the seed.
fn ranks(args: &FitArgs) -> anyhow::Result<wick_trainer::TrainerBuilder> {
    let kind = args.accelerator;
    let devices = match (args.devices, LaunchEnv::detect()?, kind) {
        (None, None, DeviceKind::Cpu) => Some(2),
        (None, None, DeviceKind::Cuda) => Some(cuda_device_count()?),
        (devices, ..) => devices,
    };
    let mut builder = Trainer::builder()
        .device_kind(kind)
        .seed(args.seed)
        .strategy(args.strategy_spec().map_err(anyhow::Error::msg)?);
    if let Some(d) = devices {
        builder = builder.devices(d);
    }
    if let Some(n) = args.threads_per_rank {
        builder = builder.threads_per_rank(n);
    }
    if let Some(ms) = args.worker_spin_ms {
        builder = builder.worker_spin(std::time::Duration::from_millis(ms));
    }
    Ok(builder)
}

/// What a run reports.
#[derive(Debug, Clone)]
pub struct FitReport {
    /// Mean train loss over ranks at the first step.
    pub first_train_loss: f64,
    /// At the last step.
    pub last_train_loss: f64,
    /// The last validation loss.
    pub val_loss: Option<f64>,
    /// Trainable parameters of the model.
    pub parameters: usize,
    /// Frozen parameters (LoRA's base weights).
    pub frozen_parameters: usize,
    /// The metrics file.
    pub metrics_csv: Option<std::path::PathBuf>,
    /// Where each logger wrote.
    pub logs: Vec<LogDestination>,
    /// The checkpoint root the run saved under.
    pub checkpoint_dir: Option<std::path::PathBuf>,
    /// The number of ranks.
    pub devices: usize,
    /// Whether this process runs rank 0 (always, with ranks as threads), the one that
    /// reports.
    pub is_global_zero: bool,
}

/// A trainer built from the options of `wick fit`, and the callback that records the losses
/// the program reports: what the character job and the Hugging Face job share.
pub struct ProgramTrainer {
    trainer: Trainer,
    history: LossHistory,
}

impl ProgramTrainer {
    /// The trainer of `args` (strategy, devices, steps, logging), saving with `checkpoints`'
    /// extra settings (attachments) under the options' rules, unless `--no-checkpoints`.
    pub fn new(args: &FitArgs, checkpoints: ModelCheckpoint) -> anyhow::Result<ProgramTrainer> {
        let history = LossHistory::default();
        let mut builder = ranks(args)?
            .accumulate_grad_batches(args.accumulate)
            .on_nonfinite(args.on_nonfinite)
            .max_steps(args.max_steps)
            .run_name(&args.run_name)
            .log_dir(&args.log_dir)
            .loggers(args.logger.iter().copied())
            .run_options(args.options())
            .val_check_interval(args.val_every)
            .progress(!args.no_progress)
            .overlap_comm(!args.no_overlap_comm)
            // SIGTERM, SIGINT, SIGUSR1: save this step and stop (exit status 75).
            .preemption(Preemption::on_signals().context("catching SIGTERM, SIGINT and SIGUSR1")?)
            .callback(LearningRateMonitor::new())
            .callback(history.clone());
        if let Some(uri) = &args.mlflow_uri {
            builder = builder.mlflow_uri(uri);
        }
        if let Some(clip) = args.clip {
            builder = builder.gradient_clip_val(clip);
        }
        if !args.no_checkpoints {
            builder = builder.checkpoint(
                checkpoints
                    .every_n_steps(args.save_every)
                    .keep_last(args.keep_last)
                    .async_save(args.async_save),
            );
        }
        Ok(ProgramTrainer {
            trainer: builder.build()?,
            history,
        })
    }

    /// Fits `model` on `train`, validating on `val` (resuming when `args` says so).
    pub fn fit<M, D>(
        mut self,
        args: &FitArgs,
        model: M,
        train: &DataLoader<D>,
        val: &DataLoader<D>,
    ) -> anyhow::Result<FitReport>
    where
        M: wick_trainer::Replicate + 'static,
        D: wick_trainer::Dataset<Batch = M::Batch>,
    {
        let trainer = &mut self.trainer;
        let model = &mut Attached::new(model);
        let metrics = match &args.resume {
            Some(from) if from.as_os_str() == RESUME_AUTO => {
                trainer.fit_or_resume(model, train, Some(val))?
            }
            Some(from) => trainer.fit_from(model, train, Some(val), from)?,
            None => trainer.fit(model, train, Some(val))?,
        };
        let (first, last) = lock(&self.history.0)
            .context(
                "no training step ran (a resumed run must raise --max-steps above the checkpoint's step)",
            )?;
        Ok(FitReport {
            first_train_loss: first,
            last_train_loss: last,
            val_loss: metrics.get("val_loss").copied(),
            parameters: model.num_parameters().unwrap_or(0),
            frozen_parameters: model.num_frozen_parameters().unwrap_or(0),
            metrics_csv: trainer.metrics_path(),
            logs: trainer.log_destinations().to_vec(),
            checkpoint_dir: trainer.checkpoint_dir().map(std::path::Path::to_path_buf),
            devices: trainer.world_size(),
            is_global_zero: trainer.is_global_zero(),
        })
    }
}
