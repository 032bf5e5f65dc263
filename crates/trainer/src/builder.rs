//! `TrainerBuilder`: the trainer's options, checked together when it is built.

use crate::config::Config;
use crate::trainer::Trainer;
use crate::{Logger, MlflowTarget, ModelCheckpoint, Preemption, StepSink, TrainerError};
use std::path::PathBuf;
use std::time::Duration;
use wick_accelerator::{Accelerator, DeviceKind, ThreadBudget};
use wick_core::{Callback, OnNonFinite, Strategy};
use wick_strategies::{StrategyKind, StrategySpec};

/// What [`TrainerBuilder::strategy`] takes: a name a user typed (`"fsdp"`), a
/// [`StrategyKind`], a [`StrategySpec`] (a strategy and its options, checked together), or
/// an instance built with options of its own (`Ddp::new().with_bucket_cap_bytes(..)`).
pub enum StrategyChoice {
    /// `single` on one device, `ddp` on more.
    Default,
    /// A spec, built when the trainer is.
    Spec(StrategySpec),
    /// A name that is not a strategy's: the error [`TrainerBuilder::build`] returns.
    Unknown(wick_core::Error),
    /// A strategy built already.
    Instance(Box<dyn Strategy>),
}

impl From<&str> for StrategyChoice {
    fn from(name: &str) -> Self {
        match name.parse::<StrategyKind>() {
            Ok(kind) => StrategyChoice::Spec(StrategySpec::new(kind)),
            Err(e) => StrategyChoice::Unknown(e),
        }
    }
}

impl From<StrategyKind> for StrategyChoice {
    fn from(kind: StrategyKind) -> Self {
        StrategyChoice::Spec(StrategySpec::new(kind))
    }
}

impl From<StrategySpec> for StrategyChoice {
    fn from(spec: StrategySpec) -> Self {
        StrategyChoice::Spec(spec)
    }
}

impl From<Box<dyn Strategy>> for StrategyChoice {
    fn from(strategy: Box<dyn Strategy>) -> Self {
        StrategyChoice::Instance(strategy)
    }
}

impl<S: Strategy + 'static> From<Box<S>> for StrategyChoice {
    fn from(strategy: Box<S>) -> Self {
        StrategyChoice::Instance(strategy)
    }
}

/// Options of a [`Trainer`]; see [`Trainer::builder`].
pub struct TrainerBuilder {
    devices: Option<usize>,
    device_kind: DeviceKind,
    threads_per_rank: Option<usize>,
    accelerator: Option<Accelerator>,
    strategy: StrategyChoice,
    max_steps: Option<usize>,
    max_epochs: Option<usize>,
    seed: u64,
    callbacks: Vec<Box<dyn Callback>>,
    sinks: Vec<Box<dyn StepSink>>,
    run_name: String,
    log_dir: Option<PathBuf>,
    val_check_interval: Option<usize>,
    progress: bool,
    model_summary: bool,
    gradient_clip_val: Option<f64>,
    accumulate_grad_batches: usize,
    collective_timeout: Option<Duration>,
    checkpoint: Option<ModelCheckpoint>,
    error_on_unused_parameters: bool,
    overlap_comm: bool,
    preemption: Option<Preemption>,
    on_nonfinite: OnNonFinite,
    loggers: Vec<Logger>,
    run_options: Vec<(String, String)>,
    mlflow_uri: Option<String>,
}

impl TrainerBuilder {
    /// The number of ranks. Default: as many as the launcher started when one started this
    /// process (`mpirun`, `srun`; a different number is an error), otherwise 1. Without a
    /// launcher the ranks are threads of this process.
    pub fn devices(mut self, devices: usize) -> Self {
        self.devices = Some(devices);
        self
    }

    /// The kind of device every rank computes on (default [`DeviceKind::Cpu`]). With
    /// [`DeviceKind::Cuda`], rank r uses GPU r (or GPU `local_rank` under a launcher); too
    /// few GPUs is an error when the trainer is built.
    pub fn device_kind(mut self, kind: DeviceKind) -> Self {
        self.device_kind = kind;
        self
    }

