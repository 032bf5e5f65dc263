//! Candle's CPU matmul, which the backward of wick-nn's layers runs on, against a product in
//! f64: each operand contiguous or transposed, one product or a batch, either side
//! broadcast over the batch (stride 0), inside a pool of 3 threads. With the `mkl` feature
//! it is MKL's, linked sequential and shared out over the pool as blocks of rows (the
//! vendored candle-core's `MklProduct`); without, the `gemm` crate's.

use candle_core::{Device, Result, Tensor};

/// `len` values in [-1, 1] that differ from one index to the next.
fn values(len: usize, seed: f32) -> Vec<f32> {
    (0..len).map(|i| ((i as f32 + seed) * 0.37).sin()).collect()
}

/// A `(batch, rows, cols)` tensor of `values`, contiguous or as the transpose of a
/// contiguous `(batch, cols, rows)` one.
fn operand(batch: usize, rows: usize, cols: usize, seed: f32, transposed: bool) -> Result<Tensor> {
    let data = values(batch * rows * cols, seed);
    match transposed {
        false => Tensor::from_vec(data, (batch, rows, cols), &Device::Cpu),
        true => Tensor::from_vec(data, (batch, cols, rows), &Device::Cpu)?.transpose(1, 2),
    }
}

/// Checks `lhs · rhs` against the f64 product, each element within the forward error
/// bound of an f32 dot product of `k` terms (`2k` units of rounding over the sum of the
/// terms' magnitudes).
fn check(lhs: &Tensor, rhs: &Tensor, what: &str) -> Result<()> {
    let (batch, m, k) = lhs.dims3()?;
    let n = rhs.dim(2)?;
    let got = lhs.matmul(rhs)?.to_vec3::<f32>()?;
    let (l, r) = (lhs.to_vec3::<f32>()?, rhs.to_vec3::<f32>()?);
    for s in 0..batch {
        for i in 0..m {
            for j in 0..n {
                let terms = (0..k).map(|p| f64::from(l[s][i][p]) * f64::from(r[s][p][j]));
                let (sum, size) =
                    terms.fold((0.0, 0.0), |(sum, size), t| (sum + t, size + t.abs()));
                let bound = 2.0 * k as f64 * f64::from(f32::EPSILON) * size;
                let err = (f64::from(got[s][i][j]) - sum).abs();
                assert!(
                    err <= bound,
                    "{what}: [{s}][{i}][{j}] is {} against {sum} (bound {bound})",
                    got[s][i][j]
                );
            }
        }
    }
    Ok(())
}

#[test]
fn candles_matmul_equals_the_f64_product_for_every_layout() -> Result<()> {
    // 97 x 67 x 61 and 70 x 65 x 64 are large enough to be shared out over the pool as
    // blocks of rows (a last block shorter than the others); 5 x 7 x 3 is not.
    let shapes = [(1, 97, 67, 61), (3, 70, 65, 64), (2, 5, 7, 3)];
    let pool = rayon::ThreadPoolBuilder::new().num_threads(3).build();
    pool.expect("a pool of 3 threads").install(|| {
        for (batch, m, n, k) in shapes {
            for lhs_t in [false, true] {
                for rhs_t in [false, true] {
                    let lhs = operand(batch, m, k, 1.0, lhs_t)?;
                    let what = format!("{batch} x {m}x{n}x{k}, lhs_t {lhs_t}, rhs_t {rhs_t}");
                    let batched = operand(batch, k, n, 2.0, rhs_t)?;
                    check(&lhs, &batched, &format!("{what}, rhs batched"))?;
                    let shared = operand(1, k, n, 3.0, rhs_t)?.broadcast_as((batch, k, n))?;
                    check(&lhs, &shared, &format!("{what}, rhs broadcast"))?;
                    let lhs_shared = operand(1, m, k, 4.0, lhs_t)?.broadcast_as((batch, m, k))?;
                    check(&lhs_shared, &batched, &format!("{what}, lhs broadcast"))?;
                }
            }
        }
        Ok(())
    })
}
