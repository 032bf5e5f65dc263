//! A fit's checkpoints on one rank, kept as torchtitan's `CheckpointManager` keeps them: it
//! decides when a save is due (the rules of a [`ModelCheckpoint`]) and how (in the
//! background when the rules ask for it and nothing waits on the result, otherwise before
//! the call returns), and holds the save still in flight and the step saved last. The fit
//! loop only tells it where the fit stands: after a step, on a preemption, at the end.

use crate::checkpoint::{DataPosition, PendingSave, SaveInfo};
use crate::loops::{FitProgress, RankContext};
use crate::{Checkpoint, DataLoader, Dataset, ModelCheckpoint, TrainerError};
use std::path::PathBuf;
use wick_core::{OptimizerConfig, TrainModule};

/// What a save records beside the strategy's state and the step's metrics: the fit's
/// optimizer, the seed of its data order, and how its data loader advances.
pub(crate) struct SaveBasis {
    pub(crate) optimizer: OptimizerConfig,
    /// The seed of the data order (the checkpoint's, when resumed).
    pub(crate) seed: u64,
    pub(crate) data: DataPlan,
}

/// How a fit's data loader advances by optimizer steps, to say where it stands after one.
#[derive(Clone, Copy)]
pub(crate) struct DataPlan {
    /// Optimizer steps per epoch (at least one).
    steps_per_epoch: usize,
    batch_size: usize,
    accumulate: usize,
    dataset_len: usize,
}

impl DataPlan {
    /// The plan of `train` with `accumulate` global batches per optimizer step.
    pub(crate) fn of<D: Dataset>(train: &DataLoader<D>, accumulate: usize) -> Self {
        DataPlan {
            steps_per_epoch: (train.batches_per_epoch() / accumulate).max(1),
            batch_size: train.batch_size(),
            accumulate,
            dataset_len: train.dataset().len(),
        }
    }

    /// Where the data loader stands after `step` optimizer steps.
    pub(crate) fn at(&self, step: usize) -> DataPosition {
        DataPosition {
            epoch: step / self.steps_per_epoch,
            batch: step % self.steps_per_epoch,
            batch_size: self.batch_size,
            accumulate: self.accumulate,
            dataset_len: self.dataset_len,
        }
    }
}

/// One rank's checkpoints of one fit.
pub(crate) struct CheckpointManager<'f> {
    /// When and how to save; `None`: the fit saves nothing.
    rules: Option<&'f ModelCheckpoint>,
    /// The run's log directory, recorded in each checkpoint.
    run: Option<&'f str>,
    /// The last step saved (or resumed from), and its directory.
    last: Option<(usize, PathBuf)>,
    /// The save whose files are still being written.
    pending: Option<PendingSave>,
}

impl<'f> CheckpointManager<'f> {
    /// The checkpoints of a fit saving under `rules`, resumed from `resumed` at `step`
    /// (which already holds the state of that step) or starting afresh.
    pub(crate) fn new(
        rules: Option<&'f ModelCheckpoint>,
        run: Option<&'f str>,
        resumed: Option<&Checkpoint>,
        step: usize,
    ) -> Self {
        CheckpointManager {
            rules,
            run,
            last: resumed.map(|c| (step, c.dir().to_path_buf())),
            pending: None,
        }
    }

    /// A step ended: a background write that failed is this rank's error now, rank 0
    /// commits a save whose files are all written (no collective), and the step is saved if
    /// the rules say it is due, in the background when they ask for that.
    pub(crate) fn step_end<M: TrainModule>(
        &mut self,
        ctx: &RankContext<'_, M>,
        basis: &SaveBasis,
        progress: FitProgress,
    ) -> Result<(), TrainerError> {
        if let Some(pending) = &mut self.pending {
            pending.poll()?;
        }
        match self.rules {
            Some(rules) if rules.due(progress.step) => {
                self.save(rules, ctx, basis, progress, rules.is_async())?;
                Ok(())
            }
            _ => Ok(()),
        }
    }

    /// The fit stops on a preemption after this step: the save in flight is finished, and
    /// the directory of a whole checkpoint of this step returned (saved now, before this
    /// returns, unless the step was saved already); `None` when the fit saves nothing.
    pub(crate) fn preempted<M: TrainModule>(
        &mut self,
        ctx: &RankContext<'_, M>,
        basis: &SaveBasis,
        progress: FitProgress,
    ) -> Result<Option<PathBuf>, TrainerError> {
        self.wait_for_save(ctx)?;
        let step = progress.step;
        match (self.rules, &self.last) {
            (None, _) => Ok(None),
            (Some(_), Some((saved, dir))) if *saved == step => Ok(Some(dir.clone())),
            (Some(rules), _) => self.save(rules, ctx, basis, progress, false).map(Some),
        }
    }

    /// The fit ended: the save in flight is finished, and the last step saved (before this
    /// returns) when the rules save at the end and it was not saved already.
    pub(crate) fn fit_end<M: TrainModule>(
        &mut self,
        ctx: &RankContext<'_, M>,
        basis: &SaveBasis,
        progress: FitProgress,
    ) -> Result<(), TrainerError> {
        self.wait_for_save(ctx)?;
        let step = progress.step;
        let saved_last = self.last.as_ref().map(|(s, _)| *s);
        match self.rules {
            Some(rules) if rules.saves_at_end() && saved_last != Some(step) => {
                self.save(rules, ctx, basis, progress, false)?;
                Ok(())
            }
            _ => Ok(()),
        }
    }

    /// Saves this step from every rank, after finishing the save still in flight, if any:
    /// in the background if `background` ([`PendingSave`]), otherwise before this returns,
    /// when `last` names it. Returns its directory.
    fn save<M: TrainModule>(
        &mut self,
        rules: &ModelCheckpoint,
        ctx: &RankContext<'_, M>,
        basis: &SaveBasis,
        progress: FitProgress,
        background: bool,
    ) -> Result<PathBuf, TrainerError> {
        self.wait_for_save(ctx)?;
        let step = progress.step;
        let dir = rules.dir_for(step);
        let data = basis.data.at(step);
        let info = SaveInfo {
            step,
            epoch: data.epoch,
            skipped_steps: progress.skipped_steps,
            seed: basis.seed,
            optimizer: &basis.optimizer,
            data,
            metrics: ctx.callbacks.state.metrics.clone(),
            run: self.run.map(str::to_string),
            attachments: rules.attachments(),
        };
        let (world, strategy) = (ctx.env.world.as_ref(), &*ctx.strategy);
        if background {
            let (write, commit) = crate::checkpoint::begin(world, strategy, &dir, &info, rules)?;
            self.pending = Some(PendingSave::start(write, commit, dir.clone()));
        } else {
            crate::checkpoint::save(world, strategy, &dir, &info, rules)?;
        }
        self.last = Some((step, dir.clone()));
        Ok(dir)
    }

    /// Waits for the save in flight, if any, until its checkpoint is whole (a collective).
    fn wait_for_save<M: TrainModule>(
        &mut self,
        ctx: &RankContext<'_, M>,
    ) -> Result<(), TrainerError> {
        match self.pending.take() {
            Some(pending) => pending.wait_and_commit(ctx.env.world.as_ref(), &ctx.env.device),
            None => Ok(()),
        }
    }
}
