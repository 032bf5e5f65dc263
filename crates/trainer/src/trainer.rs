//! `Trainer`: options, the per-module session that keeps rank replicas between stages, and
//! the four entry points.

use crate::metrics_csv::MetricsCsv;
use crate::progress::Progress;
use crate::rank_run::{RankOutput, RankRun, StageInput};
use crate::{Checkpoint, DataLoader, Dataset, ModelCheckpoint, Replicate, TrainerError};
use candle_core::Tensor;
use std::any::{Any, TypeId};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::Duration;
use wick_accelerator::{Accelerator, DeviceKind, RankError, ThreadBudget};
use wick_core::{lock, Callback, RunState, Stage, Strategy};
use wick_strategies::{StrategyKind, StrategySpec};

/// Metric name to value, averaged over ranks (`train_loss`, `val_loss`, `test_loss`).
pub type Metrics = BTreeMap<String, f64>;

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
}

enum StrategyChoice {
    /// `single` on one device, `ddp` on more.
    Default,
    /// A name a user typed, parsed when the trainer is built.
    Name(String),
    Spec(StrategySpec),
    Instance(Box<dyn Strategy>),
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

    /// The strategy, by the name a user typed (`single`, `ddp`, `zero1`, `zero2`, `zero3`,
    /// `fsdp`), with its default options; an unknown name is an error of
    /// [`TrainerBuilder::build`]. Default `single` on one device, `ddp` on more.
    pub fn strategy(mut self, name: &str) -> Self {
        self.strategy = StrategyChoice::Name(name.to_string());
        self
    }

    /// The strategy and its options as one checked value (what `wick fit`'s `--strategy`,
    /// `--sharding`, `--precision`, `--group-size`, `--prefetch` and `--auto-wrap` say); a
    /// [`StrategyKind`](wick_strategies::StrategyKind) alone takes the default options.
    pub fn strategy_spec(mut self, spec: impl Into<StrategySpec>) -> Self {
        self.strategy = StrategyChoice::Spec(spec.into());
        self
    }

    /// A strategy instance with non-default options (e.g. `Ddp::new().with_bucket_cap_bytes(..)`).
    pub fn strategy_instance(mut self, strategy: Box<dyn Strategy>) -> Self {
        self.strategy = StrategyChoice::Instance(strategy);
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

    /// Writes no metrics file.
    pub fn no_logger(mut self) -> Self {
        self.log_dir = None;
        self
    }

    /// Validate every `steps` optimizer steps instead of at the end of each epoch.
    pub fn val_check_interval(mut self, steps: usize) -> Self {
        self.val_check_interval = Some(steps);
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
    pub fn build(self) -> Result<Trainer, TrainerError> {
        let mut accelerator = match self.accelerator {
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
        let strategy = match self.strategy {
            StrategyChoice::Instance(s) => s,
            StrategyChoice::Default => {
                let kind = match world_size {
                    1 => StrategyKind::Single,
                    _ => StrategyKind::Ddp,
                };
                StrategySpec::new(kind).build()?
            }
            StrategyChoice::Name(name) => StrategySpec::new(name.parse()?).build()?,
            StrategyChoice::Spec(spec) => spec.build()?,
        };
        strategy.check_world_size(world_size)?;
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
        Ok(Trainer {
            config: Config {
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
            },
            accelerator,
            strategy,
            callbacks: self.callbacks,
            session: None,
            last_fit: FitDirs::default(),
        })
    }
}

/// The rank replicas and strategies of the module a trainer configured, kept so that later
/// stages on the same module reuse its parameters.
struct Session {
    module: (usize, TypeId),
    strategies: Vec<Box<dyn Strategy>>,
    /// `Vec<M>`: the modules of ranks 1.., rank 0's being the caller's.
    replicas: Box<dyn Any + Send>,
}

/// Runs fit, validate, test and predict over a world of ranks, in docs/design.md's stage order.
///
/// With ranks as threads, rank 0 uses the module passed in, and ranks 1.. use replicas made
/// before its parameters existed ([`Replicate`]), which the trainer keeps for later stages on
/// the same module (recognised by its address: keep the module in place between calls).
/// Under a launcher (`mpirun`, `srun`) each process runs its own rank on the module passed
/// in, and every call is a collective: all processes make it.
///
/// After [`Trainer::fit`], use the trained module through the trainer: [`Trainer::validate`],
/// [`Trainer::test`], [`Trainer::predict`] and [`Trainer::full_parameters`] work under every
/// strategy, any number of times, in any order. The module passed in holds every parameter
/// under the replicated strategies, so it also runs alone; under `zero3` and `fsdp` with
/// several ranks as threads it holds rank 0's shard only, and a forward outside the trainer
/// fails at once with [`wick_core::CollectiveError::Ended`], which says what to call instead.
pub struct Trainer {
    config: Config,
    accelerator: Accelerator,
    strategy: Box<dyn Strategy>,
    callbacks: Vec<Box<dyn Callback>>,
    session: Option<Session>,
    last_fit: FitDirs,
}

/// What a fit writes to, chosen before its ranks start.
#[derive(Default)]
struct FitOutputs {
    /// Rank 0's metrics file (in rank 0's process).
    csv: Option<MetricsCsv>,
    /// The log directory, recorded in checkpoints.
    run: Option<String>,
    /// The checkpoint rules under the root chosen.
    checkpoint: Option<ModelCheckpoint>,
}

/// Where the last fit wrote.
#[derive(Default)]
struct FitDirs {
    metrics: Option<PathBuf>,
    checkpoints: Option<PathBuf>,
}

type Slot<'a, M> = Mutex<Option<(&'a mut M, &'a mut Box<dyn Strategy>, Vec<Box<dyn Callback>>)>>;

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
        }
    }

