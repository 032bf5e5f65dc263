//! `linear_cross_entropy`: a language model's output projection and its loss as one op,
//! a chunk of rows at a time, so that the `[rows, vocab]` logits never exist whole.
//!
//! The logits are the largest tensors of a small model's step (a 49152-row vocabulary
//! makes 201 MB of them for 1024 tokens), and a graph of a matmul and a loss keeps them,
//! their gradient and the copies around them alive through backward. Here each chunk's
//! logits are made, turned into their gradient in place, and multiplied into the input's
//! and the weight's gradients before the next chunk reuses the buffer: the op's memory is
//! one chunk's logits plus the gradients themselves. The loss is the last op of a step, so
//! its backward follows its forward at once; the gradients are made in the forward (only
//! where a backward may follow and the input or weight has a gradient) and handed over by
//! the backward, scaled by the loss's incoming gradient, with no second pass over the
//! vocabulary. A backward without them (a forward run under `no_grad`) makes them then.

use crate::cpu::{f32_inputs, fused, rows_per_task, u32s};
use crate::cross_entropy::{counted, cross_entropy, log_sum_exp};
use crate::fused_op::{CpuOp, CpuOut, Fused, GradsOf, Input};
use crate::gemm::Threads::Pool;
use crate::vector_math;
use candle_core::{CpuStorage, DType, Result, Shape, Tensor};
use rayon::prelude::*;
use std::sync::Mutex;
use wick_core::{grad_enabled, IGNORE_INDEX};

/// About the most logits one chunk holds (32 MB of f32): small beside the full logits, and
/// enough rows that the weight gradient's product is not dominated by its passes over
/// the weight.
pub(crate) const CHUNK_ELEMENTS: usize = 8 << 20;

/// The mean cross-entropy of `targets` (`[n]`, u32) under the logits `x weightᵀ` (`x`
/// `[n, hidden]`, `weight` `[vocab, hidden]`), soft-capped first to `cap tanh(z / cap)`
/// when `softcap` is given (Gemma 2's final logits), over the rows whose target is not
/// [`IGNORE_INDEX`]: the same loss as [`cross_entropy`] of those logits, without making
/// them whole. Fused on the CPU for f32, bf16 and f16 inputs and u32 targets (16-bit
/// inputs are multiplied in f32, as torch's autocast computes a loss: each is cast once,
/// its own size, and the logits are still made a chunk at a time); the loss is f32.
/// [`linear_cross_entropy_composite`] elsewhere (CUDA, other dtypes), which makes the
/// whole logits.
pub fn linear_cross_entropy(
    x: &Tensor,
    weight: &Tensor,
    targets: &Tensor,
    softcap: Option<f64>,
) -> Result<Tensor> {
    let Some((x, weight, targets)) = fused_inputs("linear_cross_entropy", x, weight, targets)?
    else {
        return linear_cross_entropy_composite(x, weight, targets, softcap);
    };
    let backward_may_follow = grad_enabled();
    let op = Forward {
        softcap: softcap.map(|c| c as f32),
        wanted: Wanted {
            x: backward_may_follow && x.track_op(),
            weight: backward_may_follow && weight.track_op(),
        },
        grads: Mutex::default(),
        weights: None,
    };
    x.apply_op3(&weight, &targets, Fused(op))
}

/// `x`, `weight` and `targets` as the fused kernels take them (contiguous f32 on the CPU,
/// u32 targets) once their shapes are checked, or `None` where the op takes its composite
/// path. 16-bit inputs on the CPU are cast to f32 here: the casts are ops of the graph, so
/// their backward hands each input its gradient in its own dtype.
fn fused_inputs(
    op: &str,
    x: &Tensor,
    weight: &Tensor,
    targets: &Tensor,
) -> Result<Option<(Tensor, Tensor, Tensor)>> {
    check_shapes(op, x, weight.dims(), targets)?;
    let on_cpu = x.device().is_cpu() && weight.device().is_cpu();
    if !(on_cpu && targets.dtype() == DType::U32) {
        return Ok(None);
    }
    // Other dtypes (f64) stay as they are, and take the composite path.
    let in_f32 = |t: &Tensor| match t.dtype() {
        DType::BF16 | DType::F16 => t.to_dtype(DType::F32),
        _ => Ok(t.clone()),
    };
    let (x, weight) = (in_f32(x)?, in_f32(weight)?);
    if !fused(&[&x, &weight]) {
        return Ok(None);
    }
    Ok(Some((
        x.contiguous()?,
        weight.contiguous()?,
        targets.contiguous()?,
    )))
}

