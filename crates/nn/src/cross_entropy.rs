//! `cross_entropy`: the mean negative log-likelihood of the targets under softmax(logits),
//! forward one pass over the rows, backward softmax minus one-hot. A target of
//! [`IGNORE_INDEX`] is not counted: the mean is over the other rows, as torch's
//! `ignore_index=-100` (the label of a prompt token in instruction data) has it.

use crate::cpu::{f32s, fused, rows_per_task, sum_in_order, u32s};
use crate::fused_op::{CpuOp, CpuOut, Fused, GradsOf, Input};
use crate::vector_math;
use candle_core::{CpuStorage, DType, Result, Shape, Tensor};
use rayon::prelude::*;
use std::sync::{Mutex, MutexGuard};
pub use wick_core::IGNORE_INDEX;

/// Mean cross-entropy of `logits` `[n, classes]` against class ids `targets` `[n]` over the
/// rows whose target is not [`IGNORE_INDEX`] (0, with a zero gradient, when every row is
/// ignored); without ignored rows, equal to candle-nn's `loss::cross_entropy`. Fused on the
/// CPU for f32 logits and u32 targets; [`cross_entropy_composite`] elsewhere.
pub fn cross_entropy(logits: &Tensor, targets: &Tensor) -> Result<Tensor> {
    let (n, _) = logits.dims2()?;
    if targets.dims() != [n] {
        candle_core::bail!(
            "cross_entropy: {n} rows of logits but targets of shape {:?}",
            targets.dims()
        )
    }
    match fused(&[logits]) && targets.dtype() == DType::U32 {
        true => logits
            .contiguous()?
            .apply_op2(&targets.contiguous()?, Fused(Forward::default())),
        false => cross_entropy_composite(logits, targets),
    }
}

/// The same loss from Candle's basic ops (the fallback, and the reference in tests).
pub fn cross_entropy_composite(logits: &Tensor, targets: &Tensor) -> Result<Tensor> {
    let targets = targets.to_dtype(DType::U32)?;
    let ids = targets.to_vec1::<u32>()?;
    let counted = ids.iter().filter(|&&t| t != IGNORE_INDEX).count();
    if counted == ids.len() {
        return candle_nn::loss::cross_entropy(logits, &targets);
    }
    let keep: Vec<f32> = ids
        .iter()
        .map(|&t| (t != IGNORE_INDEX) as u8 as f32)
        .collect();
    let safe: Vec<u32> = ids
        .iter()
        .map(|&t| if t == IGNORE_INDEX { 0 } else { t })
        .collect();
    let device = logits.device();
    let nll = candle_nn::ops::log_softmax(logits, 1)?
        .gather(&Tensor::new(safe, device)?.unsqueeze(1)?, 1)?
        .squeeze(1)?
        .neg()?;
    let keep = Tensor::new(keep, device)?.to_dtype(nll.dtype())?;
    (nll * keep)?.sum_all()? / counted.max(1) as f64
}

/// The rows whose target counts.
pub(crate) fn counted(targets: &[u32]) -> usize {
    targets.iter().filter(|&&t| t != IGNORE_INDEX).count()
}

/// Row `r`'s max and log of the sum of exp(x - max).
pub(crate) fn log_sum_exp(row: &[f32]) -> (f32, f32) {
    let max = vector_math::max(row);
    (max, vector_math::sum_exp_shifted(row, max).ln())
}

/// The lock, whether or not a panicking thread poisoned it.
fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// The logits' rows, the targets and the number of classes, the targets checked.
fn rows<'a>(op: &str, [logits, targets]: [Input<'a>; 2]) -> Result<(&'a [f32], &'a [u32], usize)> {
    let classes = logits.1.shape().dims().last().copied().unwrap_or(1);
    let (logits, targets) = (
        f32s(op, logits.0, logits.1)?,
        u32s(op, targets.0, targets.1)?,
    );
    if let Some(t) = targets
        .iter()
        .find(|&&t| t as usize >= classes && t != IGNORE_INDEX)
    {
        candle_core::bail!("{op}: target {t} is not below the {classes} classes")
    }
    Ok((logits, targets, classes))
}