    /// The compute threads of each CPU rank when ranks are threads. Default: the cores
    /// shared out between the ranks (`max(1, cores / devices)`), so that W ranks never ask
    /// for more threads than there are cores; one rank uses them all.
    pub fn threads_per_rank(mut self, threads: usize) -> Self {
        self.threads_per_rank = Some(threads);
        self
    }

    /// Runs the ranks as `accelerator` says instead of as the environment says (for example
    /// [`Accelerator::cpu`]: ranks as threads even in a process that a launcher started).
    pub fn accelerator(mut self, accelerator: Accelerator) -> Self {
        self.accelerator = Some(accelerator);
        self
    }

    /// The strategy: a name a user typed (`single`, `ddp`, `zero1`, `zero2`, `zero3`, `fsdp`,
    /// with its default options; an unknown name is an error of [`TrainerBuilder::build`]),
    /// a [`StrategyKind`], a [`StrategySpec`] (what `wick fit`'s `--strategy`,
    /// `--sharding`, `--precision`, `--group-size`, `--prefetch`, `--auto-wrap` and
    /// `--activation-checkpointing` say), or an instance with options of its own. Default
    /// `single` on one device, `ddp` on more.
    pub fn strategy(mut self, strategy: impl Into<StrategyChoice>) -> Self {
        self.strategy = strategy.into();
        self
    }

    /// Stop after this many optimizer steps.
    pub fn max_steps(mut self, steps: usize) -> Self {
        self.max_steps = Some(steps);
        self
    }

    /// Stop after this many epochs (default 1 when `max_steps` is not set either).
    pub fn max_epochs(mut self, epochs: usize) -> Self {
        self.max_epochs = Some(epochs);
        self
    }

    /// The seed of parameter init and data order. Default 0.
    pub fn seed(mut self, seed: u64) -> Self {
        self.seed = seed;
        self
    }

    /// Adds a callback; each rank runs its own clone.
    pub fn callback(mut self, callback: impl Callback + 'static) -> Self {
        self.callbacks.push(Box::new(callback));
        self
    }

    /// Adds `sink` to the destinations of each optimizer step's [`StepRecord`](crate::StepRecord),
    /// after the metrics file: called on rank 0 only, for every fit of the trainer, an error
    /// from it ending the fit.
    pub fn sink(mut self, sink: impl StepSink + 'static) -> Self {
        self.sinks.push(Box::new(sink));
        self
    }

    /// The run's name: metrics go to `<log dir>/<run name>/metrics.csv`. Default `run`. A
    /// fit that does not resume never writes into a run directory that holds anything: it
    /// takes the first free `<run name>-v1`, `-v2`, ... instead, as Lightning's `version_N`
    /// ([`Trainer::metrics_path`] tells which). A resumed fit continues the metrics of the
    /// run it resumes (recorded in the checkpoint) when that run logged under the same log
    /// dir, with this name or a version of it: the rows up to the checkpoint's step stay,
    /// later rows are replaced.
    pub fn run_name(mut self, name: &str) -> Self {
        self.run_name = name.to_string();
        self
    }

    /// Where runs are logged. Default `runs`.
    pub fn log_dir(mut self, dir: impl Into<PathBuf>) -> Self {
        self.log_dir = Some(dir.into());
        self
    }

    /// The loggers rank 0 writes each step to, under the log dir (default
    /// [`Logger::DEFAULT`]: `metrics.csv` and TensorBoard event files). Each is written
    /// once, whatever the repeats.
    pub fn loggers(mut self, loggers: impl IntoIterator<Item = Logger>) -> Self {
        self.loggers.clear();
        for logger in loggers {
            if !self.loggers.contains(&logger) {
                self.loggers.push(logger);
            }
        }
        self
    }

    /// The run's options as (name, value), which TensorBoard shows as the run's text and
    /// MLflow records as its params (Lightning's `log_hyperparams`).
    pub fn run_options(mut self, options: impl IntoIterator<Item = (String, String)>) -> Self {
        self.run_options = options.into_iter().collect();
        self
    }

