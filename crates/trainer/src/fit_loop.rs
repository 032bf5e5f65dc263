//! The fit loop of one rank: epochs and steps from where a resume left off, validation and
//! checkpoints when due, an early stop the ranks agree on. What a step reports goes to its
//! sinks ([`StepSinks`]).

use crate::metrics_csv::Row;
use crate::rank_run::{Eval, RankRun, StageInput};
use crate::sinks::StepSinks;
use crate::{DataLoader, Dataset, TrainerError};
use std::time::Instant;
use wick_core::{ReduceOp, TrainModule};

impl<M: TrainModule> RankRun<'_, M> {
    pub(crate) fn fit<D: Dataset<Batch = M::Batch>>(
        &mut self,
        train: &DataLoader<D>,
        val: Option<&DataLoader<D>>,
        input: &StageInput<'_, D>,
    ) -> Result<(), TrainerError> {
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
        let mut last_saved = resume.map(|_| self.state.global_step);
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
                    tokens_per_s,
                    epoch_time_s: epoch_start.elapsed().as_secs_f64(),
                    comm_wait_s,
                })?;
                if let Some(mc) = input.checkpoint {
                    if mc.due(self.state.global_step) {
                        self.save_checkpoint(mc, input.run, train, &optimizer, seed)?;
                        last_saved = Some(self.state.global_step);
                    }
                }
                if self.stop_requested()? {
                    break 'epochs;
                }
            }
        }
        if let Some(mc) = input.checkpoint {
            let step = self.state.global_step;
            if mc.saves_at_end() && last_saved != Some(step) {
                self.save_checkpoint(mc, input.run, train, &optimizer, seed)?;
            }
        }
        sinks.finish()?;
        self.callbacks(|cb, s| cb.on_fit_end(s))?;
        self.module.on_fit_end()?;
        Ok(())
    }

    /// Whether a callback on any rank asked to stop (with `RunState::request_stop`): the
    /// ranks decide together, so all stop after the same step. Without callbacks nothing
    /// can ask, and no collective is spent.
    fn stop_requested(&mut self) -> Result<bool, TrainerError> {
        if self.callbacks.is_empty() {
            return Ok(false);
        }
        let asked = f32::from(u8::from(self.state.take_stop_request()));
        Ok(self.env.world.all_reduce_scalar(asked, ReduceOp::Sum)? > 0.0)
    }
}
