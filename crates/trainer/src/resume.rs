//! A fit's checkpoints on one rank: restoring the state it resumes from, and saving the
//! state of a step.

use crate::checkpoint::{DataPosition, PendingSave, SaveInfo};
use crate::rank_run::RankRun;
use crate::{Checkpoint, CheckpointError, DataLoader, Dataset, ModelCheckpoint, TrainerError};
use std::path::PathBuf;
use wick_core::{LrSchedule, OptimizerConfig, TrainModule};

impl<M: TrainModule> RankRun<'_, M> {
    /// Restores parameters, optimizer state, step and data position from `checkpoint`, and
    /// the learning-rate schedule, which continues from the checkpoint's step
    /// (replacing the module's if they differ, as Lightning restores a scheduler); returns
    /// the seed of the data order to continue with.
    pub(crate) fn restore<D: Dataset<Batch = M::Batch>>(
        &mut self,
        checkpoint: &Checkpoint,
        train: &DataLoader<D>,
        optimizer: &mut OptimizerConfig,
    ) -> Result<u64, TrainerError> {
        let dir = checkpoint.dir();
        checkpoint.check_model(&self.strategy.parameter_shapes())?;
        let m = checkpoint.manifest();
        let here = self.data_position(train, 0);
        let mismatch = |what: &str, saved: usize, now: usize| {
            Err(CheckpointError::Mismatch {
                path: dir.to_path_buf(),
                message: format!(
                    "saved with {what} {saved}, this run has {now}: the data position would not carry over"
                ),
            })
        };
        if m.data.batch_size != here.batch_size {
            mismatch("batch size", m.data.batch_size, here.batch_size)?;
        }
        if m.data.accumulate != here.accumulate {
            mismatch(
                "accumulate_grad_batches",
                m.data.accumulate,
                here.accumulate,
            )?;
        }
        if m.data.dataset_len != here.dataset_len {
            mismatch(
                "a training set of length",
                m.data.dataset_len,
                here.dataset_len,
            )?;
        }
        let kind = optimizer.kind();
        if m.optimizer.kind != kind {
            return Err(CheckpointError::Mismatch {
                path: dir.to_path_buf(),
                message: format!(
                    "saved with optimizer {}, the module configures {kind}",
                    m.optimizer.kind
                ),
            }
            .into());
        }
        let saved = match &m.optimizer.lr_schedule {
            Some(record) => record
                .schedule()
                .map_err(|message| CheckpointError::Mismatch {
                    path: dir.to_path_buf(),
                    message,
                })?,
            None => LrSchedule::constant(),
        };
        if saved != optimizer.schedule && self.env.rank == 0 {
            eprintln!(
                "note: resuming with the checkpoint's learning-rate schedule ({saved}), not the \
                 module's ({}), so the curve continues where it stopped",
                optimizer.schedule
            );
        }
        optimizer.schedule = saved;
        self.strategy.load_state(checkpoint)?;
        self.state.global_step = m.step;
        if let Some(&skipped) = m.metrics.get(crate::fit_loop::SKIPPED_STEPS) {
            self.state
                .metrics
                .insert(crate::fit_loop::SKIPPED_STEPS.into(), skipped);
        }
        Ok(m.rng.seed)
    }

    /// Where the data loader stands after `step` optimizer steps.
    fn data_position<D: Dataset<Batch = M::Batch>>(
        &self,
        train: &DataLoader<D>,
        step: usize,
    ) -> DataPosition {
        let accumulate = self.config.accumulate_grad_batches;
        let per_epoch = (train.batches_per_epoch() / accumulate).max(1);
        DataPosition {
            epoch: step / per_epoch,
            batch: step % per_epoch,
            batch_size: train.batch_size(),
            accumulate,
            dataset_len: train.dataset().len(),
        }
    }

    /// Saves a checkpoint of this step from every rank, after finishing the save still in
    /// flight, if any. With `mc` saving asynchronously and `wait` false its files are
    /// written in the background ([`PendingSave`]); otherwise before this returns, when
    /// `last` names it. Returns its directory.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn save_checkpoint<D: Dataset<Batch = M::Batch>>(
        &mut self,
        mc: &ModelCheckpoint,
        run: Option<&str>,
        train: &DataLoader<D>,
        optimizer: &OptimizerConfig,
        seed: u64,
        saves: &mut FitSaves,
        wait: bool,
    ) -> Result<PathBuf, TrainerError> {
        self.finish_saves(saves)?;
        let step = self.state.global_step;
        let dir = mc.dir_for(step);
        let data = self.data_position(train, step);
        let info = SaveInfo {
            step,
            epoch: data.epoch,
            seed,
            optimizer,
            data,
            metrics: self.state.metrics.clone(),
            run: run.map(str::to_string),
            attachments: mc.attachments(),
        };
        let world = self.env.world.as_ref();
        if mc.is_async() && !wait {
            let (write, commit) =
                crate::checkpoint::begin(world, &*self.strategy, &dir, &info, mc)?;
            saves.pending = Some(PendingSave::start(write, commit, dir.clone()));
        } else {
            crate::checkpoint::save(world, &*self.strategy, &dir, &info, mc)?;
        }
        saves.last = Some((step, dir.clone()));
        Ok(dir)
    }

    /// Waits for the save in flight, if any, until its checkpoint is whole (a collective).
    pub(crate) fn finish_saves(&self, saves: &mut FitSaves) -> Result<(), TrainerError> {
        match saves.pending.take() {
            Some(pending) => pending.finish(self.env.world.as_ref(), &self.env.device),
            None => Ok(()),
        }
    }
}

/// A fit's checkpoints on one rank: the step saved last and where, and the save whose files
/// are still being written.
#[derive(Default)]
pub(crate) struct FitSaves {
    /// The last step saved (or resumed from), and its directory.
    pub(crate) last: Option<(usize, PathBuf)>,
    pending: Option<PendingSave>,
}

impl FitSaves {
    /// Saves starting from the checkpoint resumed at `step` (or none).
    pub(crate) fn resumed_at(step: usize, checkpoint: Option<&Checkpoint>) -> Self {
        FitSaves {
            last: checkpoint.map(|c| (step, c.dir().to_path_buf())),
            pending: None,
        }
    }

    /// At a step boundary (no collective): a background write that failed is this rank's
    /// error now, and rank 0 commits a save whose files are all written.
    pub(crate) fn poll(&mut self) -> Result<(), TrainerError> {
        match &mut self.pending {
            Some(pending) => pending.poll(),
            None => Ok(()),
        }
    }

    /// The step saved last.
    pub(crate) fn last_step(&self) -> Option<usize> {
        self.last.as_ref().map(|(step, _)| *step)
    }
}
