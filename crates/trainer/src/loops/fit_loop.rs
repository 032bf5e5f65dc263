//! The fit loop of one rank, an object as Lightning's `FitLoop` is: what the fit runs
//! over, how far it goes and where it stands (epochs and steps from where a resume left
//! off), validation when due, an early stop or a preemption the ranks agree on. What a step
//! reports goes to the rank's sinks ([`crate::StepSink`]); when to save is the
//! [`CheckpointManager`]'s to decide.

use super::model_summary::log_model_summary;
use super::resume::{restore, Resumed};
use super::{EvalKind, EvalLoop, FitProgress, RankContext, StageInput, Stop, StopVote, TrainStep};
use crate::logging::sinks::StepRecord;
use crate::loops::checkpoint_manager::{CheckpointManager, DataPlan, SaveBasis};
use crate::preemption::Interruption;
use crate::{DataLoader, Dataset, EpochOrder, TrainerError};
use std::time::Instant;
use wick_core::{CollectiveExt, ReduceOp, StepOptions, TrainModule};

/// One rank's fit: set up by [`FitLoop::new`] (optimizer, resumed state), run by
/// [`FitLoop::run`].
pub(crate) struct FitLoop<'f, D> {
    /// Where the fit stands.
    progress: FitProgress,
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
        ctx: &RankContext<'_, M>,
        tokens_per_sample: usize,
    ) -> Result<Option<Self>, TrainerError> {
        let Some(per_token) = ctx.module.flops_per_token(tokens_per_sample) else {
            return Ok(None);
        };
        let world_size = ctx.env.world.world_size();
        let own = wick_accelerator::rank_peak_flops(&ctx.env.device, world_size)?;
        let world_peak = ctx.env.world.all_reduce_scalar(own as f32, ReduceOp::Sum)? as f64;
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
    /// The fit of `input` on `ctx`'s rank: its optimizer configured, the checkpoint it
    /// resumes from (if any) restored, the training bar added to the sinks.
    pub(crate) fn new<M: TrainModule<Batch = D::Batch>>(
        ctx: &mut RankContext<'_, M>,
        train: &'f DataLoader<D>,
        val: Option<&'f DataLoader<D>>,
        input: &StageInput<'f, D>,
    ) -> Result<Self, TrainerError> {
        let mut optimizer = ctx.module.configure_optimizers();
        optimizer
            .schedule
            .validate()
            .map_err(|e| TrainerError::config("lr schedule", e))?;
        // The first backward of each fit looks for parameters without gradient.
        let step_options = StepOptions {
            clip_grad_norm: ctx.config.gradient_clip_val,
            on_nonfinite: ctx.config.on_nonfinite,
            find_unused_parameters: true,
        };
        ctx.strategy.configure_optimizer(&optimizer, step_options);
        let accumulate = ctx.config.accumulate_grad_batches;
        let per_epoch = train.batches_per_epoch() / accumulate;
        let Resumed { progress, seed } = match input.resume {
            Some(checkpoint) => restore(ctx, checkpoint, train, &mut optimizer)?,
            None => Resumed {
                progress: FitProgress::default(),
                seed: ctx.config.seed,
            },
        };
        progress.show(&mut ctx.callbacks.state);
        let step = progress.step;
        let checkpoints =
            CheckpointManager::new(input.checkpoint, input.log_dir, input.resume, step);
        let max_epochs = match (ctx.config.max_epochs, ctx.config.max_steps) {
            (Some(e), _) => e,
            (None, Some(_)) => usize::MAX,
            (None, None) => 1,
        };
        let total_steps = ctx
            .config
            .max_steps
            .unwrap_or(usize::MAX)
            .min(per_epoch.saturating_mul(max_epochs));
        if let Some(p) = &ctx.bars {
            let bar = p.train(total_steps, step);
            ctx.sinks.push(bar);
        }
        Ok(FitLoop {
            progress,
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
            flops: Flops::measure(ctx, train.dataset().tokens_per_sample())?,
            checkpoints,
        })
    }

    /// Runs the fit to its end on `ctx`'s rank; returns how a preemption stopped it, if one
    /// did.
    pub(crate) fn run<M: TrainModule<Batch = D::Batch>>(
        mut self,
        ctx: &mut RankContext<'_, M>,
    ) -> Result<Option<Interruption>, TrainerError> {
        ctx.callbacks.call(|cb, s| cb.on_fit_start(s))?;
        ctx.module.on_fit_start()?;
        let (start_epoch, start_batch) = (
            self.progress.step / self.per_epoch,
            self.progress.step % self.per_epoch,
        );
        'epochs: for epoch in start_epoch..self.max_epochs {
            self.progress.epoch = epoch;
            self.progress.show(&mut ctx.callbacks.state);
            let epoch_start = Instant::now();
            let order = self.train.epoch_order(self.basis.seed, epoch);
            let first = if epoch == start_epoch { start_batch } else { 0 };
            for b in first..self.per_epoch {
                if self.progress.step >= self.total_steps {
                    break 'epochs;
                }
                self.step(ctx, &order, b, epoch_start)?;
                match vote(ctx)? {
                    Stop::Continue => {}
                    Stop::Early => break 'epochs,
                    Stop::Preempted => {
                        let (basis, progress) = (&self.basis, self.progress);
                        let checkpoint = self.checkpoints.preempted(ctx, basis, progress)?;
                        ctx.sinks.finish()?;
                        let signal = ctx.config.preemption.as_ref().and_then(|p| p.requested());
                        return Ok(Some(Interruption {
                            signal,
                            step: self.progress.step,
                            checkpoint,
                        }));
                    }
                }
            }
        }
        self.checkpoints.fit_end(ctx, &self.basis, self.progress)?;
        ctx.sinks.finish()?;
        ctx.callbacks.call(|cb, s| cb.on_fit_end(s))?;
        ctx.module.on_fit_end()?;
        Ok(None)
    }

    /// Optimizer step `b` of the epoch whose sample order is `order` (begun at
    /// `epoch_start`): the step, its metrics and callbacks, validation when due, the record
    /// to the sinks, and a checkpoint when due.
    fn step<M: TrainModule<Batch = D::Batch>>(
        &mut self,
        ctx: &mut RankContext<'_, M>,
        order: &EpochOrder,
        b: usize,
        epoch_start: Instant,
    ) -> Result<(), TrainerError> {
        let (step_start, waited_before) = (Instant::now(), ctx.clock.waited());
        let logs = ctx.env.rank == 0;
        if logs {
            wick_accelerator::reset_memory_peak(&ctx.env.device);
        }
        let lr = self.basis.optimizer.lr_at(self.progress.step);
        ctx.callbacks.state.lr = lr;
        let step = TrainStep {
            train: self.train,
            order,
            index: b,
            number: self.progress.step + 1,
            lr,
        };
        let outcome = step.run(ctx)?;
        let peak_memory_bytes = logs
            .then(|| wick_accelerator::memory_peak(&ctx.env.device))
            .flatten();
        let report = outcome.report;
        self.progress.step += 1;
        // The norm is the global one, so every rank ends here alike.
        if self.progress.step == 1 && report.grad_norm == Some(0.0) {
            return Err(TrainerError::ZeroGradient);
        }
        // Steps skipped for inf or NaN gradients, all ranks alike, over the run.
        self.progress.skipped_steps += usize::from(report.skipped);
        if self.progress.step == 1 {
            log_model_summary(ctx);
        }
        let tokens_per_s = self.tokens_per_step / step_start.elapsed().as_secs_f64().max(1e-9);
        let comm_wait_s = (ctx.clock.waited() - waited_before).as_secs_f64();
        let state = &mut ctx.callbacks.state;
        state.metrics.insert("train_loss".into(), outcome.loss);
        for (name, value) in &outcome.module_metrics {
            state.metrics.insert(name.to_string(), *value);
        }
        self.progress.show(state);
        // Metrics stay deterministic; wall-clock figures go to the sinks only.
        if let Some(scale) = report.loss_scale {
            state.metrics.insert("loss_scale".into(), scale.scale);
        }
        ctx.callbacks.call(|cb, s| cb.on_train_batch_end(s))?;

        let validate_now = self.val.is_some()
            && match ctx.config.val_check_interval {
                Some(n) => self.progress.step.is_multiple_of(n),
                None => b + 1 == self.per_epoch,
            };
        let val_loss = match self.val {
            Some(data) if validate_now => {
                let kind = EvalKind::Validation;
                EvalLoop { data, kind }.run(ctx)?
            }
            _ => None,
        };
        ctx.sinks.step_end(&StepRecord {
            step: self.progress.step,
            epoch: self.progress.epoch,
            train_loss: outcome.loss,
            val_loss,
            lr,
            skipped_steps: self.progress.skipped_steps,
            tokens_per_s,
            epoch_time_s: epoch_start.elapsed().as_secs_f64(),
            comm_wait_s,
            grad_norm: report.grad_norm,
            peak_memory_bytes,
            mfu: self.flops.map(|f| f.utilisation(tokens_per_s)),
            module_metrics: outcome.module_metrics,
        })?;
        self.checkpoints.step_end(ctx, &self.basis, self.progress)
    }
}

/// Whether to stop after this step: a callback on some rank asked (with
/// `RunState::request_stop`), or a preemption reached some rank. The ranks decide together
/// ([`StopVote`]), so all stop after the same step; with neither callbacks nor a preemption
/// nothing can ask, and no collective is spent.
fn vote<M>(ctx: &mut RankContext<'_, M>) -> Result<Stop, TrainerError> {
    let preemption = ctx.config.preemption.as_ref();
    if ctx.callbacks.is_empty() && preemption.is_none() {
        return Ok(Stop::Continue);
    }
    let vote = StopVote {
        stop_asked: ctx.callbacks.state.take_stop_request(),
        preempted: preemption.is_some_and(|p| p.requested().is_some()),
    };
    vote.agree(ctx.env.world.as_ref())
}