    /// The number of ranks.
    pub fn world_size(&self) -> usize {
        self.accelerator.world_size()
    }

    /// Whether this process runs rank 0: always with ranks as threads; under a launcher,
    /// in one process only. Output meant to appear once (reports, files) belongs there.
    pub fn is_global_zero(&self) -> bool {
        self.accelerator.local_ranks().start == 0
    }

    /// The strategy's name.
    pub fn strategy_name(&self) -> &str {
        self.strategy.name()
    }

    /// Scalar parameters of the module this trainer configured, once it has.
    pub fn num_parameters(&self) -> Option<usize> {
        let s = self.session.as_ref()?;
        s.strategies
            .first()
            .filter(|s| s.is_configured())
            .map(|s| s.num_parameters())
    }

    /// Model-state bytes rank 0 holds (after a fit: including gradients and optimizer state).
    pub fn state_bytes(&self) -> Option<wick_core::StateBytes> {
        let s = self.session.as_ref()?;
        s.strategies
            .first()
            .filter(|s| s.is_configured())
            .map(|s| s.state_bytes())
    }

    /// Which model state the strategy shards.
    pub fn sharding(&self) -> wick_core::Sharding {
        self.strategy.sharding()
    }

    /// Every parameter of the configured module in full, by name, in registration order
    /// (gathered from the shards under sharding strategies). It may be called any number of
    /// times, before or after the other stages.
    pub fn full_parameters(&mut self) -> Result<Vec<(String, Tensor)>, TrainerError> {
        let session = self.session.as_mut().ok_or_else(|| {
            TrainerError::config("module", "no module was configured by this trainer yet")
        })?;
        let strategies: Vec<Mutex<&mut Box<dyn Strategy>>> =
            session.strategies.iter_mut().map(Mutex::new).collect();
        let first = self.accelerator.local_ranks().start;
        let outcomes = self.accelerator.launch(|env| {
            let mut strategy = strategies[env.rank - first]
                .lock()
                .map_err(|_| TrainerError::config("rank", "slot lock poisoned"))?;
            strategy.connect(env.world.clone(), env.device.clone())?;
            Ok(strategy.full_parameters()?)
        });
        drop(strategies);
        idle(&self.accelerator, &mut session.strategies)?;
        Ok(collect_ranks(first, outcomes)?.swap_remove(0))
    }

