//! The hooks a model implements to be trained by wick.

use crate::{OptimizerConfig, ShardedContext, Stage};
use candle_core::{Result, Tensor};

/// The target id a loss does not count (`transformers`' `-100` label, as a u32): a token
/// file's uncounted targets come out as it, and wick-nn's `cross_entropy` skips it.
pub const IGNORE_INDEX: u32 = u32::MAX;

/// A model with its training logic, in the style of a LightningModule.
///
/// Parameters are created in [`TrainModule::configure_sharded_model`], which runs once per
/// module instance, after the world is up and inside the strategy's sharding context; a
/// module is cheap to construct and clone before that (it holds only its configuration),
/// which is how the other ranks of a thread world get their replica.
pub trait TrainModule: Send {
    /// What one batch of this module's data looks like.
    type Batch;

    /// Called at the start of every stage, on every rank, before parameters exist the first time.
    fn setup(&mut self, _stage: Stage) -> Result<()> {
        Ok(())
    }

    /// Creates the model's parameters through `ctx.var_builder()`.
    fn configure_sharded_model(&mut self, ctx: &ShardedContext) -> Result<()>;

    /// The optimizer the strategy should build over this module's parameters.
    fn configure_optimizers(&self) -> OptimizerConfig {
        OptimizerConfig::adamw(1e-3)
    }

    /// Before the first training batch.
    fn on_fit_start(&mut self) -> Result<()> {
        Ok(())
    }

    /// The loss of one batch (this rank's slice of the global batch), a scalar. The metric
    /// `train_loss` is this loss of the last optimizer step (averaged over the ranks and
    /// over accumulated micro-batches), not a mean over the epoch. Training batches are
    /// always whole global batches: an incomplete last one is dropped.
    fn training_step(&mut self, batch: &Self::Batch, batch_idx: usize) -> Result<Tensor>;

    /// How many terms `training_step`'s loss of `batch` is the mean of, when that varies
    /// from batch to batch (a language model's loss over the tokens its mask counts);
    /// `None` (the default) when every batch's loss counts alike.
    ///
    /// With a count, the trainer weighs each micro-batch's loss by its share of the step's
    /// count over every rank and micro-batch, so the step's gradient is that of the mean
    /// over all counted terms: what one device computes on the global batch, and what
    /// `transformers` computes with `-100` labels and `num_items_in_batch`.
    fn loss_terms(&self, _batch: &Self::Batch) -> Option<usize> {
        None
    }

    /// What the module measured over this rank's samples since the last call, as sums with
    /// the count of samples they are over: the trainer takes them after each optimizer
    /// step, adds them up over the ranks, and logs each name's sum over its count (the
    /// global batch's mean) in every logger (TRL's `rewards/chosen` and the like). Every
    /// rank must return the same names, in the same order. Default: none.
    fn take_step_metrics(&mut self) -> Vec<StepMetric> {
        Vec::new()
    }

    /// The model FLOPs of training on one token of a sample of `seq` tokens
    /// (`Dataset::tokens_per_sample`), forward and backward: what the loggers' model FLOPs
    /// utilisation (`mfu`) sets against the measured peak. PaLM's accounting, as
    /// torchtitan's: 6 x the parameters that multiply, plus attention's 12 x layers x
    /// heads x head_dim x `seq`. `None` (the default): no `mfu` is logged.
    fn flops_per_token(&self, _seq: usize) -> Option<f64> {
        None
    }

    /// The validation loss of one batch, a scalar: the mean over the batch's samples (the
    /// trainer weights each batch by its samples, and a pass covers every sample, the short
    /// last batch included); `None` skips validation.
    fn validation_step(
        &mut self,
        _batch: &Self::Batch,
        _batch_idx: usize,
    ) -> Result<Option<Tensor>> {
        Ok(None)
    }

    /// The test loss of one batch, a scalar, as [`TrainModule::validation_step`]; `None`
    /// reports nothing.
    fn test_step(&mut self, _batch: &Self::Batch, _batch_idx: usize) -> Result<Option<Tensor>> {
        Ok(None)
    }

    /// The predictions for one batch, first dimension the batch.
    fn predict_step(&mut self, _batch: &Self::Batch, _batch_idx: usize) -> Result<Tensor> {
        candle_core::bail!("this module does not implement predict_step")
    }

    /// After the last training batch.
    fn on_fit_end(&mut self) -> Result<()> {
        Ok(())
    }

    /// At the end of every stage, on every rank.
    fn teardown(&mut self, _stage: Stage) -> Result<()> {
        Ok(())
    }
}

/// A value a module measured over its samples of a step ([`TrainModule::take_step_metrics`]).
#[derive(Debug, Clone, PartialEq)]
pub struct StepMetric {
    /// The name it is logged under.
    pub name: &'static str,
    /// The sum over this rank's samples.
    pub sum: f64,
    /// How many samples the sum is over.
    pub count: f64,
}