/// The same loss from Candle's ops: the whole logits, capped, in f32, then
/// [`cross_entropy`] (the fallback, and the reference in tests).
pub fn linear_cross_entropy_composite(
    x: &Tensor,
    weight: &Tensor,
    targets: &Tensor,
    softcap: Option<f64>,
) -> Result<Tensor> {
    let logits = capped(x.matmul(&weight.t()?)?, softcap)?;
    cross_entropy(&logits.to_dtype(DType::F32)?, targets)
}

/// Which gradients the op makes: the input's, the weight's.
#[derive(Clone, Copy, Debug)]
struct Wanted {
    x: bool,
    weight: bool,
}

/// The forward: the loss, and the gradients [`Wanted`] of the mean loss kept for the
/// backward, as one buffer `[dx | dweight]` (either part absent when not wanted). With
/// `weights`, the gradients are those of `Σ weights[i] loss[i]` instead (the backward of
/// [`linear_log_probs`]).
struct Forward {
    softcap: Option<f32>,
    wanted: Wanted,
    grads: Mutex<Option<Vec<f32>>>,
    weights: Option<Vec<f32>>,
}

impl CpuOp<3> for Forward {
    const NAME: &'static str = "wick-linear-cross-entropy";

    fn cpu(&self, inputs: [Input<'_>; 3]) -> CpuOut {
        let kernel = Kernel::new(Self::NAME, inputs, self.softcap)?;
        let (loss, grads) = kernel.run(self.wanted, self.weights.as_deref(), None);
        if self.wanted.x || self.wanted.weight {
            *self.grads.lock().unwrap_or_else(|e| e.into_inner()) = Some(grads);
        }
        Ok((CpuStorage::F32(vec![loss]), Shape::from(())))
    }

    fn grads(
        &self,
        [x, weight, targets]: [&Tensor; 3],
        _res: &Tensor,
        grad: &Tensor,
    ) -> GradsOf<3> {
        let (mut grads, wanted) = match self.take_grads() {
            Some(grads) => (grads, self.wanted),
            None => {
                // The forward ran where no backward was expected: make the gradients now.
                let inputs = [x, weight, targets];
                Forward::recompute(self.softcap, inputs, self.weights.clone())?
            }
        };
        let scale = grad.to_dtype(DType::F32)?.to_scalar::<f32>()?;
        if scale != 1.0 {
            grads.par_iter_mut().for_each(|g| *g *= scale);
        }
        split_grads(grads, wanted, x, weight)
    }
}

/// The buffer `[dx | dweight]` as the gradients of (x, weight, targets).
fn split_grads(grads: Vec<f32>, wanted: Wanted, x: &Tensor, weight: &Tensor) -> GradsOf<3> {
    let len = grads.len();
    let grads = Tensor::from_vec(grads, len, x.device())?;
    let (dx_len, dw_len) = (x.elem_count(), weight.elem_count());
    let dx = match wanted.x {
        true => Some(grads.narrow(0, 0, dx_len)?.reshape(x.shape())?),
        false => None,
    };
    let offset = if wanted.x { dx_len } else { 0 };
    let dw = match wanted.weight {
        true => Some(grads.narrow(0, offset, dw_len)?.reshape(weight.shape())?),
        false => None,
    };
    Ok([dx, dw, None])
}

impl Forward {
    /// The gradients the forward kept, taken out.
    fn take_grads(&self) -> Option<Vec<f32>> {
        self.grads.lock().unwrap_or_else(|e| e.into_inner()).take()
    }