    /// The MLflow tracking server of [`Logger::Mlflow`] (`http://host:port`); without it,
    /// `MLFLOW_TRACKING_URI`, and the experiment `MLFLOW_EXPERIMENT_ID` (default `0`).
    pub fn mlflow_uri(mut self, uri: &str) -> Self {
        self.mlflow_uri = Some(uri.to_string());
        self
    }

    /// Writes no metrics file and no logs.
    pub fn no_logger(mut self) -> Self {
        self.log_dir = None;
        self
    }

    /// Validate every `steps` optimizer steps instead of at the end of each epoch.
    pub fn val_check_interval(mut self, steps: usize) -> Self {
        self.val_check_interval = Some(steps);
        self
    }

    /// Let collectives issued ahead (gradient reductions during backward, prefetched
    /// gathers) run while the rank computes, on engines that can (MPI, NCCL). Default on;
    /// off, each completes where it is issued, as DeepSpeed's `overlap_comm: false`: for
    /// measuring what overlap hides (`comm_wait_s` in metrics.csv). The numbers are the same.
    pub fn overlap_comm(mut self, on: bool) -> Self {
        self.overlap_comm = on;
        self
    }

    /// Draw the progress bar when standard output is a terminal. Default on.
    pub fn progress(mut self, on: bool) -> Self {
        self.progress = on;
        self
    }

    /// Print the model summary (parameters, state bytes per rank) after the first step.
    /// Default on.
    pub fn model_summary(mut self, on: bool) -> Self {
        self.model_summary = on;
        self
    }

    /// Clip gradients to this global L2 norm before each optimizer step (over all shards).
    pub fn gradient_clip_val(mut self, max_norm: f64) -> Self {
        self.gradient_clip_val = Some(max_norm);
        self
    }

    /// Accumulate gradients over this many global batches per optimizer step (default 1).
    /// No gradient collective runs before the last of them.
    pub fn accumulate_grad_batches(mut self, batches: usize) -> Self {
        self.accumulate_grad_batches = batches;
        self
    }

    /// Save checkpoints during fit as `checkpoint` says (every N steps, at the end, which to
    /// keep, the `last` pointer).
    pub fn checkpoint(mut self, checkpoint: ModelCheckpoint) -> Self {
        self.checkpoint = Some(checkpoint);
        self
    }

    /// Stop fit cleanly when `preemption` is asked for ([`Preemption::on_signals`]: on
    /// SIGTERM, SIGINT or SIGUSR1): after the current optimizer step, which every rank
    /// agrees on, each rank saves a checkpoint of it (with [`TrainerBuilder::checkpoint`])
    /// and fit returns [`TrainerError::Interrupted`]. Costs one scalar all-reduce per step.
    pub fn preemption(mut self, preemption: Preemption) -> Self {
        self.preemption = Some(preemption);
        self
    }

    /// What a step does with an inf or NaN loss or gradient. Default
    /// [`OnNonFinite::Error`]: fit fails with [`TrainerError::NonFinite`], naming the step,
    /// the rank and the loss or the first parameter whose gradient holds one.
    /// [`OnNonFinite::Skip`]: the step is skipped on every rank (parameters and optimizer
    /// state unchanged) and counted in the metrics (`skipped_steps`), as `16-mixed`'s
    /// loss scaler skips overflowing steps. The gradients are checked after their reduction,
    /// every step (one pass over them and, where ranks hold parts, one scalar all-reduce).
    pub fn on_nonfinite(mut self, policy: OnNonFinite) -> Self {
        self.on_nonfinite = policy;
        self
    }

    /// Fails `fit` when a parameter receives no gradient at the first step, instead of the
    /// default warning on rank 0 (DDP's `find_unused_parameters`, made strict).
    pub fn error_on_unused_parameters(mut self, on: bool) -> Self {
        self.error_on_unused_parameters = on;
        self
    }

    /// Fail a collective that waits longer than this for the other ranks.
    pub fn collective_timeout(mut self, timeout: Duration) -> Self {
        self.collective_timeout = Some(timeout);
        self
    }

