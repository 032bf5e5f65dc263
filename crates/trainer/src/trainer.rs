//! `Trainer`: the four entry points (fit, validate, test, predict) and what a trainer
//! tells about its run. Its options are `config.rs`'s, its ranks `ranks.rs`'s.

use crate::config::Config;
use crate::logging::loggers::{LogDestination, LogPlan, Logger};
use crate::logging::sinks::{StepSink, StepSinks};
use crate::loops::{Metrics, RankOutput, StageInput};
use crate::stage_launcher::{collect_ranks, idle, StageLauncher};
use crate::{Attached, Checkpoint, DataLoader, Dataset, ModelCheckpoint, Replicate, TrainerError};
use candle_core::Tensor;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use wick_accelerator::Accelerator;
use wick_core::{Callback, Stage, Strategy};

/// Runs fit, validate, test and predict over a world of ranks, in docs/design.md's stage order.
///
/// With ranks as threads, rank 0 uses the module passed in, and ranks 1.. use replicas made
/// before its parameters existed ([`Replicate`]), kept in the [`Attached`] for later stages
/// of this trainer on the same module; another `Attached` is configured afresh.
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
    /// Distinct for every trainer of the process: a module's session is kept under it.
    id: u64,
    config: Config,
    accelerator: Accelerator,
    strategy: Box<dyn Strategy>,
    callbacks: Vec<Box<dyn Callback>>,
    /// The program's step sinks, lent to rank 0 for each fit.
    sinks: Vec<Box<dyn StepSink>>,
    last_fit: FitDirs,
}

/// What a fit writes to, chosen before its ranks start.
#[derive(Default)]
struct FitOutputs {
    /// Rank 0's loggers (in rank 0's process).
    logs: Vec<Box<dyn StepSink>>,
    /// The log directory, recorded in checkpoints.
    run: Option<String>,
    /// The checkpoint rules under the root chosen.
    checkpoint: Option<ModelCheckpoint>,
}

/// Where the last fit wrote.
#[derive(Default)]
struct FitDirs {
    metrics: Option<PathBuf>,
    logs: Vec<LogDestination>,
    checkpoints: Option<PathBuf>,
}

impl Trainer {
    /// A trainer of options `TrainerBuilder` checked.
    pub(crate) fn new(
        config: Config,
        accelerator: Accelerator,
        strategy: Box<dyn Strategy>,
        callbacks: Vec<Box<dyn Callback>>,
        sinks: Vec<Box<dyn StepSink>>,
    ) -> Self {
        // Never reused within the process: 2^64 trainers is more than any run makes.
        static NEXT: AtomicU64 = AtomicU64::new(0);
        Trainer {
            id: NEXT.fetch_add(1, Ordering::Relaxed),
            config,
            accelerator,
            strategy,
            callbacks,
            sinks,
            last_fit: FitDirs::default(),
        }
    }