    /// The gradients `[dx | dweight]` of the mean loss (`weights` `None`) or of
    /// `Σ weights[i] loss[i]`, made by a pass that records no graph, and which are wanted.
    fn recompute(
        softcap: Option<f32>,
        [x, weight, targets]: [&Tensor; 3],
        weights: Option<Vec<f32>>,
    ) -> Result<(Vec<f32>, Wanted)> {
        let again = Fused(Forward {
            softcap,
            wanted: Wanted {
                x: x.track_op(),
                weight: weight.track_op(),
            },
            grads: Mutex::default(),
            weights,
        });
        x.apply_op3_no_bwd(weight, targets, &again)?;
        Ok((again.0.take_grads().unwrap_or_default(), again.0.wanted))
    }
}

/// The log-probability of each target (`[n]`, u32) under the logits `x weightᵀ` (`x`
/// `[n, hidden]`, `weight` `[vocab, hidden]`, soft-capped first when `softcap` is given),
/// 0 where the target is [`IGNORE_INDEX`]: `[n]`, f32. What a preference loss sums over a
/// completion's tokens (TRL's `selective_log_softmax`). Fused on the CPU as
/// [`linear_cross_entropy`] is, a chunk of logits at a time; its backward makes them again,
/// since each row's gradient is scaled by its own incoming gradient, known only then.
/// [`linear_log_probs_composite`] elsewhere.
pub fn linear_log_probs(
    x: &Tensor,
    weight: &Tensor,
    targets: &Tensor,
    softcap: Option<f64>,
) -> Result<Tensor> {
    let Some((x, weight, targets)) = fused_inputs("linear_log_probs", x, weight, targets)? else {
        return linear_log_probs_composite(x, weight, targets, softcap);
    };
    let op = LogProbs {
        softcap: softcap.map(|c| c as f32),
    };
    x.apply_op3(&weight, &targets, Fused(op))
}

/// [`linear_log_probs`] from Candle's ops: the whole logits, their log-softmax, the
/// targets' entries (the fallback, and the reference in tests).
pub fn linear_log_probs_composite(
    x: &Tensor,
    weight: &Tensor,
    targets: &Tensor,
    softcap: Option<f64>,
) -> Result<Tensor> {
    let logits = capped(x.matmul(&weight.t()?)?, softcap)?.to_dtype(DType::F32)?;
    let log_probs = candle_nn::ops::log_softmax(&logits, candle_core::D::Minus1)?;
    let counted = targets.ne(IGNORE_INDEX)?;
    // An ignored target reads class 0, then counts 0.
    let safe = counted.where_cond(targets, &targets.zeros_like()?)?;
    let picked = log_probs
        .gather(&safe.to_dtype(DType::U32)?.unsqueeze(1)?, 1)?
        .squeeze(1)?;
    counted.where_cond(&picked, &picked.zeros_like()?)
}

/// The op of [`linear_log_probs`].
struct LogProbs {
    softcap: Option<f32>,
}

impl CpuOp<3> for LogProbs {
    const NAME: &'static str = "wick-linear-log-probs";