    /// The metrics file the last fit wrote (`None` before a fit, or without a logger):
    /// `<log dir>/<run name>/metrics.csv`, or a version of that directory when it held
    /// another run ([`TrainerBuilder::run_name`]).
    pub fn metrics_path(&self) -> Option<PathBuf> {
        self.last_fit.metrics.clone()
    }

    /// The checkpoint root the last fit saved under (`None` before a fit, or without
    /// checkpoints): the configured root, or a version of it when that held another run's
    /// checkpoints ([`ModelCheckpoint`]).
    pub fn checkpoint_dir(&self) -> Option<&Path> {
        self.last_fit.checkpoints.as_deref()
    }

    /// Trains `module` on `train`, validating on `val` as configured; returns the last metrics.
    pub fn fit<M, D>(
        &mut self,
        module: &mut M,
        train: &DataLoader<D>,
        val: Option<&DataLoader<D>>,
    ) -> Result<Metrics, TrainerError>
    where
        M: Replicate + 'static,
        D: Dataset<Batch = M::Batch>,
    {
        self.fit_inner(module, train, val, None)
    }

    /// [`Trainer::fit`] resumed from the checkpoint `checkpoint` (a checkpoint directory, a
    /// checkpoint root, or a root's `last` file, as [`Checkpoint::open`] takes them): after
    /// `configure_sharded_model`, parameters, optimizer state, step, seed and data position
    /// are restored, at this trainer's world size whatever the checkpoint's. At the same
    /// world size the run continues bit-identically to one that was never interrupted, and
    /// its metrics file continues the run's (see [`TrainerBuilder::run_name`]).
    pub fn fit_from<M, D>(
        &mut self,
        module: &mut M,
        train: &DataLoader<D>,
        val: Option<&DataLoader<D>>,
        checkpoint: impl AsRef<Path>,
    ) -> Result<Metrics, TrainerError>
    where
        M: Replicate + 'static,
        D: Dataset<Batch = M::Batch>,
    {
        // Opened and checked whole once per process, before any rank starts: a bad path is
        // this call's error, not a rank's.
        let checkpoint = Checkpoint::open(checkpoint)?;
        self.fit_inner(module, train, val, Some(&checkpoint))
    }

    fn fit_inner<M, D>(
        &mut self,
        module: &mut M,
        train: &DataLoader<D>,
        val: Option<&DataLoader<D>>,
        resume: Option<&Checkpoint>,
    ) -> Result<Metrics, TrainerError>
    where
        M: Replicate + 'static,
        D: Dataset<Batch = M::Batch>,
    {
        train.check(self.world_size())?;
        let accumulate = self.config.accumulate_grad_batches;
        if train.batches_per_epoch() == 0 {
            return Err(TrainerError::config(
                "batch size",
                format!(
                    "the training set has {} samples, fewer than one global batch of {}",
                    train.dataset().len(),
                    train.batch_size()
                ),
            ));
        }
        if train.batches_per_epoch() < accumulate {
            return Err(TrainerError::config(
                "accumulate_grad_batches",
                format!(
                    "{accumulate} global batches per optimizer step, but the training set of {} \
                     samples makes only {} global batches of {} per epoch",
                    train.dataset().len(),
                    train.batches_per_epoch(),
                    train.batch_size()
                ),
            ));
        }
        let outputs = self.prepare_outputs(resume)?;
        let input = StageInput {
            train: Some(train),
            eval: val,
            resume,
            checkpoint: outputs.checkpoint.as_ref(),
            run: outputs.run.as_deref(),
        };
        Ok(self
            .run_stage(module, Stage::Fit, &input, outputs.csv)?
            .swap_remove(0)
            .metrics)
    }

