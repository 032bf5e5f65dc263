//! Matrix products over f32 slices on the GEMM Candle's CPU matmul uses (the `gemm` crate,
//! the same version, so one copy is built), for the fused kernels that multiply inside
//! one op: the attention's blocks and the output projection of the fused loss.
//!
//! The product splits its work over the output's blocks, never over the inner dimension,
//! so each element's sum runs in the same order whatever the number of threads.
//!
//! With the `mkl` feature (measuring only, off by default), a product on the rank's pool
//! whose operands have a unit stride calls Intel MKL's `sgemm` instead ([`mkl`]): MKL is
//! linked sequential, and the product is shared out over the pool as blocks of rows, one
//! call each; its sums are MKL's, whose order may depend on the block's size.

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
        #[cfg(feature = "mkl")]
        if self == Threads::Pool
            && mkl::sgemm(
                (m, n, k),
                (dst, dst_rs),
                accumulate,
                (a, a_rs, a_cs),
                (b, b_rs, b_cs),
                scale,
            )
        {
            return;
        }
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

/// The product on Intel MKL (with the `mkl` feature), linked by Candle's own `mkl` feature.
#[cfg(feature = "mkl")]
mod mkl {
    use super::Strided;
    use rayon::prelude::*;
    use std::ffi::{c_char, c_float, c_int};

    extern "C" {
        /// BLAS's column-major `C = alpha op(A) op(B) + beta C`.
        fn sgemm_(
            transa: *const c_char,
            transb: *const c_char,
            m: *const c_int,
            n: *const c_int,
            k: *const c_int,
            alpha: *const c_float,
            a: *const c_float,
            lda: *const c_int,
            b: *const c_float,
            ldb: *const c_int,
            beta: *const c_float,
            c: *mut c_float,
            ldc: *const c_int,
        );
    }

    /// How BLAS reads a `rows x cols` row-major operand of strides `(rs, cs)` as the
    /// column-major transpose it multiplies: `(b'N', ld)` when its rows are contiguous,
    /// `(b'T', ld)` when its columns are; `None` for other strides.
    fn as_transposed(rows: usize, cols: usize, rs: usize, cs: usize) -> Option<(u8, c_int)> {
        let ld = |stride: usize, at_least: usize| c_int::try_from(stride.max(at_least).max(1)).ok();
        match (cs, rs) {
            (1, _) if rs >= cols || rows == 1 => Some((b'N', ld(rs, cols)?)),
            (_, 1) if cs >= rows || cols == 1 => Some((b'T', ld(cs, rows)?)),
            _ => None,
        }
    }

