//! One optimizer step of one rank: its micro-batches' forward and backward, the step at the
//! schedule's rate, and the loss averaged over the ranks.

use super::{scalar, RankContext};
use crate::{DataLoader, Dataset, EpochOrder, TrainerError};
use wick_core::{CollectiveExt, GradSync, OnNonFinite, ReduceOp, StepReport, TrainModule};

/// Step `index` of the epoch whose sample order is `order`, about to become the fit's
/// step `number`, at learning rate `lr`.
pub(crate) struct TrainStep<'s, D> {
    pub(crate) train: &'s DataLoader<D>,
    pub(crate) order: &'s EpochOrder,
    /// The step's index within its epoch.
    pub(crate) index: usize,
    /// The fit's count of steps once this one is taken (errors name it).
    pub(crate) number: usize,
    pub(crate) lr: f64,
}

/// What a step did: its loss, averaged over its micro-batches and the ranks, and the
/// strategy's report of the optimizer step.
pub(crate) struct StepOutcome {
    pub(crate) loss: f64,
    pub(crate) report: StepReport,
    /// The module's metrics over the global batch ([`TrainModule::take_step_metrics`]).
    pub(crate) module_metrics: Vec<(&'static str, f64)>,
}

impl<D: Dataset> TrainStep<'_, D> {
    /// Runs the step on `ctx`'s rank.
    pub(crate) fn run<M: TrainModule<Batch = D::Batch>>(
        self,
        ctx: &mut RankContext<'_, M>,
    ) -> Result<StepOutcome, TrainerError> {
        let (rank, world_size) = (ctx.env.rank, ctx.env.world_size);
        let accumulate = ctx.config.accumulate_grad_batches;
        // `accumulate` micro-batches, each a whole global batch, make one step.
        let batches = (0..accumulate)
            .map(|micro| {
                let at = self.index * accumulate + micro;
                let slice = self.train.rank_slice(self.order, at, rank, world_size);
                self.train.dataset().batch(&slice, &ctx.env.device)
            })
            .collect::<candle_core::Result<Vec<_>>>()?;
        let weights = loss_weights(ctx, &batches)?;
        let mut local = 0f32;
        for (micro, batch) in batches.iter().enumerate() {
            let loss = ctx
                .module
                .training_step(batch, self.index * accumulate + micro)?;
            let value = scalar(&loss, "training_step")?;
            if !value.is_finite() && ctx.config.on_nonfinite == OnNonFinite::Error {
                return Err(TrainerError::NonFinite {
                    step: self.number,
                    rank,
                    what: format!("loss ({value})"),
                });
            }
            let loss = match weights.as_ref().map(|w| w[micro]) {
                // Alike micro-batches: each scaled so the step sees the mean over them.
                None => {
                    local += value / accumulate as f32;
                    match accumulate {
                        1 => loss,
                        _ => loss.affine(1.0 / accumulate as f64, 0.0)?,
                    }
                }
                // Candle's backward drops an `affine` by 0 from the graph, and a rank whose
                // backward skips the strategy's collectives would stop the others: a
                // product with a zero tensor keeps it, with zero gradients.
                Some(0.0) => loss.broadcast_mul(&loss.zeros_like()?)?,
                Some(w) => {
                    local += value * w as f32;
                    loss.affine(w, 0.0)?
                }
            };
            let sync = GradSync::for_micro_batch(micro, accumulate);
            let report = ctx.strategy.backward(&loss, sync)?;
            if let Some(names) = report.unused_parameters {
                report_unused_parameters(ctx, names)?;
            }
        }
        let report = ctx.strategy.optimizer_step(self.lr).map_err(|e| match e {
            wick_core::Error::NonFinite { rank, parameter } => TrainerError::NonFinite {
                step: self.number,
                rank,
                what: format!("gradient in '{parameter}' (the first parameter with one)"),
            },
            e => e.into(),
        })?;
        let loss = ctx.env.world.all_reduce_scalar(local, ReduceOp::Mean)? as f64;
        let module_metrics = module_metrics(ctx)?;
        Ok(StepOutcome {
            loss,
            report,
            module_metrics,
        })
    }
}

/// The module's metrics of the step, each its sum over every rank's samples over their
/// count (one all-reduce of the sums and counts; none when the module measures nothing,
/// as it does on every rank).
fn module_metrics<M: TrainModule>(
    ctx: &mut RankContext<'_, M>,
) -> Result<Vec<(&'static str, f64)>, TrainerError> {
    let metrics = ctx.module.take_step_metrics();
    if metrics.is_empty() {
        return Ok(Vec::new());
    }
    let values: Vec<f32> = (metrics.iter().map(|m| m.sum as f32))
        .chain(metrics.iter().map(|m| m.count as f32))
        .collect();
    let n = values.len();
    let totals = candle_core::Tensor::from_vec(values, n, &ctx.env.device)?;
    ctx.env.world.all_reduce_in_place(&totals, ReduceOp::Sum)?;
    let totals = totals.to_vec1::<f32>()?;
    let (sums, counts) = totals.split_at(metrics.len());
    Ok(metrics
        .iter()
        .zip(sums.iter().zip(counts))
        .map(|(m, (&sum, &count))| (m.name, sum as f64 / (count as f64).max(1.0)))
        .collect())
}

/// The factor of each micro-batch's loss where [`TrainModule::loss_terms`] counts its
/// terms (`None`: the micro-batches count alike). Micro-batch m of rank r gets `W n_rm / N`
/// for N the terms of the step over every rank and micro-batch (one scalar all-reduce):
/// the strategies' mean over the W ranks then makes the gradient of the mean over all N
/// terms, as one device on the global batch. A step without a counted term anywhere gets
/// factors of 0.
fn loss_weights<M: TrainModule>(
    ctx: &RankContext<'_, M>,
    batches: &[M::Batch],
) -> Result<Option<Vec<f64>>, TrainerError> {
    let terms: Option<Vec<usize>> = batches.iter().map(|b| ctx.module.loss_terms(b)).collect();
    let Some(terms) = terms else {
        return Ok(None);
    };
    let local: usize = terms.iter().sum();
    // Counts are exact in f32 up to 2^24 terms per step.
    let total = ctx
        .env
        .world
        .all_reduce_scalar(local as f32, ReduceOp::Sum)? as f64;
    let world = ctx.env.world_size as f64;
    Ok(Some(
        terms
            .iter()
            .map(|&n| match total > 0.0 {
                true => world * n as f64 / total,
                false => 0.0,
            })
            .collect(),
    ))
}

/// Reports the parameters the first backward of a fit gave no gradient: once, on rank 0,
/// as a warning; or, with `error_on_unused_parameters`, as an error on every rank (all
/// ranks find the same ones, so they stop together).
fn report_unused_parameters<M>(
    ctx: &RankContext<'_, M>,
    names: Vec<String>,
) -> Result<(), TrainerError> {
    if names.is_empty() {
        return Ok(());
    }
    if ctx.config.error_on_unused_parameters {
        return Err(TrainerError::UnusedParameters { names });
    }
    if ctx.env.rank == 0 {
        log::warn!(
            "{} parameter(s) received no gradient at the first step and will not \
             train (a layer without backward, such as candle-nn's fused LayerNorm, or one \
             the loss does not use): {}",
            names.len(),
            names.join(", ")
        );
    }
    Ok(())
}
