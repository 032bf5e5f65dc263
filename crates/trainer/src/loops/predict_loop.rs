//! Prediction passes of one rank: every sample once, the predictions gathered to rank 0 in
//! sample order.

use super::eval_loop::each_batch;
use super::RankContext;
use crate::{DataLoader, Dataset, TrainerError};
use candle_core::{DType, Tensor};
use wick_accelerator::RankEnv;
use wick_core::{CollectiveExt, ReduceOp, TrainModule};

/// One prediction pass over `data`.
pub(crate) struct PredictLoop<'p, D> {
    pub(crate) data: &'p DataLoader<D>,
}

impl<D: Dataset> PredictLoop<'_, D> {
    /// Runs the pass on `ctx`'s rank; returns every sample's prediction on rank 0, in
    /// sample order, and nothing on the others.
    pub(crate) fn run<M: TrainModule<Batch = D::Batch>>(
        self,
        ctx: &mut RankContext<'_, M>,
    ) -> Result<Vec<Tensor>, TrainerError> {
        let data = self.data;
        let out = each_batch(ctx, data, |module, batch, b| {
            Ok(module.predict_step(batch, b)?)
        })?;
        ctx.callbacks.call(|cb, s| cb.on_predict_end(s))?;
        let order = data.epoch_order(ctx.config.seed, 0);
        let world_size = ctx.env.world_size;
        let mut gathered = Vec::new();
        for (b, (part, _)) in out.iter().enumerate() {
            // Every rank's (rows run, rows that count) of this batch, known to all.
            let rows: Vec<(usize, usize)> = (0..world_size)
                .map(|r| {
                    let (idx, count) = data.eval_slice(&order, b, r, world_size);
                    (idx.len(), count)
                })
                .collect();
            gathered.extend(gather_to_rank0(&ctx.env, part, &rows)?);
        }
        Ok(gathered)
    }
}

/// Every rank's `part` of a global batch joined along dim 0 in rank order, on rank 0
/// (`None` elsewhere). `rows[r]` is rank r's (rows it ran, rows that count): a part has
/// one row per sample it ran, and rows that do not count (a rank without a sample of a
/// short batch) are left out. Types other than f32, bf16 and f16 travel as f32, exactly
/// for integers below 2^24 (class ids, token ids).
fn gather_to_rank0(
    env: &RankEnv,
    part: &Tensor,
    rows: &[(usize, usize)],
) -> Result<Option<Tensor>, TrainerError> {
    let world = &env.world;
    let rank = env.rank;
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
