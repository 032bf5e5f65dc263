//! The fit loop of one rank, an object as Lightning's `FitLoop` is: what the fit runs
//! over, how far it goes and where it stands (epochs and steps from where a resume left
//! off), validation when due, an early stop or a preemption the ranks agree on. What a step
//! reports goes to the rank's sinks ([`crate::StepSink`]); when to save is the
//! [`CheckpointManager`]'s to decide.

use crate::checkpoint_manager::{CheckpointManager, DataPlan, SaveBasis};
use crate::preemption::Interruption;
use crate::rank_run::{Eval, RankRun, StageInput, SKIPPED_STEPS};
use crate::sinks::StepRecord;
use crate::{DataLoader, Dataset, TrainerError};
use std::time::Instant;
use wick_core::{ReduceOp, StepOptions, TrainModule};

/// One rank's fit: set up by [`FitLoop::new`] (optimizer, resumed state), run by
/// [`FitLoop::run`].
pub(crate) struct FitLoop<'f, D> {
    train: &'f DataLoader<D>,
    val: Option<&'f DataLoader<D>>,
    /// The optimizer, the seed of the data order and the data plan, as saves record them.
    basis: SaveBasis,
    /// Optimizer steps per epoch; trailing micro-batches that cannot fill a step are skipped.
    per_epoch: usize,
    max_epochs: usize,
    /// The step the fit ends after.
    total_steps: usize,
    tokens_per_step: f64,
    /// The model FLOPs of a token and the world's matmul peak, for the `mfu` rank 0 logs
    /// (when the module gives its FLOPs).
    flops: Option<Flops>,
    checkpoints: CheckpointManager<'f>,
}

/// What the model FLOPs utilisation of a step is made of.
#[derive(Clone, Copy, Debug)]
struct Flops {
    per_token: f64,
    /// The sum over the ranks of each rank's measured matmul rate, in FLOP/s.
    world_peak: f64,
}

impl Flops {
    /// The world's peak for `module`'s FLOPs, if it gives them: every rank measures its own
    /// device's rate at once (ranks that share a host's cores each in their own share; once
    /// per process for a shape, [`wick_accelerator::rank_peak_flops`]) and the world adds
    /// them up.
    fn measure<M: TrainModule>(
        rank: &RankRun<'_, M>, tokens_per_sample: usize,
    ) -> Result<Option<Self>, TrainerError> {
        let Some(per_token) = rank.module.flops_per_token(tokens_per_sample) else {
            return Ok(None);
        };
        let world_size = rank.env.world.world_size();
        let own = wick_accelerator::rank_peak_flops(&rank.env.device, world_size)?;
        let world_peak = rank
            .env
            .world
            .all_reduce_scalar(own as f32, ReduceOp::Sum)? as f64;
        Ok(Some(Flops {
            per_token,
            world_peak,
        }))
    }

    /// The utilisation of a step that trained `tokens_per_s` over the world.
    fn utilisation(&self, tokens_per_s: f64) -> f64 {
        tokens_per_s * self.per_token / self.world_peak.max(1.0)
    }
}

