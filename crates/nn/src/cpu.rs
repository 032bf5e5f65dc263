//! The f32 slices behind CPU storages, for the fused ops.

use crate::fused_op::{CpuOp, CpuOut, Fused, GradsOf, Input};
use candle_core::{CpuStorage, Layout, Result, Shape, Tensor};
use rayon::prelude::*;

/// The contiguous f32 elements a layout reads from a CPU storage.
pub(crate) fn f32s<'a>(op: &str, storage: &'a CpuStorage, layout: &Layout) -> Result<&'a [f32]> {
    let (start, end) = layout
        .contiguous_offsets()
        .ok_or_else(|| candle_core::Error::Msg(format!("{op}: inputs must be contiguous")))?;
    Ok(&storage.as_slice::<f32>()?[start..end])
}

/// [`f32s`] of several inputs at once, in order.
pub(crate) fn f32_inputs<'a, const N: usize>(
    op: &str,
    inputs: [(&'a CpuStorage, &Layout); N],
) -> Result<[&'a [f32]; N]> {
    let mut out = [&[][..]; N];
    for (slot, (storage, layout)) in out.iter_mut().zip(inputs) {
        *slot = f32s(op, storage, layout)?;
    }
    Ok(out)
}

/// Elements per parallel task of an element-wise kernel.
pub(crate) const ELEMENTWISE_CHUNK: usize = 32 * 1024;

/// `kernel(out, a, b)` over equal chunks of `a` and `b` (of one length), in parallel tasks;
/// returns the output.
pub(crate) fn map_pairs(a: &[f32], b: &[f32], kernel: fn(&mut [f32], &[f32], &[f32])) -> Vec<f32> {
    let mut y = vec![0f32; a.len()];
    y.par_chunks_mut(ELEMENTWISE_CHUNK)
        .zip(
            a.par_chunks(ELEMENTWISE_CHUNK)
                .zip(b.par_chunks(ELEMENTWISE_CHUNK)),
        )
        .for_each(|(y, (a, b))| kernel(y, a, b));
    y
}

/// `f(row, out)` for every row of `c` elements of `x`, rows shared out in parallel tasks
/// of whole rows; returns the outputs, row by row.
pub(crate) fn map_rows(x: &[f32], c: usize, f: impl Fn(&[f32], &mut [f32]) + Sync) -> Vec<f32> {
    let mut y = vec![0f32; x.len()];
    let task = rows_per_task(c) * c;
    y.par_chunks_mut(task)
        .zip(x.par_chunks(task))
        .for_each(|(y, x)| {
            for (row, out) in x.chunks_exact(c).zip(y.chunks_exact_mut(c)) {
                f(row, out);
            }
        });
    y
}

/// The contiguous u32 elements a layout reads from a CPU storage.
pub(crate) fn u32s<'a>(op: &str, storage: &'a CpuStorage, layout: &Layout) -> Result<&'a [u32]> {
    let (start, end) = layout
        .contiguous_offsets()
        .ok_or_else(|| candle_core::Error::Msg(format!("{op}: inputs must be contiguous")))?;
    Ok(&storage.as_slice::<u32>()?[start..end])
}

/// Whether the fused CPU path takes these tensors: f32 on the CPU.
pub(crate) fn fused(tensors: &[&candle_core::Tensor]) -> bool {
    tensors
        .iter()
        .all(|t| t.device().is_cpu() && t.dtype() == candle_core::DType::F32)
}

/// `t` in f32: layer norm and softmax compute in f32 whatever their inputs' dtype, as
/// torch's autocast keeps them (f16 loses small variances and large exponents).
pub(crate) fn as_f32(t: &candle_core::Tensor) -> candle_core::Result<candle_core::Tensor> {
    t.to_dtype(candle_core::DType::F32)
}

/// Rows per parallel task, chosen so that a task does at least ~32k elements of work.
pub(crate) fn rows_per_task(row_len: usize) -> usize {
    (32 * 1024 / row_len.max(1)).max(1)
}

/// Sums per-chunk partial vectors in chunk order: the same result on any number of threads.
pub(crate) fn sum_in_order(partials: Vec<Vec<f32>>, len: usize) -> Vec<f32> {
    let mut total = vec![0f32; len];
    for part in partials {
        for (t, p) in total.iter_mut().zip(part) {
            *t += p;
        }
    }
    total
}

