//! Gradient clipping by global norm, across shards.

use candle_core::{CpuStorage, CustomOp1, DType, Layout, Shape, Tensor};
use rayon::prelude::*;
use wick_core::{Collective, CollectiveExt, ReduceOp, Result};

use crate::isa::{in_each_isa, Isa};

/// One gradient's part of the squared global norm, and whether it holds inf or NaN.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) struct Squares {
    /// The sum of the squares of its elements.
    pub(crate) sum: f64,
    /// Whether some element is inf or NaN.
    pub(crate) nonfinite: bool,
}

impl Squares {
    /// `g`'s squares, on `g`'s device (one scalar read back). Contiguous f32 on the CPU is
    /// summed in f64 in one pass that makes no copy ([`SumOfSquares`]); that sum is finite
    /// exactly when every element is, since a finite f32's square is below 2^256, so the
    /// same pass is the inf and NaN check. Elsewhere the squares are summed in f32, which
    /// a finite element above 2^64 overflows, so the check is a pass of its own: zero times
    /// each element sums to NaN exactly when one is inf or NaN.
    pub(crate) fn of(g: &Tensor) -> Result<Squares> {
        if g.device().is_cpu() && g.dtype() == DType::F32 {
            let sum = g
                .contiguous()?
                .apply_op1_no_bwd(&SumOfSquares)?
                .to_scalar::<f64>()?;
            return Ok(Squares {
                sum,
                nonfinite: !sum.is_finite(),
            });
        }
        let g = g.to_dtype(DType::F32)?;
        let sum = g.sqr()?.sum_all()?.to_scalar::<f32>()?;
        let zeros = g.affine(0.0, 0.0)?.sum_all()?.to_scalar::<f32>()?;
        Ok(Squares {
            sum: f64::from(sum),
            nonfinite: zeros.is_nan(),
        })
    }
}

/// Each of `grads`' [`Squares`], in order.
pub(crate) fn squares_each(grads: &[Tensor]) -> Result<Vec<Squares>> {
    grads.iter().map(Squares::of).collect()
}

/// The sum of the squares of every element of `grads`, this rank's part of the squared
/// global norm, added in order.
pub(crate) fn sum_of_squares(grads: &[Tensor]) -> Result<f64> {
    Ok(squares_each(grads)?.iter().map(|s| s.sum).sum())
}

/// Elements a parallel task of [`SumOfSquares`] sums.
const CHUNK: usize = 16 * 1024;

/// The sum of a contiguous f32 tensor's squares, as one f64: each fixed chunk summed in
/// eight f64 lanes, on the calling thread's rayon pool, and the chunks' sums added in
/// order, so the bits do not depend on the number of threads.
struct SumOfSquares;

impl CustomOp1 for SumOfSquares {
    fn name(&self) -> &'static str {
        "wick-sum-of-squares"
    }

    fn cpu_fwd(&self, s: &CpuStorage, l: &Layout) -> candle_core::Result<(CpuStorage, Shape)> {
        let Some((start, end)) = l.contiguous_offsets() else {
            candle_core::bail!("sum of squares: the gradient must be contiguous")
        };
        let xs = &s.as_slice::<f32>()?[start..end];
        let isa = Isa::widest();
        let chunks: Vec<f64> = xs
            .par_chunks(CHUNK)
            .map(|chunk| chunk_squares(isa, chunk))
            .collect();
        Ok((CpuStorage::F64(vec![chunks.iter().sum()]), Shape::from(())))
    }
}

in_each_isa! {
    /// One chunk's sum of squares in eight f64 lanes, added in a fixed order, in version
    /// `isa`. Every version gives the same bits: each conversion, multiply and add rounds on
    /// its own.
    fn chunk_squares(chunk: &[f32]) -> f64 = lanes_of
}

/// [`chunk_squares`]' sum, compiled into each version.
#[inline(always)]
fn lanes_of(chunk: &[f32]) -> f64 {
    let mut lanes = [0f64; 8];
    let eights = chunk.chunks_exact(8);
    let tail: f64 = eights
        .remainder()
        .iter()
        .map(|&x| f64::from(x) * f64::from(x))
        .sum();
    for eight in eights {
        for (lane, &x) in lanes.iter_mut().zip(eight) {
            *lane += f64::from(x) * f64::from(x);
        }
    }
    lanes.iter().sum::<f64>() + tail
}

/// Scales `grads` in place so that their global norm, `norm`, is at most `max_norm`, the
/// way torch's `clip_grad_norm_` does (coefficient `max_norm / (norm + 1e-6)`, never above
/// 1); nothing without a `max_norm`.
pub(crate) fn clip_to(grads: &mut [Tensor], norm: f64, max_norm: Option<f64>) -> Result<()> {
    let Some(max_norm) = max_norm else {
        return Ok(());
    };
    let coefficient = max_norm / (norm + 1e-6);
    if coefficient < 1.0 {
        for g in grads.iter_mut() {
            *g = g.affine(coefficient, 0.0)?;
        }
    }
    Ok(())
}

/// The global L2 norm of `grads` (what a step reports), which are then clipped to
/// `max_norm` ([`clip_to`]).
///
/// `shards_over`: the world whose ranks hold disjoint parts of the gradients (shards); the
/// squares are summed over it. `None` when every rank holds whole gradients.
pub(crate) fn clip_grad_norm(
    grads: &mut [Tensor],
    max_norm: Option<f64>,
    shards_over: Option<&dyn Collective>,
) -> Result<f64> {
    let mut squares = sum_of_squares(grads)?;
    if let Some(world) = shards_over {
        squares = world.all_reduce_scalar(squares as f32, ReduceOp::Sum)? as f64;
    }
    let norm = squares.sqrt();
    clip_to(grads, norm, max_norm)?;
    Ok(norm)
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::Device;

    #[test]
    fn sum_of_squares_is_the_f64_sum_with_the_same_bits_on_any_number_of_threads() {
        // Several chunks and a part of one, a transposed view (made contiguous first), and a
        // bf16 tensor (Candle's ops).
        let values: Vec<f32> = (0..3 * CHUNK + 77)
            .map(|i| ((i as f32) * 0.37).sin() * 1e3)
            .collect();
        let big = Tensor::new(values.as_slice(), &Device::Cpu).unwrap();
        let t = Tensor::new(&[[1f32, 2.0, 3.0], [4.0, 5.0, 6.0]], &Device::Cpu)
            .unwrap()
            .t()
            .unwrap();
        let half = Tensor::new(&[3f32, 4.0], &Device::Cpu)
            .unwrap()
            .to_dtype(DType::BF16)
            .unwrap();
        let grads = [big, t, half];
        let want: f64 = values
            .iter()
            .map(|&x| f64::from(x) * f64::from(x))
            .sum::<f64>()
            + 91.0
            + 25.0;
        let in_pool = |threads| {
            rayon::ThreadPoolBuilder::new()
                .num_threads(threads)
                .build()
                .unwrap()
                .install(|| sum_of_squares(&grads).unwrap())
        };
        let one = in_pool(1);
        assert!((one - want).abs() <= 1e-12 * want, "{one} against {want}");
        assert_eq!(one.to_bits(), in_pool(3).to_bits());
        // Every version this CPU runs gives the baseline's bits.
        let chunk = &values[..CHUNK - 5];
        for isa in Isa::ALL.into_iter().filter(|isa| isa.runs_here()) {
            assert_eq!(
                chunk_squares(isa, chunk).to_bits(),
                lanes_of(chunk).to_bits(),
                "{isa:?}"
            );
        }
    }
}
