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

/// Options of a [`Trainer`]; see [`Trainer::builder`]. What every rank reads is its
/// configuration, held here from the start and checked whole by [`TrainerBuilder::build`]; the
/// rest says how to make the accelerator and the strategy, and what rank 0 writes to.
pub struct TrainerBuilder {
    devices: Option<usize>,
    device_kind: DeviceKind,
    threads_per_rank: Option<usize>,
    worker_spin: Option<Duration>,
    accelerator: Option<Accelerator>,
    strategy: StrategyChoice,
    callbacks: Vec<Box<dyn Callback>>,
    sinks: Vec<Box<dyn StepSink>>,
    collective_timeout: Option<Duration>,
    mlflow_uri: Option<String>,
    config: Config,
}

/// Builder methods that each store their argument in one field: `name(arg: Type) =>
/// field = value;` makes `pub fn name(mut self, arg: Type) -> Self`, which sets
/// `self.field` (a path such as `config.seed`) to `value` and returns the builder.
macro_rules! setters {
    ($($(#[doc = $doc:literal])* $name:ident($arg:ident: $ty:ty) => $($field:ident).+ = $value:expr;)*) => {
        $(
            $(#[doc = $doc])*
            pub fn $name(mut self, $arg: $ty) -> Self {
                self.$($field).+ = $value;
                self
            }
        )*
    };
}

impl TrainerBuilder {
    setters! {
        /// The number of ranks. Default: as many as the launcher started when one started this
        /// process (`mpirun`, `srun`; a different number is an error), otherwise 1. Without a
        /// launcher the ranks are threads of this process.
        devices(devices: usize) => devices = Some(devices);

        /// The kind of device every rank computes on (default [`DeviceKind::Cpu`]). With
        /// [`DeviceKind::Cuda`], rank r uses GPU r (or GPU `local_rank` under a launcher); too
        /// few GPUs is an error when the trainer is built.
        device_kind(kind: DeviceKind) => device_kind = kind;

        /// The compute threads of each CPU rank when ranks are threads. Default: the cores
        /// shared out between the ranks (`max(1, cores / devices)`), so that W ranks never ask
        /// for more threads than there are cores; one rank uses them all.
        threads_per_rank(threads: usize) => threads_per_rank = Some(threads);

        /// How long the idle compute threads of a CPU rank with more than one keep looking
        /// for work before they nap, as OpenMP's threads spin between parallel regions
        /// ([`Accelerator::with_worker_spin`]; default 5 ms, zero: rayon's own sleep).
        worker_spin(spin: Duration) => worker_spin = Some(spin);

        /// Runs the ranks as `accelerator` says instead of as the environment says (for example
        /// [`Accelerator::cpu`]: ranks as threads even in a process that a launcher started).
        accelerator(accelerator: Accelerator) => accelerator = Some(accelerator);
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

    setters! {
        /// Stop after this many optimizer steps.
        max_steps(steps: usize) => config.max_steps = Some(steps);

        /// Stop after this many epochs (default 1 when `max_steps` is not set either).
        max_epochs(epochs: usize) => config.max_epochs = Some(epochs);

        /// The seed of parameter init and data order. Default 0.
        seed(seed: u64) => config.seed = seed;
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

    setters! {
        /// The run's name: metrics go to `<log dir>/<run name>/metrics.csv`. Default `run`. A
        /// fit that does not resume never writes into a run directory that holds anything: it
        /// takes the first free `<run name>-v1`, `-v2`, ... instead, as Lightning's `version_N`
        /// ([`Trainer::metrics_path`] tells which). A resumed fit continues the metrics of the
        /// run it resumes (recorded in the checkpoint) when that run logged under the same log
        /// dir, with this name or a version of it: the rows up to the checkpoint's step stay,
        /// later rows are replaced.
        run_name(name: &str) => config.run_name = name.to_string();
    }

    /// Where runs are logged. Default `runs`.
    pub fn log_dir(mut self, dir: impl Into<PathBuf>) -> Self {
        self.config.log_dir = Some(dir.into());
        self
    }

    /// The loggers rank 0 writes each step to, under the log dir (default
    /// [`Logger::DEFAULT`]: `metrics.csv` and TensorBoard event files). Each is written
    /// once, whatever the repeats.
    pub fn loggers(mut self, loggers: impl IntoIterator<Item = Logger>) -> Self {
        self.config.loggers.clear();
        for logger in loggers {
            if !self.config.loggers.contains(&logger) {
                self.config.loggers.push(logger);
            }
        }
        self
    }

    /// The run's options as (name, value), which TensorBoard shows as the run's text and
    /// MLflow records as its params (Lightning's `log_hyperparams`).
    pub fn run_options(mut self, options: impl IntoIterator<Item = (String, String)>) -> Self {
        self.config.run_options = options.into_iter().collect();
        self
    }

    setters! {
        /// The MLflow tracking server of [`Logger::Mlflow`] (`http://host:port`); without it,
        /// `MLFLOW_TRACKING_URI`, and the experiment `MLFLOW_EXPERIMENT_ID` (default `0`).
        mlflow_uri(uri: &str) => mlflow_uri = Some(uri.to_string());
    }

    /// Writes no metrics file and no logs.
    pub fn no_logger(mut self) -> Self {
        self.config.log_dir = None;
        self
    }

    setters! {
        /// Validate every `steps` optimizer steps instead of at the end of each epoch.
        val_check_interval(steps: usize) => config.val_check_interval = Some(steps);

        /// Let collectives issued ahead (gradient reductions during backward, prefetched
        /// gathers) run while the rank computes, on engines that can (MPI, NCCL). Default on;
        /// off, each completes where it is issued, as DeepSpeed's `overlap_comm: false`: for
        /// measuring what overlap hides (`comm_wait_s` in metrics.csv). The numbers are the same.
        overlap_comm(on: bool) => config.overlap_comm = on;

        /// Draw the progress bar when standard output is a terminal. Default on.
        progress(on: bool) => config.progress = on;

        /// Print the model summary (parameters, state bytes per rank) after the first step.
        /// Default on.
        model_summary(on: bool) => config.model_summary = on;

        /// Clip gradients to this global L2 norm before each optimizer step (over all shards).
        gradient_clip_val(max_norm: f64) => config.gradient_clip_val = Some(max_norm);

        /// Accumulate gradients over this many global batches per optimizer step (default 1).
        /// No gradient collective runs before the last of them.
        accumulate_grad_batches(batches: usize) => config.accumulate_grad_batches = batches;

        /// Save checkpoints during fit as `checkpoint` says (every N steps, at the end, which to
        /// keep, the `last` pointer).
        checkpoint(checkpoint: ModelCheckpoint) => config.checkpoint = Some(checkpoint);

        /// Stop fit cleanly when `preemption` is asked for ([`Preemption::on_signals`]: on
        /// SIGTERM, SIGINT or SIGUSR1): after the current optimizer step, which every rank
        /// agrees on, each rank saves a checkpoint of it (with [`TrainerBuilder::checkpoint`])
        /// and fit returns [`TrainerError::Interrupted`]. Costs one scalar all-reduce per step.
        preemption(preemption: Preemption) => config.preemption = Some(preemption);

        /// What a step does with an inf or NaN loss or gradient. Default
        /// [`OnNonFinite::Error`]: fit fails with [`TrainerError::NonFinite`], naming the step,
        /// the rank and the loss or the first parameter whose gradient holds one.
        /// [`OnNonFinite::Skip`]: the step is skipped on every rank (parameters and optimizer
        /// state unchanged) and counted in the metrics (`skipped_steps`), as `16-mixed`'s
        /// loss scaler skips overflowing steps. The gradients are checked after their reduction,
        /// every step (one pass over them and, where ranks hold parts, one scalar all-reduce).
        on_nonfinite(policy: OnNonFinite) => config.on_nonfinite = policy;

        /// Fails `fit` when a parameter receives no gradient at the first step, instead of the
        /// default warning on rank 0 (DDP's `find_unused_parameters`, made strict).
        error_on_unused_parameters(on: bool) => config.error_on_unused_parameters = on;

        /// Fail a collective that waits longer than this for the other ranks.
        collective_timeout(timeout: Duration) => collective_timeout = Some(timeout);
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
        if let Some(spin) = self.worker_spin {
            accelerator = accelerator.with_worker_spin(spin);
        }
        let choice = std::mem::replace(&mut self.strategy, StrategyChoice::Default);
        let strategy = match choice {
            StrategyChoice::Instance(s) => s,
            StrategyChoice::Default => {
                let kind = match world_size {
                    1 => StrategyKind::Single,
                    _ => StrategyKind::Ddp,
                };
                StrategySpec::new(kind).build()
            }
            StrategyChoice::Unknown(e) => return Err(e.into()),
            StrategyChoice::Spec(spec) => spec.build(),
        };
        strategy.check_world_size(world_size)?;
        self.config.check()?;
        let mlflow = match self.config.loggers.contains(&Logger::Mlflow) {
            true => Some(mlflow_target(self.mlflow_uri.as_deref())?),
            false => None,
        };
        let config = Config {
            mlflow,
            ..self.config
        };
        Ok(Trainer::new(
            config,
            accelerator,
            strategy,
            self.callbacks,
            self.sinks,
        ))
    }
}

impl Trainer {
    /// Options with their defaults: one device, strategy `single`, one epoch, seed 0.
    pub fn builder() -> TrainerBuilder {
        TrainerBuilder {
            devices: None,
            device_kind: DeviceKind::Cpu,
            threads_per_rank: None,
            worker_spin: None,
            accelerator: None,
            strategy: StrategyChoice::Default,
            callbacks: Vec::new(),
            sinks: Vec::new(),
            collective_timeout: None,
            mlflow_uri: None,
            config: Config::default(),
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