    fn cpu(&self, inputs: [Input<'_>; 3]) -> CpuOut {
        let kernel = Kernel::new(Self::NAME, inputs, self.softcap)?;
        let mut losses = vec![0f32; kernel.targets.len()];
        let none = Wanted {
            x: false,
            weight: false,
        };
        kernel.run(none, None, Some(&mut losses));
        let n = losses.len();
        let log_probs = losses.into_iter().map(|l| -l).collect();
        Ok((CpuStorage::F32(log_probs), Shape::from(n)))
    }

    fn grads(&self, inputs: [&Tensor; 3], _res: &Tensor, grad: &Tensor) -> GradsOf<3> {
        // d log p / d z = -(d loss / d z): each row's loss weighted by minus its gradient.
        let weights = grad.to_dtype(DType::F32)?.to_vec1::<f32>()?;
        let weights = weights.into_iter().map(|g| -g).collect();
        let (grads, wanted) = Forward::recompute(self.softcap, inputs, Some(weights))?;
        split_grads(grads, wanted, inputs[0], inputs[1])
    }
}

/// Checks that `x` `[n, hidden]`, `weight` `[vocab, hidden]` and `targets` `[n]` fit.
pub(crate) fn check_shapes(op: &str, x: &Tensor, weight: &[usize], targets: &Tensor) -> Result<()> {
    let (n, hidden) = x.dims2()?;
    if weight.len() != 2 || weight[1] != hidden || targets.dims() != [n] {
        candle_core::bail!(
            "{op}: x {:?}, weight {weight:?} and targets {:?} do not fit ([n, hidden], \
             [vocab, hidden], [n])",
            x.dims(),
            targets.dims()
        )
    }
    Ok(())
}

/// `logits` capped to `cap tanh(logits / cap)` where `softcap` is given, dividing as torch
/// does.
fn capped(logits: Tensor, softcap: Option<f64>) -> Result<Tensor> {
    match softcap {
        Some(cap) => {
            let cap = Tensor::new(cap as f32, logits.device())?.to_dtype(logits.dtype())?;
            logits.broadcast_div(&cap)?.tanh()?.broadcast_mul(&cap)
        }
        None => Ok(logits),
    }
}

/// One call's inputs: `x` `[n, hidden]`, `weight` `[vocab, hidden]`, `targets` `[n]`.
struct Kernel<'a> {
    x: &'a [f32],
    weight: &'a [f32],
    targets: &'a [u32],
    hidden: usize,
    vocab: usize,
    softcap: Option<f32>,
}

impl<'a> Kernel<'a> {
    fn new(op: &str, [x, weight, targets]: [Input<'a>; 3], softcap: Option<f32>) -> Result<Self> {
        let (hidden, vocab) = (x.1.dims()[1], weight.1.dims()[0]);
        let [xv, wv] = f32_inputs(op, [x, weight])?;
        let targets = u32s(op, targets.0, targets.1)?;
        if let Some(t) = targets
            .iter()
            .find(|&&t| t as usize >= vocab && t != IGNORE_INDEX)
        {
            candle_core::bail!("{op}: target {t} is not below the {vocab} classes")
        }
        Ok(Kernel {
            x: xv,
            weight: wv,
            targets,
            hidden,
            vocab,
            softcap,
        })
    }

    /// The mean loss over the counted rows and, as `wanted`, its gradients `[dx | dweight]`:
    /// those of the mean, or with `weights` of `Σ weights[i] loss[i]`. Each row's loss goes
    /// to `losses` when given. Chunks run in order and each product keeps its sums' order,
    /// so the result has the same bits on any number of threads.
    fn run(
        &self,
        wanted: Wanted,
        weights: Option<&[f32]>,
        mut losses: Option<&mut [f32]>,
    ) -> (f32, Vec<f32>) {
        let (n, h, v) = (self.targets.len(), self.hidden, self.vocab);
        let mean = 1.0 / counted(self.targets).max(1) as f32;
        let dx_len = if wanted.x { n * h } else { 0 };
        let dw_len = if wanted.weight { v * h } else { 0 };
        let mut grads = vec![0f32; dx_len + dw_len];
        let (dx, dw) = grads.split_at_mut(dx_len);
        let grads_wanted = wanted.x || wanted.weight;
        // As few chunks as the bound allows, of even sizes (no short last chunk).
        let chunks = (n * v).div_ceil(CHUNK_ELEMENTS).max(1);
        let rows = n.div_ceil(chunks).max(1);
        let mut logits = vec![0f32; rows * v];
        let mut total = 0f64;
        for start in (0..n).step_by(rows) {
            let r = rows.min(n - start);
            let z = &mut logits[..r * v];
            let x = &self.x[start * h..(start + r) * h];
            // z = x weightᵀ: weightᵀ is the weight read with its strides swapped.
            let w = self.weight;
            Pool.matmul(r, v, h, (z, v), false, (x, h, 1), (w, 1, h), 1.0);
            let chunk = Chunk {
                targets: &self.targets[start..start + r],
                scales: match weights {
                    Some(w) => Scales::Each(&w[start..start + r]),
                    None => Scales::All(mean),
                },
                losses: losses.as_deref_mut().map(|l| &mut l[start..start + r]),
            };
            total += self.rows(z, chunk, grads_wanted);
            if wanted.x {
                let dx = &mut dx[start * h..(start + r) * h];
                Pool.matmul(r, h, v, (dx, h), false, (z, v, 1), (w, h, 1), 1.0);
            }
            if wanted.weight {
                // dweight += dzᵀ x, the chunks' terms added in chunk order.
                Pool.matmul(v, h, r, (dw, h), start > 0, (z, 1, v), (x, h, 1), 1.0);
            }
        }
        ((total * mean as f64) as f32, grads)
    }

    /// Caps each row of `z` (`[rows, vocab]`), returns the rows' summed loss and, with
    /// `grads`, leaves in `z` the gradient of each row's loss times its scale with respect
    /// to the logits before the cap.
    fn rows(&self, z: &mut [f32], chunk: Chunk<'_>, grads: bool) -> f64 {
        let (v, softcap) = (self.vocab, self.softcap);
        let task = rows_per_task(v);
        let Chunk {
            targets,
            scales,
            losses,
        } = chunk;
        // Rows' losses land here when the caller does not want them (a chunk's worth).
        let mut unwanted = Vec::new();
        let losses: &mut [f32] = match losses {
            Some(l) => l,
            None => {
                unwanted.resize(targets.len(), 0.0);
                &mut unwanted
            }
        };
        z.par_chunks_mut(task * v)
            .zip(targets.par_chunks(task))
            .zip(losses.par_chunks_mut(task))
            .enumerate()
            .map_init(
                || vec![0f32; if softcap.is_some() && grads { v } else { 0 }],
                |capped, (t, ((z, targets), out))| {
                    let mut sum = 0f64;
                    let rows = z.chunks_exact_mut(v).zip(targets).zip(out);
                    for (i, ((row, &target), out)) in rows.enumerate() {
                        let grad = grads.then_some((scales.at(t * task + i), &mut capped[..]));
                        *out = row_loss(row, target, softcap, grad);
                        sum += *out as f64;
                    }
                    sum
                },
            )
            .collect::<Vec<f64>>()
            .into_iter()
            .sum()
    }
}

/// One chunk of rows: their targets, the factor of each row's loss in the gradient, and
/// where each row's loss goes, if anywhere.
struct Chunk<'a> {
    targets: &'a [u32],
    scales: Scales<'a>,
    losses: Option<&'a mut [f32]>,
}

/// Each row's factor in the gradient: one for all (the mean's), or a row's own.
#[derive(Clone, Copy)]
enum Scales<'a> {
    All(f32),
    Each(&'a [f32]),
}

impl Scales<'_> {
    fn at(self, row: usize) -> f32 {
        match self {
            Scales::All(s) => s,
            Scales::Each(s) => s[row],
        }
    }
}