/// The row length of a norm's input, checked against its weight's element count.
pub(crate) fn norm_width(op: &str, x: &Layout, w: &Layout) -> Result<usize> {
    let c = x.shape().dims().last().copied().unwrap_or(1);
    if w.shape().elem_count() != c {
        candle_core::bail!(
            "{op}: weight has {} elements for rows of {c}",
            w.shape().elem_count()
        )
    }
    Ok(c)
}

/// A norm's backward over rows of `c`: `row(x, dy, dx, partial)` fills each row's `dx` and
/// adds its share of the weight gradients into `partial` (`partial_len` long). Rows run in
/// parallel tasks; each task's partial sums are added in task order, so the result has the
/// same bits on any number of threads. Returns `dx` followed by the summed partials.
pub(crate) fn norm_backward(
    x: &[f32],
    dy: &[f32],
    c: usize,
    partial_len: usize,
    row: impl Fn(&[f32], &[f32], &mut [f32], &mut [f32]) + Sync,
) -> Vec<f32> {
    let mut dx = vec![0f32; x.len()];
    let task = rows_per_task(c) * c;
    let partials: Vec<Vec<f32>> = dx
        .par_chunks_mut(task)
        .zip(x.par_chunks(task).zip(dy.par_chunks(task)))
        .map(|(dx, (x, dy))| {
            let mut partial = vec![0f32; partial_len];
            for ((x, dy), dx) in x
                .chunks_exact(c)
                .zip(dy.chunks_exact(c))
                .zip(dx.chunks_exact_mut(c))
            {
                row(x, dy, dx, &mut partial);
            }
            partial
        })
        .collect();
    dx.extend(sum_in_order(partials, partial_len));
    dx
}

/// What one norm's backward does to one row, the rest of its op being [`NormBackward`]'s.
pub(crate) trait NormRowGrad: Send + Sync {
    /// The op's name, for errors and the profiler.
    const NAME: &'static str;
    /// How many weight-shaped gradients the norm has: 1 (its weight) or 2 (weight, bias).
    const WEIGHT_GRADS: usize;

    /// Fills `dx` for `row` from `dy` and the weight `w`, adding the row's share of the
    /// weight gradients (`WEIGHT_GRADS` of `w`'s length, one after another) into `partial`.
    fn row(&self, row: &[f32], dy: &[f32], w: &[f32], dx: &mut [f32], partial: &mut [f32]);
}

/// (x, weight, dy) -> [dx, the weight gradients] end to end, one op for any norm.
pub(crate) struct NormBackward<K>(pub(crate) K);

impl<K: NormRowGrad> CpuOp<3> for NormBackward<K> {
    const NAME: &'static str = K::NAME;

    fn cpu(&self, inputs: [Input<'_>; 3]) -> CpuOut {
        let c = norm_width(Self::NAME, inputs[0].1, inputs[1].1)?;
        let [x, w, dy] = f32_inputs(Self::NAME, inputs)?;
        let parts = K::WEIGHT_GRADS * c;
        let out = norm_backward(x, dy, c, parts, |row, g, dx, partial| {
            self.0.row(row, g, w, dx, partial)
        });
        Ok((CpuStorage::F32(out), Shape::from(x.len() + parts)))
    }
}

/// The gradients of a norm of `x` by weight `w` for `grad`, from one [`NormBackward`]: `x`'s,
/// then the `N - 1` (`K::WEIGHT_GRADS`) weight-shaped ones.
pub(crate) fn norm_grads<K: NormRowGrad, const N: usize>(
    kernel: K,
    x: &Tensor,
    w: &Tensor,
    grad: &Tensor,
) -> GradsOf<N> {
    debug_assert_eq!(N, 1 + K::WEIGHT_GRADS);
    let all = x.apply_op3_no_bwd(w, &grad.contiguous()?, &Fused(NormBackward(kernel)))?;
    let (n, c) = (x.elem_count(), w.elem_count());
    let mut grads = [(); N].map(|_| None);
    grads[0] = Some(all.narrow(0, 0, n)?.reshape(x.shape())?);
    for (k, slot) in grads.iter_mut().enumerate().skip(1) {
        *slot = Some(all.narrow(0, n + (k - 1) * c, c)?.reshape(w.shape())?);
    }
    Ok(grads)
}
