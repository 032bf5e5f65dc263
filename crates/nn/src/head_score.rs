//! `head_score`: an output head's projection and score (the mean loss, or each target's
//! log-probability) over a [`LayerWeight`]. A dense weight goes to [`linear_cross_entropy`]
//! and [`linear_log_probs`]; a quantized one (an embedding table held in blocks, tied to the
//! head) is decoded a slice of its rows at a time and never whole.
//!
//! [`linear_cross_entropy`] walks the rows of `x` and reads the whole weight for each chunk
//! of them, which a quantized weight would have to be decoded for each time. Here the walk
//! is over the vocabulary instead: each slice of the weight's rows is decoded once a pass,
//! multiplied into that slice's logits for every row of `x`, and folded into each row's
//! running maximum and sum of exponentials (the log-sum-exp taken online), so that a pass
//! holds one slice of the weight and of the logits. The input's gradient needs each row's
//! log-sum-exp first, so it takes a second pass that decodes and multiplies each slice
//! again: two decodings of the table and three products a step, against the dense kernel's
//! two products, for a transient of two slices in place of the decoded table (1 GiB in f32
//! for Llama 3's 128256-row vocabulary at width 2048).

use crate::cpu::{f32s, u32s};
use crate::cross_entropy::counted;
use crate::fused_op::{CpuOp, CpuOut, Fused, GradsOf, Input};
use crate::gemm::Threads::Pool;
use crate::layer_weight::LayerWeight;
use crate::linear_cross_entropy::{
    check_shapes, linear_cross_entropy, linear_cross_entropy_composite, linear_log_probs,
    linear_log_probs_composite, CHUNK_ELEMENTS,
};
use crate::vector_math;
use candle_core::{CpuStorage, DType, Result, Shape, Tensor};
use rayon::prelude::*;
use std::sync::Mutex;
use wick_core::{grad_enabled, IGNORE_INDEX};

/// About the most values a slice of the weight holds decoded (8 MB of f32): a small part
/// of any table worth quantizing, and rows enough (1024 at width 2048) that each slice's
/// products run at the GEMM's speed.
pub const SLICE_ELEMENTS: usize = 2 << 20;

/// What an output head computes against the targets.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HeadScore {
    /// The mean cross-entropy of the counted targets, a scalar ([`linear_cross_entropy`]).
    MeanLoss,
    /// Each target's log-probability (0 where ignored), `[n]`, f32 ([`linear_log_probs`]).
    LogProbs,
}

/// `score` of `targets` (`[n]`, u32) under the logits `x weightᵀ` (`x` `[n, width]`, an
/// output `weight` `[vocab, width]`), soft-capped at `softcap` where given: for a dense
/// weight [`linear_cross_entropy`] or [`linear_log_probs`]. A quantized weight takes no
/// gradient and is decoded a slice of rows at a time on the CPU (inputs in f32, bf16 or
/// f16, cast to f32; the log-probabilities' backward makes the slices again, with each
/// row's log-sum-exp kept from the forward), and whole elsewhere, for the composite.
pub fn head_score(
    score: HeadScore,
    x: &Tensor,
    weight: &LayerWeight,
    targets: &Tensor,
    softcap: Option<f64>,
) -> Result<Tensor> {
    match (weight, score) {
        (LayerWeight::Dense(w), HeadScore::MeanLoss) => {
            return linear_cross_entropy(x, w, targets, softcap)
        }
        (LayerWeight::Dense(w), HeadScore::LogProbs) => {
            return linear_log_probs(x, w, targets, softcap)
        }
        // A quantized weight: the sliced kernel where it runs, the composite over the
        // decoded weight elsewhere.
        _ => {}
    }
    let name = match score {
        HeadScore::MeanLoss => "head_score (mean loss)",
        HeadScore::LogProbs => "head_score (log-probabilities)",
    };
    let Some((x32, targets32)) = sliced_inputs(name, x, weight, targets)? else {
        let dense = weight.decoded_for(x)?;
        return match score {
            HeadScore::MeanLoss => linear_cross_entropy_composite(x, &dense, targets, softcap),
            HeadScore::LogProbs => linear_log_probs_composite(x, &dense, targets, softcap),
        };
    };
    let mode = match score {
        HeadScore::MeanLoss => Mode::MeanLoss {
            want_dx: grad_enabled() && x32.track_op(),
            grads: Mutex::default(),
        },
        HeadScore::LogProbs => Mode::LogProbs {
            lse: Mutex::default(),
        },
    };
    x32.apply_op2(&targets32, Fused(Sliced::new(weight, softcap, mode)))
}