impl<'f, D: Dataset> FitLoop<'f, D> {
    /// The fit of `input` on `rank`: its optimizer configured, the checkpoint it resumes
    /// from (if any) restored, the training bar added to the sinks.
    pub(crate) fn new<M: TrainModule<Batch = D::Batch>>(
        rank: &mut RankRun<'_, M>, train: &'f DataLoader<D>, val: Option<&'f DataLoader<D>>,
        input: &StageInput<'f, D>,
    ) -> Result<Self, TrainerError> {
        let mut optimizer = rank.module.configure_optimizers();
        optimizer
            .schedule
            .validate()
            .map_err(|e| TrainerError::config("lr schedule", e))?;
        // The first backward of each fit looks for parameters without gradient.
        let step_options = StepOptions {
            clip_grad_norm: rank.config.gradient_clip_val,
            on_nonfinite: rank.config.on_nonfinite,
            find_unused_parameters: true,
        };
        rank.strategy
            .configure_optimizer(&optimizer, step_options)?;
        let accumulate = rank.config.accumulate_grad_batches;
        let per_epoch = train.batches_per_epoch() / accumulate;
        let seed = match input.resume {
            Some(checkpoint) => rank.restore(checkpoint, train, &mut optimizer)?,
            None => rank.config.seed,
        };
        let step = rank.state.global_step;
        let checkpoints = CheckpointManager::new(input.checkpoint, input.run, input.resume, step);
        let max_epochs = match (rank.config.max_epochs, rank.config.max_steps) {
            (Some(e), _) => e,
            (None, Some(_)) => usize::MAX,
            (None, None) => 1,
        };
        let total_steps = rank
            .config
            .max_steps
            .unwrap_or(usize::MAX)
            .min(per_epoch.saturating_mul(max_epochs));
        if let Some(p) = &rank.progress {
            let bar = p.train(total_steps, step);
            rank.sinks.push(bar);
        }
        Ok(FitLoop {
            train,
            val,
            basis: SaveBasis {
                optimizer,
                seed,
                data: DataPlan::of(train, accumulate),
            },
            per_epoch,
            max_epochs,
            total_steps,
            tokens_per_step: (train.batch_size() * accumulate * train.dataset().tokens_per_sample())
                as f64,
            flops: Flops::measure(rank, train.dataset().tokens_per_sample())?,
            checkpoints,
        })
    }

    /// Runs the fit to its end on `rank`; returns how a preemption stopped it, if one did.
    pub(crate) fn run<M: TrainModule<Batch = D::Batch>>(
        mut self, rank: &mut RankRun<'_, M>,
    ) -> Result<Option<Interruption>, TrainerError> {
        rank.callbacks(|cb, s| cb.on_fit_start(s))?;
        rank.module.on_fit_start()?;
        let (start_epoch, start_batch) = (
            rank.state.global_step / self.per_epoch,
            rank.state.global_step % self.per_epoch,
        );
        'epochs: for epoch in start_epoch..self.max_epochs {
            rank.state.epoch = epoch;
            let epoch_start = Instant::now();
            let order = self.train.epoch_order(self.basis.seed, epoch);
            let first = if epoch == start_epoch { start_batch } else { 0 };
            for b in first..self.per_epoch {
                if rank.state.global_step >= self.total_steps {
                    break 'epochs;
                }
                self.step(rank, &order, b, epoch_start)?;
                match rank.stop_requested()? {
                    Stop::Continue => {}
                    Stop::Early => break 'epochs,
                    Stop::Preempted => {
                        let checkpoint = self.checkpoints.preempted(rank, &self.basis)?;
                        rank.sinks.finish()?;
                        let signal = rank.config.preemption.as_ref().and_then(|p| p.requested());
                        return Ok(Some(Interruption {
                            signal,
                            step: rank.state.global_step,
                            checkpoint,
                        }));
                    }
                }
            }
        }
        self.checkpoints.fit_end(rank, &self.basis)?;
        rank.sinks.finish()?;
        rank.callbacks(|cb, s| cb.on_fit_end(s))?;
        rank.module.on_fit_end()?;
        Ok(None)
    }

    /// Optimizer step `b` of the epoch whose sample order is `order` (begun at
    /// `epoch_start`): the step, its metrics and callbacks, validation when due, the record
    /// to the sinks, and a checkpoint when due.
    fn step<M: TrainModule<Batch = D::Batch>>(
        &mut self, rank: &mut RankRun<'_, M>, order: &[usize], b: usize, epoch_start: Instant,
    ) -> Result<(), TrainerError> {
        let (step_start, waited_before) = (Instant::now(), rank.clock.waited());
        let logs = rank.env.rank == 0;
        if logs {
            wick_accelerator::reset_memory_peak(&rank.env.device);
        }
        let (train_loss, report) = rank.train_step(self.train, order, b, &self.basis.optimizer)?;
        let peak_memory_bytes = logs
            .then(|| wick_accelerator::memory_peak(&rank.env.device))
            .flatten();
        rank.state.global_step += 1;
        if rank.state.global_step == 1 {
            rank.log_model_summary();
        }
        let tokens_per_s = self.tokens_per_step / step_start.elapsed().as_secs_f64().max(1e-9);
        let comm_wait_s = (rank.clock.waited() - waited_before).as_secs_f64();
        rank.state.metrics.insert("train_loss".into(), train_loss);
        // Steps skipped for inf or NaN gradients, all ranks alike, over the run (a resume
        // restores the count from its checkpoint's metrics).
        let skipped = rank.skipped_steps() + usize::from(report.skipped);
        rank.state
            .metrics
            .insert(SKIPPED_STEPS.into(), skipped as f64);
        // Metrics stay deterministic; wall-clock figures go to the sinks only.
        if let Some(scale) = report.loss_scale {
            rank.state.metrics.insert("loss_scale".into(), scale.scale);
        }
        rank.callbacks(|cb, s| cb.on_train_batch_end(s))?;

        let validate_now = self.val.is_some()
            && match rank.config.val_check_interval {
                Some(n) => rank.state.global_step.is_multiple_of(n),
                None => b + 1 == self.per_epoch,
            };
        let val_loss = match self.val {
            Some(val) if validate_now => rank.evaluate(val, Eval::Validation)?,
            _ => None,
        };
        rank.sinks.step_end(&StepRecord {
            step: rank.state.global_step,
            epoch: rank.state.epoch,
            train_loss,
            val_loss,
            lr: rank.state.lr,
            skipped_steps: rank.skipped_steps(),
            tokens_per_s,
            epoch_time_s: epoch_start.elapsed().as_secs_f64(),
            comm_wait_s,
            grad_norm: report.grad_norm,
            peak_memory_bytes,
            mfu: self.flops.map(|f| f.utilisation(tokens_per_s)),
        })?;
        self.checkpoints.step_end(rank, &self.basis)
    }
}

