//! One rank's part of a stage: the hook sequence of docs/design.md around the stage's loop.

use super::{CallbackList, EvalKind, EvalLoop, FitLoop, PredictLoop, RankContext};
use crate::preemption::Interruption;
use crate::{Checkpoint, DataLoader, Dataset, ModelCheckpoint, TrainerError};
use candle_core::Tensor;
use wick_accelerator::RankEnv;
use wick_core::{configure_rank, RankStrategy, Stage, Strategy, TrainModule};

/// Metric name to value, averaged over ranks (`train_loss`, `val_loss`, `test_loss`).
pub type Metrics = std::collections::BTreeMap<String, f64>;

/// What a stage runs over: its data, and for fit the checkpoint it resumes from, where it
/// saves, and the name of its log directory (recorded in its checkpoints).
pub(crate) struct StageInput<'a, D> {
    pub(crate) train: Option<&'a DataLoader<D>>,
    pub(crate) eval: Option<&'a DataLoader<D>>,
    pub(crate) resume: Option<&'a Checkpoint>,
    pub(crate) checkpoint: Option<&'a ModelCheckpoint>,
    /// The run's log directory as the run names it (such as `runs/char-gpt-v1`).
    pub(crate) log_dir: Option<&'a str>,
}

impl<'a, D> StageInput<'a, D> {
    /// An evaluation or prediction pass over `data`.
    pub(crate) fn eval(data: &'a DataLoader<D>) -> Self {
        StageInput {
            train: None,
            eval: Some(data),
            resume: None,
            checkpoint: None,
            log_dir: None,
        }
    }
}

/// What a rank brings back from a stage.
pub(crate) struct RankOutput {
    pub(crate) metrics: Metrics,
    pub(crate) predictions: Vec<Tensor>,
    /// How a preemption stopped a fit (the stage's teardown hooks still ran).
    pub(crate) interrupted: Option<Interruption>,
}

/// The first hooks of `stage` on a rank, in docs/design.md's order: the callbacks' and the
/// module's `setup`, then the rank's strategy: the one an earlier stage made (`slot`),
/// connected to this stage's world, or, the first time, a new one made by `strategy` around
/// the module's `configure_sharded_model`, after which the callbacks hear of it.
pub(crate) fn enter_stage<'s, M: TrainModule>(
    env: &RankEnv,
    module: &mut M,
    callbacks: &mut CallbackList,
    (strategy, slot): (&dyn Strategy, &'s mut Option<Box<dyn RankStrategy>>),
    stage: Stage,
    seed: u64,
) -> Result<&'s mut dyn RankStrategy, TrainerError> {
    callbacks.call(|cb, s| cb.setup(s, stage))?;
    module.setup(stage)?;
    let rank = match slot {
        Some(rank) => {
            rank.connect(env.world.clone(), env.device.clone())?;
            rank
        }
        None => {
            let (world, device) = (env.world.clone(), env.device.clone());
            let rank = slot.insert(configure_rank(strategy, world, device, seed, module)?);
            callbacks.call(|cb, s| cb.on_configure_sharded_model(s))?;
            rank
        }
    };
    Ok(rank.as_mut())
}

/// Runs `stage` on `ctx`'s rank, once [`enter_stage`] did, in docs/design.md's order.
pub(crate) fn run_stage<M: TrainModule, D: Dataset<Batch = M::Batch>>(
    mut ctx: RankContext<'_, M>,
    stage: Stage,
    input: &StageInput<'_, D>,
) -> Result<RankOutput, TrainerError> {
    let mut predictions = Vec::new();
    let mut interrupted = None;
    match (stage, input.train, input.eval) {
        (Stage::Fit, Some(train), val) => {
            interrupted = FitLoop::new(&mut ctx, train, val, input)?.run(&mut ctx)?;
        }
        (Stage::Validate, _, Some(data)) => {
            let kind = EvalKind::Validation;
            EvalLoop { data, kind }.run(&mut ctx)?;
        }
        (Stage::Test, _, Some(data)) => {
            let kind = EvalKind::Test;
            EvalLoop { data, kind }.run(&mut ctx)?;
        }
        (Stage::Predict, _, Some(data)) => predictions = PredictLoop { data }.run(&mut ctx)?,
        _ => unreachable!("the trainer passes the loaders each stage needs"),
    }
    ctx.callbacks.call(|cb, s| cb.teardown(s, stage))?;
    ctx.module.teardown(stage)?;
    Ok(RankOutput {
        metrics: ctx.callbacks.state.metrics,
        predictions,
        interrupted,
    })
}
