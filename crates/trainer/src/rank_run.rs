//! One rank's part of a stage: the hook sequence of docs/design.md around the stage's loop
//! (`fit_loop.rs`, `eval_loop.rs`; a step is `train_step.rs`, checkpoints
//! `checkpoint_manager.rs` and `resume.rs`).

use crate::config::Config;
use crate::preemption::Interruption;
use crate::progress::Progress;
use crate::sinks::StepSinks;
use crate::{Checkpoint, DataLoader, Dataset, ModelCheckpoint, TrainerError};
use candle_core::{DType, Tensor};
use std::sync::Arc;
use wick_accelerator::{Accelerator, RankEnv};
use wick_core::{Callback, RunState, Stage, Strategy, TrainModule, WaitClock};

/// Metric name to value, averaged over ranks (`train_loss`, `val_loss`, `test_loss`).
pub type Metrics = std::collections::BTreeMap<String, f64>;

/// The metric that counts the steps skipped for inf or NaN gradients.
pub(crate) const SKIPPED_STEPS: &str = "skipped_steps";

/// What a stage runs over: its data, and for fit the checkpoint it resumes from, where it
/// saves, and the name of its log directory (recorded in its checkpoints).
pub(crate) struct StageInput<'a, D> {
    pub(crate) train: Option<&'a DataLoader<D>>,
    pub(crate) eval: Option<&'a DataLoader<D>>,
    pub(crate) resume: Option<&'a Checkpoint>,
    pub(crate) checkpoint: Option<&'a ModelCheckpoint>,
    pub(crate) run: Option<&'a str>,
}

impl<'a, D> StageInput<'a, D> {
    /// An evaluation or prediction pass over `data`.
    pub(crate) fn eval(data: &'a DataLoader<D>) -> Self {
        StageInput {
            train: None,
            eval: Some(data),
            resume: None,
            checkpoint: None,
            run: None,
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

pub(crate) struct RankRun<'a, M> {
    pub(crate) env: RankEnv,
    /// The time this rank spent in collectives (its world is `env.world`).
    pub(crate) clock: Arc<WaitClock>,
    /// Rank 0's bars on a terminal.
    pub(crate) progress: Option<Progress>,
    /// Rank 0's step sinks (the metrics file, the program's), during fit.
    pub(crate) sinks: StepSinks<'a>,
    pub(crate) module: &'a mut M,
    pub(crate) strategy: &'a mut dyn Strategy,
    pub(crate) callbacks: Vec<Box<dyn Callback>>,
    pub(crate) config: &'a Config,
    pub(crate) state: RunState,
}

/// Which evaluation hook a pass calls and under which metric name it reports.
#[derive(Clone, Copy)]
pub(crate) enum Eval {
    Validation,
    Test,
}

impl<M: TrainModule> RankRun<'_, M> {
    /// Runs `hook` on every callback in order.
    pub(crate) fn callbacks(
        &mut self, mut hook: impl FnMut(&mut dyn Callback, &RunState) -> candle_core::Result<()>,
    ) -> Result<(), TrainerError> {
        for cb in self.callbacks.iter_mut() {
            hook(cb.as_mut(), &self.state)?;
            // What a callback logs is visible to the callbacks after it.
            let logged = self.state.take_logged();
            self.state.metrics.extend(logged);
        }
        Ok(())
    }

    /// Runs `stage` on this rank, in docs/design.md's order.
    pub(crate) fn run<D: Dataset<Batch = M::Batch>>(
        mut self, stage: Stage, loaders: &StageInput<'_, D>,
    ) -> Result<RankOutput, TrainerError> {
        self.strategy
            .connect(self.env.world.clone(), self.env.device.clone())?;
        self.callbacks(|cb, s| cb.setup(s, stage))?;
        self.module.setup(stage)?;
        if Accelerator::setup(self.strategy, self.module, self.config.seed)? {
            self.callbacks(|cb, s| cb.on_configure_sharded_model(s))?;
        }
        let mut predictions = Vec::new();
        let mut interrupted = None;
        match (stage, loaders.train, loaders.eval) {
            (Stage::Fit, Some(train), val) => interrupted = self.fit(train, val, loaders)?,
            (Stage::Validate, _, Some(data)) => {
                self.evaluate(data, Eval::Validation)?;
            }
            (Stage::Test, _, Some(data)) => {
                self.evaluate(data, Eval::Test)?;
            }
            (Stage::Predict, _, Some(data)) => {
                predictions = self.predict(data)?;
            }
            _ => unreachable!("the trainer passes the loaders each stage needs"),
        }
        self.callbacks(|cb, s| cb.teardown(s, stage))?;
        self.module.teardown(stage)?;
        Ok(RankOutput {
            metrics: self.state.metrics,
            predictions,
            interrupted,
        })
    }
}

/// The value of a scalar loss, or an error naming the hook that returned something else.
pub(crate) fn scalar(loss: &Tensor, hook: &str) -> Result<f32, TrainerError> {
    if loss.rank() != 0 {
        return Err(TrainerError::config(
            hook,
            format!("must return a scalar loss, got shape {:?}", loss.dims()),
        ));
    }
    Ok(loss.to_dtype(DType::F32)?.to_scalar::<f32>()?)
}
