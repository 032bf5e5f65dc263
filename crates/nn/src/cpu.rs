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

/// A new vector of `len` elements, made in parallel tasks of `chunk` elements each:
/// `fill(i, out)` writes chunk `i`, which its own task has just zeroed. Returns the vector
/// and each task's result, in chunk order. `spare` more elements of capacity are reserved
/// for the caller to push.
///
/// `vec![0f32; len]` would zero the whole output on the calling thread first, while the
/// pool's other threads wait: a serial `memset` of memory freed long before, 3.5% of the
/// samples of the d512 GPT's step (`perf`, 2026-12-07). Zeroed inside its task, a chunk
/// is zeroed in parallel, and its lines are in cache when `fill` writes them.
pub(crate) fn new_in_tasks<R: Send>(
    len: usize,
    spare: usize,
    chunk: usize,
    fill: impl Fn(usize, &mut [f32]) -> R + Sync,
) -> (Vec<f32>, Vec<R>) {
    let mut out = Vec::<f32>::with_capacity(len + spare);
    let results = out.spare_capacity_mut()[..len]
        .par_chunks_mut(chunk.max(1))
        .enumerate()
        .map(|(i, part)| {
            for slot in part.iter_mut() {
                slot.write(0.0);
            }
            // SAFETY: every element of `part` was written just above, and `MaybeUninit<f32>`
            // has the layout of `f32`.
            let part = unsafe { &mut *(part as *mut [std::mem::MaybeUninit<f32>] as *mut [f32]) };
            fill(i, part)
        })
        .collect();
    // SAFETY: the chunks cover the first `len` elements, and each task wrote all of its
    // chunk before `collect` returned; a panic in a task unwinds past this line, and the
    // vector is dropped with length 0.
    unsafe { out.set_len(len) };
    (out, results)
}

/// [`new_in_tasks`] without results or spare capacity.
pub(crate) fn new_in_chunks(
    len: usize,
    chunk: usize,
    fill: impl Fn(usize, &mut [f32]) + Sync,
) -> Vec<f32> {
    new_in_tasks(len, 0, chunk, fill).0
}

/// `kernel(out, a, b)` over equal chunks of `a` and `b`, in parallel tasks; returns the
/// output. `op` names the op in the error of inputs of two lengths.
pub(crate) fn map_pairs(
    op: &str,
    a: &[f32],
    b: &[f32],
    kernel: fn(&mut [f32], &[f32], &[f32]),
) -> Result<Vec<f32>> {
    same_lengths(op, a, b)?;
    Ok(new_in_chunks(a.len(), ELEMENTWISE_CHUNK, |i, y| {
        let at = i * ELEMENTWISE_CHUNK;
        kernel(y, &a[at..at + y.len()], &b[at..at + y.len()])
    }))
}

/// An error unless `a` and `b`, two inputs of `op` read element by element, are as long.
fn same_lengths(op: &str, a: &[f32], b: &[f32]) -> Result<()> {
    match a.len() == b.len() {
        true => Ok(()),
        false => candle_core::bail!("{op}: inputs of {} and {} elements", a.len(), b.len()),
    }
}

/// `f(row, out)` for every row of `c` elements of `x`, rows shared out in parallel tasks
/// of whole rows; returns the outputs, row by row.
pub(crate) fn map_rows(x: &[f32], c: usize, f: impl Fn(&[f32], &mut [f32]) + Sync) -> Vec<f32> {
    let task = rows_per_task(c) * c;
    new_in_chunks(x.len(), task, |i, y| {
        let x = &x[i * task..i * task + y.len()];
        for (row, out) in x.chunks_exact(c).zip(y.chunks_exact_mut(c)) {
            f(row, out);
        }
    })
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
    let task = rows_per_task(c) * c;
    let (mut dx, partials) = new_in_tasks(x.len(), partial_len, task, |i, dx| {
        let at = i * task;
        let (x, dy) = (&x[at..at + dx.len()], &dy[at..at + dx.len()]);
        let mut partial = vec![0f32; partial_len];
        for ((x, dy), dx) in x
            .chunks_exact(c)
            .zip(dy.chunks_exact(c))
            .zip(dx.chunks_exact_mut(c))
        {
            row(x, dy, dx, &mut partial);
        }
        partial
    });
    // Within the capacity reserved: no copy of `dx`.
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
        same_lengths(Self::NAME, x, dy)?;
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