/// `x` (in f32, contiguous) and `targets` as the sliced kernel takes them once their shapes
/// are checked, or `None` where the composite runs (off the CPU, other dtypes).
fn sliced_inputs(
    op: &str,
    x: &Tensor,
    weight: &LayerWeight,
    targets: &Tensor,
) -> Result<Option<(Tensor, Tensor)>> {
    check_shapes(op, x, weight.dims(), targets)?;
    let on_cpu = x.device().is_cpu() && targets.dtype() == DType::U32;
    if !(on_cpu && matches!(x.dtype(), DType::F32 | DType::BF16 | DType::F16)) {
        return Ok(None);
    }
    // The cast is an op of the graph: its backward hands x its gradient in its own dtype.
    Ok(Some((
        x.to_dtype(DType::F32)?.contiguous()?,
        targets.contiguous()?,
    )))
}

/// What the op computes, and what it keeps for its backward.
enum Mode {
    /// The mean loss; x's gradient made in the forward where wanted, handed over by the
    /// backward (the loss is the last op of a step).
    MeanLoss {
        want_dx: bool,
        grads: Mutex<Option<Vec<f32>>>,
    },
    /// Each row's log-probability; the backward makes x's gradient, each row weighted,
    /// from each row's log-sum-exp, which the forward keeps (a pass over the vocabulary
    /// the backward need not make again).
    LogProbs { lse: Mutex<Option<Vec<f32>>> },
}

/// The op over `x` and `targets`, the quantized weight held in it.
struct Sliced {
    weight: LayerWeight,
    softcap: Option<f32>,
    mode: Mode,
}

impl Sliced {
    fn new(weight: &LayerWeight, softcap: Option<f64>, mode: Mode) -> Self {
        Sliced {
            weight: weight.clone(),
            softcap: softcap.map(|c| c as f32),
            mode,
        }
    }

    /// The kernel over `x` (`[n, width]`) and `targets`.
    fn kernel<'a>(&'a self, x: Input<'a>, targets: Input<'a>) -> Result<Kernel<'a>> {
        let (vocab, width) = self.weight.out_in()?;
        let targets = u32s(Self::NAME, targets.0, targets.1)?;
        if let Some(t) = (targets.iter()).find(|&&t| t as usize >= vocab && t != IGNORE_INDEX) {
            candle_core::bail!(
                "{}: target {t} is not below the {vocab} classes",
                Self::NAME
            )
        }
        Ok(Kernel {
            x: f32s(Self::NAME, x.0, x.1)?,
            weight: &self.weight,
            targets,
            width,
            vocab,
            softcap: self.softcap,
        })
    }

    /// x's gradient of `Σ scale_i loss_i` by a pass of its own over `inputs`, from each
    /// row's log-sum-exp where the forward kept it (made again where not).
    fn dx(
        &self,
        [x, targets]: [&Tensor; 2],
        scales: Scales<'_>,
        kept_lse: Option<Vec<f32>>,
    ) -> Result<Tensor> {
        let (xs, xl) = x.storage_and_layout();
        let (ts, tl) = targets.storage_and_layout();
        let (candle_core::Storage::Cpu(xs), candle_core::Storage::Cpu(ts)) = (&*xs, &*ts) else {
            candle_core::bail!("{}: the sliced kernel runs on the CPU", Self::NAME)
        };
        let kernel = self.kernel((xs, xl), (ts, tl))?;
        let lse = match kept_lse {
            Some(lse) if lse.len() == kernel.targets.len() => lse,
            _ => kernel.log_sum_exp()?.lse,
        };
        Tensor::from_vec(kernel.dx(&lse, scales)?, x.shape(), x.device())
    }
}

impl CpuOp<2> for Sliced {
    const NAME: &'static str = "wick-head-score";

