//! Evaluation passes of one rank: every sample once, the loss weighted by samples and
//! averaged over the ranks.

use super::{scalar, RankContext};
use crate::{DataLoader, Dataset, TrainerError};
use wick_core::{CollectiveExt, ReduceOp, TrainModule};

/// Which evaluation hook a pass calls and under which metric name it reports.
#[derive(Clone, Copy)]
pub(crate) enum EvalKind {
    Validation,
    Test,
}

impl EvalKind {
    /// The pass's name on its bar.
    fn name(self) -> &'static str {
        match self {
            EvalKind::Validation => "val",
            EvalKind::Test => "test",
        }
    }

    /// The metric its loss is reported under.
    fn metric(self) -> &'static str {
        match self {
            EvalKind::Validation => "val_loss",
            EvalKind::Test => "test_loss",
        }
    }
}

/// One evaluation pass over `data`.
pub(crate) struct EvalLoop<'e, D> {
    pub(crate) data: &'e DataLoader<D>,
    pub(crate) kind: EvalKind,
}

impl<D: Dataset> EvalLoop<'_, D> {
    /// Runs the pass on `ctx`'s rank; returns the loss averaged over samples and ranks, if
    /// the module reports one (also in the callbacks' metrics).
    pub(crate) fn run<M: TrainModule<Batch = D::Batch>>(
        self,
        ctx: &mut RankContext<'_, M>,
    ) -> Result<Option<f64>, TrainerError> {
        let kind = self.kind;
        if let EvalKind::Validation = kind {
            ctx.callbacks.call(|cb, s| cb.on_validation_start(s))?;
        }
        let bar = ctx
            .bars
            .as_ref()
            .map(|p| p.eval(kind.name(), self.data.eval_batches()));
        let losses = each_batch(ctx, self.data, |module, batch, b| {
            let (loss, hook) = match kind {
                EvalKind::Validation => (module.validation_step(batch, b)?, "validation_step"),
                EvalKind::Test => (module.test_step(batch, b)?, "test_step"),
            };
            if let Some(bar) = &bar {
                bar.inc(1);
            }
            loss.map(|l| scalar(&l, hook)).transpose()
        });
        if let Some(bar) = bar {
            bar.finish_and_clear();
        }
        // The mean over samples, as Lightning weights each batch's loss by its size: a
        // short last batch counts for what it holds, whatever the world size.
        let losses = losses?;
        let reported = losses.iter().any(|(l, _)| l.is_some());
        let (sum, count) = losses
            .iter()
            .filter_map(|(l, n)| l.map(|l| (l as f64 * *n as f64, *n)))
            .fold((0f64, 0usize), |(s, c), (l, n)| (s + l, c + n));
        let mean = match reported {
            false => None,
            true => {
                let world = &ctx.env.world;
                let sum = world.all_reduce_scalar(sum as f32, ReduceOp::Sum)? as f64;
                let count = world.all_reduce_scalar(count as f32, ReduceOp::Sum)? as f64;
                Some(sum / count)
            }
        };
        if let Some(v) = mean {
            ctx.callbacks.state.metrics.insert(kind.metric().into(), v);
        }
        match kind {
            EvalKind::Validation => ctx.callbacks.call(|cb, s| cb.on_validation_end(s))?,
            EvalKind::Test => ctx.callbacks.call(|cb, s| cb.on_test_end(s))?,
        }
        Ok(mean)
    }
}

/// Runs `step` on `ctx`'s part of every evaluation batch of `data` (every sample, epoch
/// 0's order), freeing after each what the strategy gathered for it; returns each batch's
/// result with the number of this rank's samples that count
/// ([`DataLoader::eval_slice`]).
pub(super) fn each_batch<M: TrainModule, D: Dataset<Batch = M::Batch>, T>(
    ctx: &mut RankContext<'_, M>,
    data: &DataLoader<D>,
    mut step: impl FnMut(&mut M, &M::Batch, usize) -> Result<T, TrainerError>,
) -> Result<Vec<(T, usize)>, TrainerError> {
    let order = data.epoch_order(ctx.config.seed, 0);
    (0..data.eval_batches())
        .map(|b| {
            let (idx, count) = data.eval_slice(&order, b, ctx.env.rank, ctx.env.world_size);
            let batch = data.dataset().batch(&idx, &ctx.env.device)?;
            // No backward follows: the strategy keeps nothing for one (PyTorch's no_grad).
            let out = wick_core::no_grad(|| step(ctx.module, &batch, b));
            ctx.strategy.free_gathered();
            Ok((out?, count))
        })
        .collect()
}
