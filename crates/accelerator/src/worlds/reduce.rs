//! The arithmetic of reductions over several ranks' buffers.

use candle_core::DType;
use half::{bf16, f16};
use wick_core::ReduceOp;

const BLOCK: usize = 1024;

/// An element type reductions accumulate in f32.
trait Elem: Copy {
    fn to_f32(self) -> f32;
    fn from_f32(v: f32) -> Self;
}

impl Elem for f32 {
    fn to_f32(self) -> f32 {
        self
    }
    fn from_f32(v: f32) -> Self {
        v
    }
}

impl Elem for bf16 {
    fn to_f32(self) -> f32 {
        bf16::to_f32(self)
    }
    fn from_f32(v: f32) -> Self {
        bf16::from_f32(v)
    }
}

impl Elem for f16 {
    fn to_f32(self) -> f32 {
        f16::to_f32(self)
    }
    fn from_f32(v: f32) -> Self {
        f16::from_f32(v)
    }
}

/// Writes `dst[i] = src_0[i] + src_1[i] + ...` (in rank order, so every run and every rank
/// computes the same bits), scaled by 1/n for a mean; 16-bit types accumulate in f32 and
/// round once. `srcs(s)` is rank s's input; a source may be `dst` itself (each element is
/// read before it is written).
///
/// # Safety
/// Every source pointer must be valid for `len` element reads and `dst` for `len` element
/// writes of `dtype`, with no other thread writing these ranges during the call.
///
/// # Panics
/// If `dtype` is not f32, bf16 or f16 (callers refuse others first, `check_reducible`).
pub(crate) unsafe fn reduce_ranks(
    dtype: DType,
    dst: *mut u8,
    len: usize,
    n_ranks: usize,
    srcs: impl Fn(usize) -> *const u8,
    op: ReduceOp,
) {
    match dtype {
        DType::BF16 => reduce_typed::<bf16>(dst.cast(), len, n_ranks, |s| srcs(s).cast(), op),
        DType::F16 => reduce_typed::<f16>(dst.cast(), len, n_ranks, |s| srcs(s).cast(), op),
        DType::F32 => reduce_typed::<f32>(dst.cast(), len, n_ranks, |s| srcs(s).cast(), op),
        other => panic!("a reduction over {other:?}: reductions take f32, bf16 or f16"),
    }
}

unsafe fn reduce_typed<T: Elem>(
    dst: *mut T,
    len: usize,
    n_ranks: usize,
    srcs: impl Fn(usize) -> *const T,
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
        for (a, x) in acc
            .iter_mut()
            .zip(std::slice::from_raw_parts(srcs(0).add(start), n))
        {
            *a = x.to_f32();
        }
        for s in 1..n_ranks {
            let src = std::slice::from_raw_parts(srcs(s).add(start), n);
            for (a, x) in acc.iter_mut().zip(src) {
                *a += x.to_f32();
            }
        }
        if op == ReduceOp::Mean {
            for a in acc.iter_mut() {
                *a *= scale;
            }
        }
        let out = std::slice::from_raw_parts_mut(dst.add(start), n);
        for (o, a) in out.iter_mut().zip(acc.iter()) {
            *o = T::from_f32(*a);
        }
        start += n;
    }
}
