//! Evaluation and prediction passes of one rank: every sample once, the loss weighted by
//! samples and averaged over the ranks, predictions gathered to rank 0 in sample order.

use crate::rank_run::{scalar, Eval, RankRun};
use crate::{DataLoader, Dataset, TrainerError};
use candle_core::{DType, Tensor};
use wick_core::{ReduceOp, TrainModule};

impl<M: TrainModule> RankRun<'_, M> {
    /// One pass over `data`; returns the loss averaged over batches and ranks, if the module
    /// reports one.
    pub(crate) fn evaluate<D: Dataset<Batch = M::Batch>>(
        &mut self, data: &DataLoader<D>, kind: Eval,
    ) -> Result<Option<f64>, TrainerError> {
        if let Eval::Validation = kind {
            self.callbacks(|cb, s| cb.on_validation_start(s))?;
        }
        let bar = self.progress.as_ref().map(|p| {
            let name = match kind {
                Eval::Validation => "val",
                Eval::Test => "test",
            };
            p.eval(name, data.eval_batches())
        });
        let losses = self.each_batch(data, |module, batch, b| {
            let (loss, hook) = match kind {
                Eval::Validation => (module.validation_step(batch, b)?, "validation_step"),
                Eval::Test => (module.test_step(batch, b)?, "test_step"),
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
                let world = &self.env.world;
                let sum = world.all_reduce_scalar(sum as f32, ReduceOp::Sum)? as f64;
                let count = world.all_reduce_scalar(count as f32, ReduceOp::Sum)? as f64;
                Some(sum / count)
            }
        };
        let metric = match kind {
            Eval::Validation => "val_loss",
            Eval::Test => "test_loss",
        };
        if let Some(v) = mean {
            self.state.metrics.insert(metric.into(), v);
        }
        match kind {
            Eval::Validation => self.callbacks(|cb, s| cb.on_validation_end(s))?,
            Eval::Test => self.callbacks(|cb, s| cb.on_test_end(s))?,
        }
        Ok(mean)
    }

    pub(crate) fn predict<D: Dataset<Batch = M::Batch>>(
        &mut self, data: &DataLoader<D>,
    ) -> Result<Vec<Tensor>, TrainerError> {
        let out = self.each_batch(data, |module, batch, b| Ok(module.predict_step(batch, b)?))?;
        self.callbacks(|cb, s| cb.on_predict_end(s))?;
        let order = data.epoch_order(self.config.seed, 0);
        let mut gathered = Vec::new();
        for (b, (part, _)) in out.iter().enumerate() {
            // Every rank's (rows run, rows that count) of this batch, known to all.
            let rows: Vec<(usize, usize)> = (0..self.env.world_size)
                .map(|r| {
                    let (idx, count) = data.eval_slice(&order, b, r, self.env.world_size);
                    (idx.len(), count)
                })
                .collect();
            gathered.extend(self.gather_to_rank0(part, &rows)?);
        }
        Ok(gathered)
    }

    /// Every rank's `part` of a global batch joined along dim 0 in rank order, on rank 0
    /// (`None` elsewhere). `rows[r]` is rank r's (rows it ran, rows that count): a part has
    /// one row per sample it ran, and rows that do not count (a rank without a sample of a
    /// short batch) are left out. Types other than f32, bf16 and f16 travel as f32, exactly
    /// for integers below 2^24 (class ids, token ids).
    fn gather_to_rank0(
        &self, part: &Tensor, rows: &[(usize, usize)],
    ) -> Result<Option<Tensor>, TrainerError> {
        let world = &self.env.world;
        let rank = self.env.rank;
        let ran = rows[rank].0;
        if part.dims().first() != Some(&ran) {
            return Err(TrainerError::config(
                "predict_step",
                format!(
                    "must return one row per sample of its batch (first dimension {ran}), got \
                     shape {:?} on rank {rank}",
                    part.dims()
                ),
            ));
        }
        let row_len = part.elem_count() / ran;
        let mean_row = world.all_reduce_scalar(row_len as f32, ReduceOp::Mean)?;
        if mean_row != row_len as f32 {
            return Err(TrainerError::config(
                "predict_step",
                format!(
                    "rank {rank} returned rows of {row_len} values where the ranks' mean is \
                     {mean_row}: every rank must return rows of the same shape"
                ),
            ));
        }
        let wire = match part.dtype() {
            DType::F32 | DType::BF16 | DType::F16 => part.dtype(),
            _ => DType::F32,
        };
        // Equal chunks for the gather: each part padded to the most rows any rank ran.
        let chunk = rows.iter().map(|r| r.0).max().unwrap_or(0) * row_len;
        let mut flat = part.flatten_all()?.to_dtype(wire)?;
        if flat.elem_count() < chunk {
            let pad = Tensor::zeros(chunk - flat.elem_count(), wire, part.device())?;
            flat = Tensor::cat(&[&flat, &pad], 0)?;
        }
        let flat = flat.contiguous()?;
        let full = Tensor::zeros(chunk * rows.len(), wire, part.device())?;
        world.all_gather_into(&flat, &full)?;
        if rank != 0 {
            return Ok(None);
        }
        let kept = rows
            .iter()
            .enumerate()
            .filter(|(_, (_, count))| *count > 0)
            .map(|(r, (_, count))| full.narrow(0, r * chunk, count * row_len))
            .collect::<candle_core::Result<Vec<_>>>()?;
        let mut dims = part.dims().to_vec();
        dims[0] = rows.iter().map(|r| r.1).sum();
        Ok(Some(
            Tensor::cat(&kept, 0)?
                .reshape(dims)?
                .to_dtype(part.dtype())?,
        ))
    }

    /// Runs `step` on this rank's part of every evaluation batch of `data` (every sample,
    /// epoch 0's order), freeing after each what the strategy gathered for it; returns each
    /// batch's result with the number of this rank's samples that count
    /// ([`DataLoader::eval_slice`]).
    fn each_batch<D: Dataset<Batch = M::Batch>, T>(
        &mut self, data: &DataLoader<D>,
        mut step: impl FnMut(&mut M, &M::Batch, usize) -> Result<T, TrainerError>,
    ) -> Result<Vec<(T, usize)>, TrainerError> {
        let order = data.epoch_order(self.config.seed, 0);
        (0..data.eval_batches())
            .map(|b| {
                let (idx, count) = data.eval_slice(&order, b, self.env.rank, self.env.world_size);
                let batch = data.dataset().batch(idx, &self.env.device)?;
                // No backward follows: the strategy keeps nothing for one (PyTorch's no_grad).
                let out = wick_core::no_grad(|| step(self.module, &batch, b));
                self.strategy.free_gathered();
                Ok((out?, count))
            })
            .collect()
    }
}