    /// `dst (m x n) = scale a b (+ dst when accumulate)` on MKL, as
    /// [`super::Threads::matmul`] checked its slices; `false`, having done nothing, where
    /// the strides or sizes are not BLAS's.
    pub(super) fn sgemm(
        (m, n, k): (usize, usize, usize),
        (dst, dst_rs): (&mut [f32], usize),
        accumulate: bool,
        (a, a_rs, a_cs): Strided,
        (b, b_rs, b_cs): Strided,
        scale: f32,
    ) -> bool {
        // Row-major C = A B is column-major Cᵀ = Bᵀ Aᵀ: B's transpose is BLAS's first
        // operand, A's its second.
        let (Some((tb, ldb)), Some((ta, lda))) = (
            as_transposed(k, n, b_rs, b_cs),
            as_transposed(m, k, a_rs, a_cs),
        ) else {
            return false;
        };
        // One row is never stepped over, whatever its stride, but BLAS wants ldc >= n.
        let ldc = if m == 1 { dst_rs.max(n) } else { dst_rs }.max(1);
        // MKL is sequential (candle-core links `mkl-static-lp64-seq`): the pool's threads
        // are the only ones, each taking a block of `dst`'s rows in a call of its own.
        let rows = match m * n * k {
            work if work >= 1 << 18 => m.div_ceil(rayon::current_num_threads()),
            _ => m,
        };
        let (blocks, chunk) = (m.div_ceil(rows), rows * ldc);
        let dims = (c_int::try_from(n), c_int::try_from(m), c_int::try_from(k));
        let ((Ok(n), Ok(_), Ok(k)), Ok(ldc)) = (dims, c_int::try_from(ldc)) else {
            return false;
        };
        let beta: f32 = if accumulate { 1.0 } else { 0.0 };
        dst.par_chunks_mut(chunk)
            .take(blocks)
            .enumerate()
            .for_each(|(block, dst)| {
                let first = block * rows;
                let count = rows.min(m - first) as c_int;
                // SAFETY: the caller checked that every element the strides reach lies
                // inside its slice, and that `dst`'s rows (`ldc` apart, `n` wide) are
                // disjoint and inside `dst`: this block's `count` rows start at its chunk,
                // and its last row ends inside it (a full chunk holds `rows` rows of
                // `ldc >= n`; the last one reaches the end of `dst`). `a`'s row `first`
                // starts `first * a_rs` in. `as_transposed` passed only strides BLAS reads
                // the same elements through, with leading dimensions at least the rows
                // BLAS requires. MKL writes `dst` alone, and `beta = 0` never reads it.
                unsafe {
                    sgemm_(
                        (&tb as *const u8).cast(),
                        (&ta as *const u8).cast(),
                        &n,
                        &count,
                        &k,
                        &scale,
                        b.as_ptr(),
                        &ldb,
                        a[first * a_rs..].as_ptr(),
                        &lda,
                        &beta,
                        dst.as_mut_ptr(),
                        &ldc,
                    );
                }
            });
        true
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
    fn the_pools_product_equals_the_sequential_one_for_every_layout() {
        // Each operand row-major, transposed, and (one row or column) any stride: what
        // the pool runs (with `mkl`, MKL's sgemm) against one thread of `gemm`. The last
        // two are large enough to be shared out as blocks of rows (97 and 61 rows over the
        // pool's 3 threads: blocks of 33 and 21, the last one shorter).
        let shapes = [
            (37, 29, 41),
            (1, 33, 17),
            (19, 1, 23),
            (64, 48, 1),
            (97, 67, 61),
            (61, 97, 67),
        ];
        let pool = rayon::ThreadPoolBuilder::new().num_threads(3).build();
        pool.unwrap().install(|| {
            for (m, n, k) in shapes {
                each_layout(m, n, k);
            }
        });
    }

    /// [`the_pools_product_equals_the_sequential_one_for_every_layout`] at one shape.
    fn each_layout(m: usize, n: usize, k: usize) {
        let values = |len: usize, seed: f32| -> Vec<f32> {
            (0..len).map(|i| ((i as f32 + seed) * 0.37).sin()).collect()
        };
        let (a, b) = (values(m * k, 1.0), values(k * n, 2.0));
        for (a_rs, a_cs) in [(k, 1), (1, m)] {
            for (b_rs, b_cs) in [(n, 1), (1, k)] {
                for accumulate in [false, true] {
                    let dst_rs = n + 3;
                    let start = values(m * dst_rs, 3.0);
                    let (mut pool, mut one) = (start.clone(), start);
                    for (threads, dst) in [(Threads::Pool, &mut pool), (Threads::One, &mut one)] {
                        threads.matmul(
                            m,
                            n,
                            k,
                            (dst, dst_rs),
                            accumulate,
                            (&a, a_rs, a_cs),
                            (&b, b_rs, b_cs),
                            0.5,
                        );
                    }
                    for (p, o) in pool.iter().zip(&one) {
                        assert!(
                            (p - o).abs() <= 1e-5 * (1.0 + o.abs()),
                            "{m}x{n}x{k}, a ({a_rs}, {a_cs}), b ({b_rs}, {b_cs}): {p} against {o}"
                        );
                    }
                }
            }
        }
    }

    #[test]
    #[should_panic(expected = "destination rows overlap")]
    fn overlapping_destination_rows_are_refused() {
        let a = [1f32; 4];
        let mut dst = [0f32; 4];
        Threads::Pool.matmul(2, 2, 2, (&mut dst, 1), false, (&a, 2, 1), (&a, 2, 1), 1.0);
    }
}