    fn cpu(&self, [x, targets]: [Input<'_>; 2]) -> CpuOut {
        let kernel = self.kernel(x, targets)?;
        let Scored { lse, losses } = kernel.log_sum_exp()?;
        match &self.mode {
            Mode::MeanLoss { want_dx, grads } => {
                let mean = 1.0 / counted(kernel.targets).max(1) as f32;
                let total: f64 = losses.iter().map(|&l| f64::from(l)).sum();
                if *want_dx {
                    let dx = kernel.dx(&lse, Scales::All(mean))?;
                    *grads.lock().unwrap_or_else(|e| e.into_inner()) = Some(dx);
                }
                let loss = (total * f64::from(mean)) as f32;
                Ok((CpuStorage::F32(vec![loss]), Shape::from(())))
            }
            Mode::LogProbs { lse: kept } => {
                *kept.lock().unwrap_or_else(|e| e.into_inner()) = Some(lse);
                let n = losses.len();
                let log_probs = losses.into_iter().map(|l| -l).collect();
                Ok((CpuStorage::F32(log_probs), Shape::from(n)))
            }
        }
    }

    fn grads(&self, [x, targets]: [&Tensor; 2], _res: &Tensor, grad: &Tensor) -> GradsOf<2> {
        if !x.track_op() {
            return Ok([None, None]);
        }
        let dx = match &self.mode {
            Mode::MeanLoss { grads, .. } => {
                let kept = grads.lock().unwrap_or_else(|e| e.into_inner()).take();
                let dx = match kept {
                    Some(dx) => Tensor::from_vec(dx, x.shape(), x.device())?,
                    // The forward ran where no backward was expected: make it now.
                    None => {
                        let mean = 1.0 / counted(&targets.to_vec1::<u32>()?).max(1) as f32;
                        self.dx([x, targets], Scales::All(mean), None)?
                    }
                };
                dx.broadcast_mul(&grad.to_dtype(DType::F32)?)?
            }
            Mode::LogProbs { lse } => {
                // d log p / d z = -(d loss / d z): each row's loss weighted by minus its
                // incoming gradient.
                let weights = grad.to_dtype(DType::F32)?.neg()?.to_vec1::<f32>()?;
                let kept = lse.lock().unwrap_or_else(|e| e.into_inner()).take();
                self.dx([x, targets], Scales::Each(&weights), kept)?
            }
        };
        Ok([Some(dx), None])
    }
}

/// Each row's factor in the gradient: one for all (the mean's), or a row's own.
#[derive(Clone, Copy)]
enum Scales<'a> {
    All(f32),
    Each(&'a [f32]),
}

/// One call's inputs: `x` `[n, width]`, the weight `[vocab, width]`, `targets` `[n]`.
struct Kernel<'a> {
    x: &'a [f32],
    weight: &'a LayerWeight,
    targets: &'a [u32],
    width: usize,
    vocab: usize,
    softcap: Option<f32>,
}

impl Kernel<'_> {
    /// Rows of the weight a slice holds: as many as keep the slice's logits within the
    /// dense kernel's chunk and its decoded rows within [`SLICE_ELEMENTS`].
    fn slice_rows(&self) -> usize {
        let n = self.targets.len().max(1);
        (CHUNK_ELEMENTS / n)
            .min(SLICE_ELEMENTS / self.width.max(1))
            .clamp(1, self.vocab.max(1))
    }

    /// Each slice in order as `(first row, rows, its decoded rows, the logits)`: the rows
    /// `[rows, width]` decoded into `table`, and `z` `[n, rows]` = x rowsᵀ, capped.
    fn each_slice(
        &self,
        mut f: impl FnMut(usize, usize, &[f32], &mut [f32]) -> Result<()>,
    ) -> Result<()> {
        let (n, width, step) = (self.targets.len(), self.width, self.slice_rows());
        let mut table = vec![0f32; step * width];
        let mut logits = vec![0f32; n * step];
        for first in (0..self.vocab).step_by(step) {
            let rows = step.min(self.vocab - first);
            let (w, z) = (&mut table[..rows * width], &mut logits[..n * rows]);
            self.weight.decode_values(first * width, w)?;
            // z = x wᵀ: wᵀ is w read with its strides swapped.
            Pool.matmul(
                n,
                rows,
                width,
                (z, rows),
                false,
                (self.x, width, 1),
                (w, 1, width),
                1.0,
            );
            if let Some(cap) = self.softcap {
                z.par_iter_mut().for_each(|z| *z = (*z / cap).tanh() * cap);
            }
            f(first, rows, w, z)?;
        }
        Ok(())
    }

    /// Each row's log-sum-exp over the (capped) logits, taken online slice by slice (a
    /// running maximum, and the sum of exponentials rescaled when the maximum grows), and
    /// its loss, `lse - z[target]` (0 where ignored).
    fn log_sum_exp(&self) -> Result<Scored> {
        let n = self.targets.len();
        let mut max = vec![f32::NEG_INFINITY; n];
        let mut sum = vec![0f32; n];
        let mut picked = vec![0f32; n];
        self.each_slice(|first, rows, _, z| {
            let slice = first as u32..(first + rows) as u32;
            let rows_of = z.par_chunks(rows.max(1)).zip(self.targets);
            (rows_of.zip(&mut max).zip(&mut sum).zip(&mut picked)).for_each(
                |((((row, &t), m), s), p)| {
                    let grown = m.max(vector_math::max(row));
                    *s = *s * (*m - grown).exp() + vector_math::sum_exp_shifted(row, grown);
                    *m = grown;
                    if slice.contains(&t) {
                        *p = row[(t - slice.start) as usize];
                    }
                },
            );
            Ok(())
        })?;
        let lse: Vec<f32> = max.iter().zip(&sum).map(|(m, s)| m + s.ln()).collect();
        let losses = (self.targets.iter().zip(&lse).zip(&picked))
            .map(|((&t, lse), z)| if t == IGNORE_INDEX { 0.0 } else { lse - z })
            .collect();
        Ok(Scored { lse, losses })
    }

    /// x's gradient of `Σ scale_i loss_i`, given each row's log-sum-exp: a second pass over
    /// the slices, each slice's logits turned into their gradient in place and multiplied
    /// into x's, the slices' terms added in slice order.
    fn dx(&self, lse: &[f32], scales: Scales<'_>) -> Result<Vec<f32>> {
        let (n, width, softcap) = (self.targets.len(), self.width, self.softcap);
        let mut dx = vec![0f32; n * width];
        self.each_slice(|first, rows, w, z| {
            let slice = first as u32..(first + rows) as u32;
            let scratch = || vec![0f32; if softcap.is_some() { rows } else { 0 }];
            (z.par_chunks_mut(rows.max(1)).enumerate()).for_each_init(scratch, |capped, (i, g)| {
                let t = self.targets[i];
                if t == IGNORE_INDEX {
                    g.fill(0.0);
                    return;
                }
                let scale = match scales {
                    Scales::All(s) => s,
                    Scales::Each(s) => s[i],
                };
                let kept = capped.len();
                capped.copy_from_slice(&g[..kept]);
                // softmax - one-hot, scaled.
                vector_math::exp_shifted(g, lse[i]);
                g.iter_mut().for_each(|g| *g *= scale);
                if slice.contains(&t) {
                    g[(t - slice.start) as usize] -= scale;
                }
                // Through the cap: d(cap tanh(u / cap))/du = 1 - tanh², tanh = capped / cap.
                if let Some(cap) = softcap {
                    for (g, c) in g.iter_mut().zip(capped.iter()) {
                        *g *= 1.0 - (c / cap) * (c / cap);
                    }
                }
            });
            let (dx, z) = ((&mut dx[..], width), (&*z, rows, 1));
            Pool.matmul(n, width, rows, dx, first > 0, z, (w, width, 1), 1.0);
            Ok(())
        })?;
        Ok(dx)
    }
}