    /// Chooses this fit's log directory and checkpoint root ([`crate::run_dirs`]), and on
    /// rank 0's process opens the metrics file and makes the root, so that an output path
    /// that cannot be written fails before any training.
    fn prepare_outputs(&mut self, resume: Option<&Checkpoint>) -> Result<FitOutputs, TrainerError> {
        let mut out = FitOutputs::default();
        self.last_fit = FitDirs::default();
        let zero = self.is_global_zero();
        if let Some(log_root) = &self.config.log_dir {
            let recorded = resume.and_then(|c| c.manifest().run.as_deref().map(Path::new));
            let (dir, continues) =
                crate::run_dirs::log_dir(log_root, &self.config.run_name, recorded);
            if zero {
                let csv = match (continues, resume) {
                    (true, Some(c)) => MetricsCsv::resume(&dir, c.manifest().step)?,
                    _ => MetricsCsv::create(&dir)?,
                };
                self.last_fit.metrics = Some(csv.path().to_path_buf());
                out.csv = Some(csv);
            }
            out.run = Some(dir.display().to_string());
        }
        if let Some(mc) = &self.config.checkpoint {
            let root = crate::run_dirs::checkpoint_root(mc.root(), resume.map(Checkpoint::dir));
            if zero {
                crate::checkpoint::check_writable(&root)?;
            }
            self.last_fit.checkpoints = Some(root.clone());
            out.checkpoint = Some(mc.under(root));
        }
        Ok(out)
    }

    /// One validation pass; returns `val_loss` (if the module reports one).
    pub fn validate<M, D>(
        &mut self,
        module: &mut M,
        data: &DataLoader<D>,
    ) -> Result<Metrics, TrainerError>
    where
        M: Replicate + 'static,
        D: Dataset<Batch = M::Batch>,
    {
        let loaders = StageInput::eval(data);
        Ok(self
            .run_stage(module, Stage::Validate, &loaders, None)?
            .swap_remove(0)
            .metrics)
    }

    /// One test pass; returns `test_loss` (if the module reports one).
    pub fn test<M, D>(
        &mut self,
        module: &mut M,
        data: &DataLoader<D>,
    ) -> Result<Metrics, TrainerError>
    where
        M: Replicate + 'static,
        D: Dataset<Batch = M::Batch>,
    {
        let loaders = StageInput::eval(data);
        Ok(self
            .run_stage(module, Stage::Test, &loaders, None)?
            .swap_remove(0)
            .metrics)
    }

    /// Predictions for every global batch of `data`, in dataset order: the ranks' slices,
    /// gathered over the world to rank 0. Under a launcher, the process of rank 0 gets them
    /// and the others get an empty list.
    pub fn predict<M, D>(
        &mut self,
        module: &mut M,
        data: &DataLoader<D>,
    ) -> Result<Vec<Tensor>, TrainerError>
    where
        M: Replicate + 'static,
        D: Dataset<Batch = M::Batch>,
    {
        let loaders = StageInput::eval(data);
        Ok(self
            .run_stage(module, Stage::Predict, &loaders, None)?
            .swap_remove(0)
            .predictions)
    }