    /// Checks the options and builds the trainer.
    pub fn build(mut self) -> Result<Trainer, TrainerError> {
        let mut accelerator = match self.accelerator.take() {
            Some(a) => a,
            None => Accelerator::from_env(self.devices)?.on(self.device_kind)?,
        };
        let world_size = accelerator.world_size();
        if let Some(n) = self.threads_per_rank {
            accelerator = accelerator.with_thread_budget(ThreadBudget::per_rank(n)?);
        }
        if let Some(t) = self.collective_timeout {
            accelerator = accelerator.with_collective_timeout(t);
        }
        let choice = std::mem::replace(&mut self.strategy, StrategyChoice::Default);
        let strategy = match choice {
            StrategyChoice::Instance(s) => s,
            StrategyChoice::Default => {
                let kind = match world_size {
                    1 => StrategyKind::Single,
                    _ => StrategyKind::Ddp,
                };
                StrategySpec::new(kind).build()?
            }
            StrategyChoice::Unknown(e) => return Err(e.into()),
            StrategyChoice::Spec(spec) => spec.build()?,
        };
        strategy.check_world_size(world_size)?;
        self.check_options()?;
        let mlflow = match self.loggers.contains(&Logger::Mlflow) {
            true => Some(mlflow_target(self.mlflow_uri.as_deref())?),
            false => None,
        };
        Ok(Trainer::new(
            Config {
                max_steps: self.max_steps,
                max_epochs: self.max_epochs,
                seed: self.seed,
                log_dir: self.log_dir,
                run_name: self.run_name,
                val_check_interval: self.val_check_interval,
                progress: self.progress,
                model_summary: self.model_summary,
                gradient_clip_val: self.gradient_clip_val,
                accumulate_grad_batches: self.accumulate_grad_batches,
                checkpoint: self.checkpoint,
                error_on_unused_parameters: self.error_on_unused_parameters,
                overlap_comm: self.overlap_comm,
                preemption: self.preemption,
                on_nonfinite: self.on_nonfinite,
                loggers: self.loggers,
                run_options: self.run_options,
                mlflow,
            },
            accelerator,
            strategy,
            self.callbacks,
            self.sinks,
        ))
    }
}

impl TrainerBuilder {
    /// The options that need no world or strategy to check: counts, the clip value, the
    /// checkpoint attachments' names, the run's name.
    fn check_options(&self) -> Result<(), TrainerError> {
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

impl Trainer {
    /// Options with their defaults: one device, strategy `single`, one epoch, seed 0.
    pub fn builder() -> TrainerBuilder {
        TrainerBuilder {
            devices: None,
            device_kind: DeviceKind::Cpu,
            threads_per_rank: None,
            accelerator: None,
            strategy: StrategyChoice::Default,
            max_steps: None,
            max_epochs: None,
            seed: 0,
            callbacks: Vec::new(),
            sinks: Vec::new(),
            run_name: "run".into(),
            log_dir: Some(PathBuf::from("runs")),
            val_check_interval: None,
            progress: true,
            model_summary: true,
            gradient_clip_val: None,
            accumulate_grad_batches: 1,
            collective_timeout: None,
            checkpoint: None,
            error_on_unused_parameters: false,
            overlap_comm: true,
            preemption: None,
            on_nonfinite: OnNonFinite::Error,
            loggers: Logger::DEFAULT.to_vec(),
            run_options: Vec::new(),
            mlflow_uri: None,
        }
    }
}

/// The mlflow logger's server: `uri`, or `MLFLOW_TRACKING_URI`, and `MLFLOW_EXPERIMENT_ID`.
fn mlflow_target(uri: Option<&str>) -> Result<MlflowTarget, TrainerError> {
    let from_env = std::env::var("MLFLOW_TRACKING_URI").ok();
    let uri = uri.or(from_env.as_deref()).ok_or_else(|| {
        TrainerError::config(
            "mlflow-uri",
            "the mlflow logger needs a tracking server: --mlflow-uri, \
             TrainerBuilder::mlflow_uri or MLFLOW_TRACKING_URI",
        )
    })?;
    let target = MlflowTarget::new(uri)?;
    Ok(match std::env::var("MLFLOW_EXPERIMENT_ID") {
        Ok(id) if !id.is_empty() => target.with_experiment_id(id),
        _ => target,
    })
}