/// Each row's log-sum-exp of its logits, and its loss.
struct Scored {
    lse: Vec<f32>,
    losses: Vec<f32>,
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::{Device, Storage, Var};
    use wick_core::BlockFormat;

    /// The forward of the log-probabilities keeps each row's log-sum-exp, and the backward
    /// takes it (once) and makes from it the gradient a fresh pass makes.
    #[test]
    fn the_log_probabilities_keep_each_rows_log_sum_exp_for_their_backward() {
        let dense = Tensor::randn(0f32, 1.0, (300, 64), &Device::Cpu).unwrap();
        let weight = LayerWeight::quantize(&dense, BlockFormat::Q8_0).unwrap();
        // A variable, so that the backward makes x's gradient.
        let x = Var::randn(0f32, 1.0, (5, 64), &Device::Cpu).unwrap();
        let x = x.as_tensor();
        let targets = Tensor::new(&[1u32, 7, 299, IGNORE_INDEX, 42], &Device::Cpu).unwrap();
        let mode = Mode::LogProbs {
            lse: Mutex::default(),
        };
        let op = Sliced::new(&weight, None, mode);
        let Mode::LogProbs { lse } = &op.mode else {
            unreachable!("made as LogProbs")
        };
        {
            let (xs, xl) = x.storage_and_layout();
            let (ts, tl) = targets.storage_and_layout();
            let (Storage::Cpu(xs), Storage::Cpu(ts)) = (&*xs, &*ts) else {
                unreachable!("on the CPU")
            };
            op.cpu([(xs, xl), (ts, tl)]).unwrap();
        }
        let kept = lse.lock().unwrap().clone().expect("the forward keeps it");
        assert_eq!(kept.len(), 5);

        let weights = [0.5f32, -1.0, 2.0, 1.0, 0.25];
        let fresh = op.dx([x, &targets], Scales::Each(&weights), None).unwrap();
        let grad = Tensor::new(&weights, &Device::Cpu).unwrap().neg().unwrap();
        let [dx, _] = op.grads([x, &targets], x, &grad).unwrap();
        assert!(lse.lock().unwrap().is_none(), "the backward takes it");
        let bits = |t: &Tensor| -> Vec<u32> {
            let v = t.flatten_all().unwrap().to_vec1::<f32>().unwrap();
            v.iter().map(|x| x.to_bits()).collect()
        };
        assert_eq!(bits(&dx.expect("x is a variable")), bits(&fresh));
    }
}