impl<M: TrainModule> RankRun<'_, M> {
    /// Fits on `train`; returns how a preemption stopped it, if one did.
    pub(crate) fn fit<D: Dataset<Batch = M::Batch>>(
        &mut self, train: &DataLoader<D>, val: Option<&DataLoader<D>>, input: &StageInput<'_, D>,
    ) -> Result<Option<Interruption>, TrainerError> {
        FitLoop::new(self, train, val, input)?.run(self)
    }

    /// The steps skipped so far for inf or NaN gradients.
    pub(crate) fn skipped_steps(&self) -> usize {
        self.state
            .metrics
            .get(SKIPPED_STEPS)
            .map_or(0, |&n| n as usize)
    }

    /// Whether to stop after this step: a callback on some rank asked (with
    /// `RunState::request_stop`), or a preemption reached some rank. The ranks decide
    /// together in one scalar all-reduce, so all stop after the same step; with neither
    /// callbacks nor a preemption nothing can ask, and no collective is spent.
    fn stop_requested(&mut self) -> Result<Stop, TrainerError> {
        let preemption = self.config.preemption.as_ref();
        if self.callbacks.is_empty() && preemption.is_none() {
            return Ok(Stop::Continue);
        }
        // Callbacks' requests count in units, signals in units of W + 1: the sum tells both.
        let signal_unit = (self.env.world_size + 1) as f32;
        let asked = f32::from(u8::from(self.state.take_stop_request()));
        let signaled = f32::from(u8::from(
            preemption.is_some_and(|p| p.requested().is_some()),
        ));
        let sum = self
            .env
            .world
            .all_reduce_scalar(asked + signal_unit * signaled, ReduceOp::Sum)?;
        Ok(if sum >= signal_unit {
            Stop::Preempted
        } else if sum > 0.0 {
            Stop::Early
        } else {
            Stop::Continue
        })
    }
}

/// What the ranks agreed to do after a step.
enum Stop {
    Continue,
    /// A callback asked (early stopping): fit ends as at its last step.
    Early,
    /// A preemption: save this step and return [`TrainerError::Interrupted`].
    Preempted,
}
