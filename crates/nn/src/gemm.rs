//! Matrix products over f32 slices on the GEMM Candle's CPU matmul uses (the `gemm` crate,
//! the same version, so one copy is built), for the fused kernels that multiply inside
//! one op: the attention's blocks and the output projection of the fused loss.
//!
//! The product splits its work over the output's blocks, never over the inner dimension,
//! so each element's sum runs in the same order whatever the number of threads.

/// A matrix read through its strides: `(slice, row stride, column stride)`; a transpose is
/// the same slice with the strides swapped.
pub(crate) type Strided<'a> = (&'a [f32], usize, usize);

/// Where a product's blocks run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Threads {
    /// One sequential call, for work already shared out over threads (a block of heads).
    One,
    /// Shared out over the calling thread's rayon pool (a rank's thread budget, as
    /// Candle's own matmul runs).
    Pool,
}

impl Threads {
    /// `dst (m x n) = scale a b (+ dst when accumulate)`, `a` `m x k` and `b` `k x n` read
    /// through their strides, `dst` written as `(slice, row stride)` with unit columns, its
    /// blocks run as `self` says.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn matmul(
        self,
        m: usize,
        n: usize,
        k: usize,
        (dst, dst_rs): (&mut [f32], usize),
        accumulate: bool,
        (a, a_rs, a_cs): Strided,
        (b, b_rs, b_cs): Strided,
        scale: f32,
    ) {
        let parallelism = match (self, rayon::current_num_threads()) {
            (Threads::One, _) | (Threads::Pool, 0 | 1) => gemm::Parallelism::None,
            (Threads::Pool, pool) => gemm::Parallelism::Rayon(pool),
        };
        if m == 0 || n == 0 {
            return;
        }
        let last = |rs: usize, cs: usize, rows: usize, cols: usize| {
            (rows.max(1) - 1) * rs + (cols.max(1) - 1) * cs
        };
        assert!(
            last(dst_rs, 1, m, n) < dst.len(),
            "matmul: destination too short"
        );
        // Rows that overlap would be written by two of the product's blocks at once, a
        // data race under the pool and a wrong sum anyway.
        assert!(
            m == 1 || dst_rs >= n,
            "matmul: destination rows overlap (row stride {dst_rs} < {n} columns)"
        );
        assert!(
            k == 0 || (last(a_rs, a_cs, m, k) < a.len() && last(b_rs, b_cs, k, n) < b.len()),
            "matmul: an operand too short for its strides"
        );
        // SAFETY: every index the product reads or writes was checked against its slice above;
        // `dst` is exclusively borrowed, overlaps neither operand, and its rows are disjoint.
        unsafe {
            gemm::gemm(
                m,
                n,
                k,
                dst.as_mut_ptr(),
                1,
                dst_rs as isize,
                accumulate,
                a.as_ptr(),
                a_cs as isize,
                a_rs as isize,
                b.as_ptr(),
                b_cs as isize,
                b_rs as isize,
                1.0,
                scale,
                false,
                false,
                false,
                parallelism,
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_product_writes_rows_at_their_stride() {
        let a = [1f32, 2., 3., 4.];
        let b = [1f32, 0., 0., 1.];
        let mut dst = [0f32; 6];
        Threads::One.matmul(2, 2, 2, (&mut dst, 3), false, (&a, 2, 1), (&b, 2, 1), 1.0);
        assert_eq!(dst, [1., 2., 0., 3., 4., 0.]);
    }

    #[test]
    #[should_panic(expected = "destination rows overlap")]
    fn overlapping_destination_rows_are_refused() {
        let a = [1f32; 4];
        let mut dst = [0f32; 4];
        Threads::Pool.matmul(2, 2, 2, (&mut dst, 1), false, (&a, 2, 1), (&a, 2, 1), 1.0);
    }
}