/// One row's loss; caps `row` in place first. With `grad` (`scale`, a scratch row for the
/// capped logits when capping), leaves in `row` the gradient of `scale` x the loss with
/// respect to the logits before the cap (zero for an ignored row).
fn row_loss(row: &mut [f32], t: u32, softcap: Option<f32>, grad: Option<(f32, &mut [f32])>) -> f32 {
    if let Some(cap) = softcap {
        for z in row.iter_mut() {
            *z = (*z / cap).tanh() * cap;
        }
    }
    let (max, lse) = log_sum_exp(row);
    let lse = max + lse;
    let loss = match t {
        IGNORE_INDEX => 0.0,
        t => lse - row[t as usize],
    };
    let Some((scale, capped)) = grad else {
        return loss;
    };
    if t == IGNORE_INDEX {
        row.fill(0.0);
        return 0.0;
    }
    if softcap.is_some() {
        capped.copy_from_slice(row);
    }
    // softmax - one-hot, scaled.
    vector_math::exp_shifted(row, lse);
    for g in row.iter_mut() {
        *g *= scale;
    }
    row[t as usize] -= scale;
    // Through the cap: d(cap tanh(z / cap))/dz = 1 - tanh², tanh = capped / cap.
    if let Some(cap) = softcap {
        for (g, c) in row.iter_mut().zip(capped.iter()) {
            let th = c / cap;
            *g *= 1.0 - th * th;
        }
    }
    loss
}