/// The loss; keeps each row's `max + log(sum(exp(x - max)))` for its backward.
#[derive(Default)]
struct Forward {
    log_sum_exp: Mutex<Vec<f32>>,
}

impl CpuOp<2> for Forward {
    const NAME: &'static str = "wick-cross-entropy";

    fn cpu(&self, inputs: [Input<'_>; 2]) -> CpuOut {
        let (logits, targets, classes) = rows(Self::NAME, inputs)?;
        // Per-task sums, added in task order: the same bits on any number of threads.
        let task = rows_per_task(classes);
        let partials: Vec<(f32, Vec<f32>)> = logits
            .par_chunks(task * classes)
            .zip(targets.par_chunks(task))
            .map(|(logits, targets)| {
                let lse: Vec<f32> = logits
                    .chunks_exact(classes)
                    .map(|row| {
                        let (max, lse) = log_sum_exp(row);
                        max + lse
                    })
                    .collect();
                let rows = logits.chunks_exact(classes).zip(targets).zip(&lse);
                let sum = rows
                    .filter(|((_, &t), _)| t != IGNORE_INDEX)
                    .map(|((row, &t), lse)| lse - row[t as usize])
                    .sum();
                (sum, lse)
            })
            .collect();
        let total = sum_in_order(partials.iter().map(|(s, _)| vec![*s]).collect(), 1)[0];
        *lock(&self.log_sum_exp) = partials.into_iter().flat_map(|(_, lse)| lse).collect();
        let counted = counted(targets);
        Ok((
            CpuStorage::F32(vec![total / counted.max(1) as f32]),
            Shape::from(()),
        ))
    }

    fn grads(&self, [logits, targets]: [&Tensor; 2], _res: &Tensor, grad: &Tensor) -> GradsOf<2> {
        let scale = grad.to_dtype(DType::F32)?.to_scalar::<f32>()?;
        let log_sum_exp = lock(&self.log_sum_exp).clone();
        let backward = Fused(Backward { scale, log_sum_exp });
        Ok([Some(logits.apply_op2_no_bwd(targets, &backward)?), None])
    }
}

/// (logits, targets) -> d logits, from the forward's per-row log-sum-exp.
struct Backward {
    scale: f32,
    log_sum_exp: Vec<f32>,
}

impl CpuOp<2> for Backward {
    const NAME: &'static str = "wick-cross-entropy-backward";

    fn cpu(&self, inputs: [Input<'_>; 2]) -> CpuOut {
        let (logits, targets, classes) = rows(Self::NAME, inputs)?;
        if self.log_sum_exp.len() != targets.len() {
            candle_core::bail!("{}: the forward's rows are not these", Self::NAME)
        }
        let per_row = self.scale / counted(targets).max(1) as f32;
        let mut d = vec![0f32; logits.len()];
        let task = rows_per_task(classes);
        d.par_chunks_mut(task * classes)
            .zip(logits.par_chunks(task * classes))
            .zip(
                targets
                    .par_chunks(task)
                    .zip(self.log_sum_exp.par_chunks(task)),
            )
            .for_each(|((d, logits), (targets, lse))| {
                let rows = logits.chunks_exact(classes).zip(targets).zip(lse);
                for (((row, &t), &lse), out) in rows.zip(d.chunks_exact_mut(classes)) {
                    if t == IGNORE_INDEX {
                        continue;
                    }
                    out.copy_from_slice(row);
                    vector_math::exp_shifted(out, lse);
                    for o in out.iter_mut() {
                        *o *= per_row;
                    }
                    out[t as usize] -= per_row;
                }
            });
        Ok((CpuStorage::F32(d), inputs[0].1.shape().clone()))
    }
}
