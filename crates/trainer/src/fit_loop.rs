//! The fit loop of one rank: epochs and steps from where a resume left off, validation and
//! checkpoints when due, an early stop or a preemption the ranks agree on. What a step
//! reports goes to its sinks ([`StepSinks`]).

use crate::metrics_csv::Row;
use crate::preemption::Interruption;
use crate::rank_run::{Eval, RankRun, StageInput};
use crate::resume::FitSaves;
use crate::sinks::StepSinks;
use crate::{DataLoader, Dataset, TrainerError};
use std::time::Instant;

/// The metric that counts the steps skipped for inf or NaN gradients.
pub(crate) const SKIPPED_STEPS: &str = "skipped_steps";
use wick_core::{ReduceOp, TrainModule};

impl<M: TrainModule> RankRun<'_, M> {
    /// Fits on `train`; returns how a preemption stopped it, if one did.
    pub(crate) fn fit<D: Dataset<Batch = M::Batch>>(
        &mut self,
        train: &DataLoader<D>,
        val: Option<&DataLoader<D>>,
        input: &StageInput<'_, D>,
    ) -> Result<Option<Interruption>, TrainerError> {
        let resume = input.resume;
        let mut optimizer = self.module.configure_optimizers();
        optimizer
            .schedule
            .validate()
            .map_err(|e| TrainerError::config("lr schedule", e))?;
        self.strategy.configure_optimizer(&optimizer)?;
        self.strategy
            .set_clip_grad_norm(self.config.gradient_clip_val);
        let accumulate = self.config.accumulate_grad_batches;
        // Optimizer steps per epoch; trailing micro-batches that cannot fill a step are skipped.
        let per_epoch = train.batches_per_epoch() / accumulate;
        let seed = match resume {
            Some(checkpoint) => self.restore(checkpoint, train, &mut optimizer)?,
            None => self.config.seed,
        };
        // The checkpoint resumed from already holds the state at its step.
        let mut saves = FitSaves::resumed_at(self.state.global_step, resume);
        let (start_epoch, start_batch) = (
            self.state.global_step / per_epoch,
            self.state.global_step % per_epoch,
        );

        let max_epochs = match (self.config.max_epochs, self.config.max_steps) {
            (Some(e), _) => e,
            (None, Some(_)) => usize::MAX,
            (None, None) => 1,
        };
        let total_steps = self
            .config
            .max_steps
            .unwrap_or(usize::MAX)
            .min(per_epoch.saturating_mul(max_epochs));
        let bar = self
            .progress
            .as_ref()
            .map(|p| p.train(total_steps, self.state.global_step));
        let mut sinks = StepSinks::new(self.csv.take(), bar);

        self.callbacks(|cb, s| cb.on_fit_start(s))?;
        self.module.on_fit_start()?;
        // The first backward of this fit looks for parameters that get no gradient.
        let mut checked_unused = false;
        let tokens_per_step =
            (train.batch_size() * accumulate * train.dataset().tokens_per_sample()) as f64;
        'epochs: for epoch in start_epoch..max_epochs {
            self.state.epoch = epoch;
            let epoch_start = Instant::now();
            let order = train.epoch_order(seed, epoch);
            let first = if epoch == start_epoch { start_batch } else { 0 };
            for b in first..per_epoch {
                if self.state.global_step >= total_steps {
                    break 'epochs;
                }
                let (step_start, waited_before) = (Instant::now(), self.clock.waited());
                let train_loss =
                    self.train_step(train, &order, b, &optimizer, &mut checked_unused)?;
                self.state.global_step += 1;
                if self.state.global_step == 1 {
                    self.print_model_summary();
                }
                let tokens_per_s = tokens_per_step / step_start.elapsed().as_secs_f64().max(1e-9);
                let comm_wait_s = (self.clock.waited() - waited_before).as_secs_f64();
                self.state.metrics.insert("train_loss".into(), train_loss);
                // Steps skipped for inf or NaN gradients, all ranks alike, over the run (a
                // resume restores the count from its checkpoint's metrics).
                let skipped = self.skipped_steps() + usize::from(self.strategy.last_step_skipped());
                self.state
                    .metrics
                    .insert(SKIPPED_STEPS.into(), skipped as f64);
                // Metrics stay deterministic; wall-clock figures go to the CSV only.
                if let Some(scale) = self.strategy.loss_scale() {
                    self.state.metrics.insert("loss_scale".into(), scale.scale);
                }
                self.callbacks(|cb, s| cb.on_train_batch_end(s))?;

                let validate_now = val.is_some()
                    && match self.config.val_check_interval {
                        Some(n) => self.state.global_step % n == 0,
                        None => b + 1 == per_epoch,
                    };
                let val_loss = match val {
                    Some(val) if validate_now => self.evaluate(val, Eval::Validation)?,
                    _ => None,
                };
                sinks.step_end(&Row {
                    step: self.state.global_step,
                    epoch,
                    train_loss,
                    val_loss,
                    lr: self.state.lr,
                    skipped_steps: self.skipped_steps(),
                    tokens_per_s,
                    epoch_time_s: epoch_start.elapsed().as_secs_f64(),
                    comm_wait_s,
                })?;
                saves.poll()?;
                if let Some(mc) = input.checkpoint {
                    if mc.due(self.state.global_step) {
                        let (run, wait) = (input.run, false);
                        self.save_checkpoint(mc, run, train, &optimizer, seed, &mut saves, wait)?;
                    }
                }
                match self.stop_requested()? {
                    Stop::Continue => {}
                    Stop::Early => break 'epochs,
                    Stop::Preempted => {
                        // The save in flight first (it may be this very step's).
                        self.finish_saves(&mut saves)?;
                        let step = self.state.global_step;
                        let checkpoint = match (input.checkpoint, saves.last.clone()) {
                            (None, _) => None,
                            (Some(_), Some((saved, dir))) if saved == step => Some(dir),
                            (Some(mc), _) => {
                                let (run, wait) = (input.run, true);
                                let saves = &mut saves;
                                Some(self.save_checkpoint(
                                    mc, run, train, &optimizer, seed, saves, wait,
                                )?)
                            }
                        };
                        sinks.finish()?;
                        let signal = self.config.preemption.as_ref().and_then(|p| p.requested());
                        return Ok(Some(Interruption {
                            signal,
                            step,
                            checkpoint,
                        }));
                    }
                }
            }
        }
        self.finish_saves(&mut saves)?;
        if let Some(mc) = input.checkpoint {
            let step = self.state.global_step;
            if mc.saves_at_end() && saves.last_step() != Some(step) {
                let (run, wait) = (input.run, true);
                self.save_checkpoint(mc, run, train, &optimizer, seed, &mut saves, wait)?;
            }
        }
        sinks.finish()?;
        self.callbacks(|cb, s| cb.on_fit_end(s))?;
        self.module.on_fit_end()?;
        Ok(None)
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