    /// What a stage's launch reads of this trainer.
    fn launch(&self) -> StageLauncher<'_> {
        StageLauncher {
            trainer: self.id,
            accelerator: &self.accelerator,
            strategy: self.strategy.as_ref(),
            callbacks: &self.callbacks,
            config: &self.config,
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

    /// Which model state the strategy shards.
    pub fn sharding(&self) -> wick_core::Sharding {
        self.strategy.sharding()
    }

    /// Every parameter of `module` in full, by name, in registration order (gathered from
    /// the shards under sharding strategies), once this trainer configured it. It may be
    /// called any number of times, before or after the other stages.
    pub fn full_parameters<M>(
        &mut self,
        module: &mut Attached<M>,
    ) -> Result<Vec<(String, Tensor)>, TrainerError> {
        let Some(session) = module.parts_for(self.id).1 else {
            return Err(TrainerError::config(
                "module",
                "this module was not configured by this trainer yet",
            ));
        };
        let outcomes = self.accelerator.launch_each(
            session.strategies.iter_mut().collect(),
            |env, strategy| {
                strategy.connect(env.world.clone(), env.device.clone())?;
                Ok::<_, TrainerError>(strategy.full_parameters()?)
            },
        );
        idle(&self.accelerator, session.strategies.iter_mut().map(Some))?;
        let first = self.accelerator.local_ranks().start;
        Ok(collect_ranks(first, outcomes)?.swap_remove(0))
    }

    /// The metrics file the last fit wrote (`None` before a fit, or without a logger):
    /// `<log dir>/<run name>/metrics.csv`, or a version of that directory when it held
    /// another run ([`TrainerBuilder::run_name`](crate::TrainerBuilder::run_name)).
    pub fn metrics_path(&self) -> Option<PathBuf> {
        self.last_fit.metrics.clone()
    }

    /// Where each logger of the last fit wrote (rank 0's process; empty elsewhere, before
    /// a fit, or without a log directory).
    pub fn log_destinations(&self) -> &[LogDestination] {
        &self.last_fit.logs
    }

    /// The checkpoint root the last fit saved under (`None` before a fit, or without
    /// checkpoints): the configured root, or a version of it when that held another run's
    /// checkpoints ([`ModelCheckpoint`]).
    pub fn checkpoint_dir(&self) -> Option<&Path> {
        self.last_fit.checkpoints.as_deref()
    }

    /// Trains `module` on `train`, validating on `val` as configured; returns the last metrics.
    pub fn fit<M: Replicate, D: Dataset<Batch = M::Batch>>(
        &mut self,
        module: &mut Attached<M>,
        train: &DataLoader<D>,
        val: Option<&DataLoader<D>>,
    ) -> Result<Metrics, TrainerError> {
        self.fit_inner(module, train, val, None)
    }

    /// [`Trainer::fit`] resumed from the checkpoint `checkpoint` (a checkpoint directory, a
    /// checkpoint root, or a root's `last` file, as [`Checkpoint::open`] takes them): after
    /// `configure_sharded_model`, parameters, optimizer state, step, seed and data position
    /// are restored, at this trainer's world size whatever the checkpoint's. At the same
    /// world size the run continues bit-identically to one that was never interrupted, and
    /// its metrics file continues the run's (see [`TrainerBuilder::run_name`](crate::TrainerBuilder::run_name)).
    pub fn fit_from<M: Replicate, D: Dataset<Batch = M::Batch>>(
        &mut self,
        module: &mut Attached<M>,
        train: &DataLoader<D>,
        val: Option<&DataLoader<D>>,
        checkpoint: impl AsRef<Path>,
    ) -> Result<Metrics, TrainerError> {
        // Opened and checked whole once per process, before any rank starts: a bad path is
        // this call's error, not a rank's.
        let checkpoint = Checkpoint::open(checkpoint)?;
        self.fit_inner(module, train, val, Some(&checkpoint))
    }

    /// [`Trainer::fit`], resumed as [`Trainer::fit_from`] does from the newest checkpoint
    /// under the configured checkpoint root (the one its `last` file names) when there is
    /// one: the one call a requeued job makes on its first start and on every later one.
    /// Without a `last` file it starts fresh and says so on rank 0; a `last` that names a
    /// missing or damaged checkpoint is an error, never a fresh start.
    pub fn fit_or_resume<M: Replicate, D: Dataset<Batch = M::Batch>>(
        &mut self,
        module: &mut Attached<M>,
        train: &DataLoader<D>,
        val: Option<&DataLoader<D>>,
    ) -> Result<Metrics, TrainerError> {
        let root = match &self.config.checkpoint {
            Some(mc) => mc.root().to_path_buf(),
            None => {
                return Err(TrainerError::config(
                    "checkpoint",
                    "resuming from the newest checkpoint needs a checkpoint root \
                     (TrainerBuilder::checkpoint)",
                ))
            }
        };
        let checkpoint = Checkpoint::latest(&root)?;
        if checkpoint.is_none() && self.is_global_zero() {
            log::info!(
                "no checkpoint to resume in {} (it has no `last` file): starting fresh",
                root.display()
            );
        }
        self.fit_inner(module, train, val, checkpoint.as_ref())
    }

    fn fit_inner<M: Replicate, D: Dataset<Batch = M::Batch>>(
        &mut self,
        module: &mut Attached<M>,
        train: &DataLoader<D>,
        val: Option<&DataLoader<D>>,
        resume: Option<&Checkpoint>,
    ) -> Result<Metrics, TrainerError> {
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
            log_dir: outputs.run.as_deref(),
        };
        // Rank 0's sinks: the metrics file, then the program's own, lent for this fit and
        // put back whatever it returns.
        let mut own = std::mem::take(&mut self.sinks);
        let mut sinks = StepSinks::default();
        for log in outputs.logs {
            sinks.push(log);
        }
        if self.is_global_zero() {
            own.iter_mut().for_each(|s| sinks.push(s.as_mut()));
        }
        let outcome = self.launch().run_stage(module, Stage::Fit, &input, sinks);
        self.sinks = own;
        let output = outcome?.swap_remove(0);
        match output.interrupted {
            Some(interruption) => Err(interruption.into()),
            None => Ok(output.metrics),
        }
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
                let plan = LogPlan {
                    loggers: &self.config.loggers,
                    dir: &dir,
                    run_name: &self.config.run_name,
                    resumed_after: resume.filter(|_| continues).map(|c| c.manifest().step),
                    options: &self.config.run_options,
                    mlflow: self.config.mlflow.as_ref(),
                };
                let (logs, destinations) = plan.open()?;
                self.last_fit.metrics = destinations
                    .iter()
                    .find(|d| d.logger == Logger::Csv)
                    .map(|d| PathBuf::from(&d.location));
                self.last_fit.logs = destinations;
                out.logs = logs;
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
    pub fn validate<M: Replicate>(
        &mut self,
        module: &mut Attached<M>,
        data: &DataLoader<impl Dataset<Batch = M::Batch>>,
    ) -> Result<Metrics, TrainerError> {
        Ok(self.eval_stage(module, Stage::Validate, data)?.metrics)
    }

    /// One test pass; returns `test_loss` (if the module reports one).
    pub fn test<M: Replicate>(
        &mut self,
        module: &mut Attached<M>,
        data: &DataLoader<impl Dataset<Batch = M::Batch>>,
    ) -> Result<Metrics, TrainerError> {
        Ok(self.eval_stage(module, Stage::Test, data)?.metrics)
    }

    /// Predictions for every global batch of `data`, in dataset order: the ranks' slices,
    /// gathered over the world to rank 0. Under a launcher, the process of rank 0 gets them
    /// and the others get an empty list.
    pub fn predict<M: Replicate>(
        &mut self,
        module: &mut Attached<M>,
        data: &DataLoader<impl Dataset<Batch = M::Batch>>,
    ) -> Result<Vec<Tensor>, TrainerError> {
        Ok(self.eval_stage(module, Stage::Predict, data)?.predictions)
    }

    /// A validate, test or predict stage over `data`: this process's first rank's output.
    fn eval_stage<M: Replicate, D: Dataset<Batch = M::Batch>>(
        &mut self,
        module: &mut Attached<M>,
        stage: Stage,
        data: &DataLoader<D>,
    ) -> Result<RankOutput, TrainerError> {
        let loaders = StageInput::eval(data);
        Ok(self
            .launch()
            .run_stage(module, stage, &loaders, StepSinks::default())?
            .swap_remove(0))
    }
}