    /// Runs `stage` on this process's ranks; `csv`, the fit's metrics file, goes to rank 0.
    fn run_stage<M, D>(
        &mut self,
        module: &mut M,
        stage: Stage,
        loaders: &StageInput<'_, D>,
        csv: Option<MetricsCsv>,
    ) -> Result<Vec<RankOutput>, TrainerError>
    where
        M: Replicate + 'static,
        D: Dataset<Batch = M::Batch>,
    {
        let world_size = self.world_size();
        for loader in [loaders.train, loaders.eval].into_iter().flatten() {
            loader.check(world_size)?;
        }
        // Ranks as threads each need a module; a process under a launcher runs its own rank
        // only, on the caller's module, and clones nothing.
        let local = self.accelerator.local_ranks();
        let key = (module as *const M as usize, TypeId::of::<M>());
        let mut session = match self.session.take() {
            Some(s) if s.module == key => s,
            _ => Session {
                module: key,
                strategies: local
                    .clone()
                    .map(|_| self.strategy.for_new_rank())
                    .collect(),
                replicas: Box::new(
                    local
                        .clone()
                        .skip(1)
                        .map(|_| module.replica().ok_or_else(no_replica))
                        .collect::<Result<Vec<M>, _>>()?,
                ),
            },
        };
        let replicas = session
            .replicas
            .downcast_mut::<Vec<M>>()
            .expect("a session's replicas have its module's type");
        let slots: Vec<Slot<'_, M>> = std::iter::once(module)
            .chain(replicas.iter_mut())
            .zip(session.strategies.iter_mut())
            .map(|(m, s)| {
                Mutex::new(Some((
                    m,
                    s,
                    self.callbacks.iter().map(|c| c.clone_box()).collect(),
                )))
            })
            .collect();
        let config = &self.config;
        let csv = Mutex::new(csv);
        let outcomes = self.accelerator.launch(|env| {
            let (module, strategy, callbacks) = slots[env.rank - local.start]
                .lock()
                .map_err(|_| TrainerError::config("rank", "slot lock poisoned"))?
                .take()
                .expect("each rank takes its slot once");
            let state = RunState::new(env.rank, env.world_size);
            let progress = Progress::new_if_terminal(env.rank == 0 && config.progress);
            let csv = match env.rank {
                0 => lock(&csv).take(),
                _ => None,
            };
            RankRun {
                env,
                progress,
                csv,
                module,
                strategy: strategy.as_mut(),
                callbacks,
                config,
                state,
            }
            .run(stage, loaders)
        });
        drop(slots);
        let idled = idle(&self.accelerator, &mut session.strategies);
        self.session = Some(session);
        let outputs = collect_ranks(local.start, outcomes)?;
        idled?;
        Ok(outputs)
    }
}

/// Connects each rank's strategy to the world it keeps between stages
/// ([`Accelerator::idle_world`]): with ranks as threads the launch's world has ended, so a
/// sharded module used outside the trainer says what to call instead of waiting on ranks
/// that left, and whatever the stage gathered is freed.
fn idle(
    accelerator: &Accelerator,
    strategies: &mut [Box<dyn Strategy>],
) -> Result<(), TrainerError> {
    let first = accelerator.local_ranks().start;
    for (rank, strategy) in (first..).zip(strategies.iter_mut()) {
        if let Some((world, device)) = accelerator.idle_world(rank) {
            strategy.connect(world, device)?;
        }
    }
    Ok(())
}

fn no_replica() -> TrainerError {
    TrainerError::config(
        "devices",
        "ranks as threads need one module per rank, and this module's Replicate::replica \
         gives none: derive Clone on it, or run one rank per process under mpirun or srun",
    )
}

/// The outputs of this process's ranks (the first being `first`), or one error: the error
/// itself when every rank failed with the same one (bad input that no rank caused: a
/// missing file, a wrong option), otherwise [`TrainerError::RankFailed`] naming the rank
/// that failed first.
fn collect_ranks<T>(
    first: usize,
    outcomes: Vec<Result<T, RankError<TrainerError>>>,
) -> Result<Vec<T>, TrainerError> {
    let count = outcomes.len();
    let mut values = Vec::with_capacity(count);
    let mut errors = Vec::new();
    for (rank, outcome) in (first..).zip(outcomes) {
        match outcome {
            Ok(v) => values.push(v),
            Err(e) => errors.push((rank, e.to_string(), e)),
        }
    }
    if errors.is_empty() {
        return Ok(values);
    }
    let shared = errors.len() == count
        && errors
            .iter()
            .all(|(_, m, e)| *m == errors[0].1 && matches!(e, RankError::Failed(_)));
    if shared {
        if let Some((_, _, RankError::Failed(e))) = errors.into_iter().next() {
            return Err(e);
        }
        unreachable!("every error was checked to be a rank's own");
    }
    let caused_by_peer =
        |e: &RankError<TrainerError>| matches!(e, RankError::Failed(t) if t.is_consequence());
    let (rank, message) = errors
        .iter()
        .find(|(_, _, e)| !caused_by_peer(e))
        .or(errors.first())
        .map(|(r, m, _)| (*r, m.clone()))
        .expect("some rank failed");
    Err(TrainerError::RankFailed {
        rank,
        message,
        ranks: errors
            .into_iter()
            .map(|(r, m, _)| (r, format!("rank {r}: {m}")))
            .collect(),
    })
}
