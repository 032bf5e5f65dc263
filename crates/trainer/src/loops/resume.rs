//! Resuming a fit on one rank: the state of the checkpoint it continues restored, after
//! checking that its data position carries over (saving is `checkpoint_manager.rs`'s).

use super::{FitProgress, RankContext};
use crate::loops::checkpoint_manager::DataPlan;
use crate::{Checkpoint, CheckpointError, DataLoader, Dataset, EpochOrder, TrainerError};
use wick_core::{LrSchedule, OptimizerConfig, TrainModule};

/// Where a resumed fit continues from.
pub(crate) struct Resumed {
    pub(crate) progress: FitProgress,
    /// The seed of the data order to continue with.
    pub(crate) seed: u64,
}

/// Restores parameters, optimizer state, progress and data position from `checkpoint` on
/// `ctx`'s rank, and the learning-rate schedule, which continues from the checkpoint's step
/// (replacing the module's if they differ, as Lightning restores a scheduler).
pub(crate) fn restore<M: TrainModule, D: Dataset<Batch = M::Batch>>(
    ctx: &mut RankContext<'_, M>,
    checkpoint: &Checkpoint,
    train: &DataLoader<D>,
    optimizer: &mut OptimizerConfig,
) -> Result<Resumed, TrainerError> {
    let dir = checkpoint.dir();
    checkpoint.check_model(&ctx.strategy.parameter_shapes())?;
    let m = checkpoint.manifest();
    let here = DataPlan::of(train, ctx.config.accumulate_grad_batches).at(0);
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
    if saved != optimizer.schedule && ctx.env.rank == 0 {
        log::info!(
            "resuming with the checkpoint's learning-rate schedule ({saved}), not the \
             module's ({}), so the curve continues where it stopped",
            optimizer.schedule
        );
    }
    optimizer.schedule = saved;
    if m.rng.shuffle != EpochOrder::SHUFFLE && m.data.batch > 0 && ctx.env.rank == 0 {
        log::warn!(
            "{}: saved in the middle of epoch {} by a wick that shuffled with {}; this one \
             shuffles with {}, so the rest of that epoch follows the new order (some of its \
             samples may come twice and others not at all); later epochs are whole",
            dir.display(),
            m.data.epoch,
            m.rng.shuffle,
            EpochOrder::SHUFFLE
        );
    }
    ctx.strategy.load_state(checkpoint)?;
    let progress = FitProgress {
        step: m.step,
        epoch: m.epoch,
        skipped_steps: m.skipped_steps_before(),
    };
    Ok(Resumed {
        progress,
        seed: m.rng.seed,
    })
}
