//! The arithmetic of reductions over several ranks' buffers.

use wick_core::ReduceOp;

const BLOCK: usize = 1024;

/// Writes `dst[i] = src_0[i] + src_1[i] + ...` (in rank order, so every run and every rank
/// computes the same bits), scaled by 1/n for a mean. `srcs(s)` is rank s's input; a source
/// may be `dst` itself (each element is read before it is written).
///
/// # Safety
/// Every source pointer must be valid for `len` reads and `dst` for `len` writes, with no
/// other thread writing these ranges during the call.
pub(crate) unsafe fn reduce_ranks(
    dst: *mut f32,
    len: usize,
    n_ranks: usize,
    srcs: impl Fn(usize) -> *const f32,
    op: ReduceOp,
) {
    let scale = match op {
        ReduceOp::Sum => 1.0,
        ReduceOp::Mean => 1.0 / n_ranks as f32,
    };
    let mut acc = [0f32; BLOCK];
    let mut start = 0;
    while start < len {
        let n = BLOCK.min(len - start);
        let acc = &mut acc[..n];
        acc.copy_from_slice(std::slice::from_raw_parts(srcs(0).add(start), n));
        for s in 1..n_ranks {
            let src = std::slice::from_raw_parts(srcs(s).add(start), n);
            for (a, x) in acc.iter_mut().zip(src) {
                *a += *x;
            }
        }
        if op == ReduceOp::Mean {
            for a in acc.iter_mut() {
                *a *= scale;
            }
        }
        std::ptr::copy_nonoverlapping(acc.as_ptr(), dst.add(start), n);
        start += n;
    }
}
