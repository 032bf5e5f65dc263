//! The GEMM peak that the rows' utilisation is measured against.

use candle_core::{Device, Tensor};
use std::time::Instant;

/// The best f32 rate of Candle's GEMM kernel on all cores, in GFLOP/s: square matrices of
/// 1024 and 2048, the best of 8 calls each. Each call is the `gemm` crate's, as Candle's
/// CPU matmul makes it (same parallelism, output overwritten, not read), on buffers made
/// once: the timing holds the kernel alone, not Candle's zeroed output buffer or a read of
/// the result.
pub(crate) fn peak_gflops() -> anyhow::Result<f64> {
    let threads = candle_core::utils::get_num_threads();
    let parallelism = match threads {
        1 => gemm::Parallelism::None,
        n => gemm::Parallelism::Rayon(n),
    };
    let mut best = 0f64;
    for n in [1024usize, 2048] {
        let a = Tensor::randn(0f32, 1.0, (n, n), &Device::Cpu)?
            .to_vec2::<f32>()?
            .concat();
        let b = Tensor::randn(0f32, 1.0, (n, n), &Device::Cpu)?
            .to_vec2::<f32>()?
            .concat();
        let mut c = vec![0f32; n * n];
        let s = n as isize;
        for _ in 0..8 {
            let start = Instant::now();
            // SAFETY: a, b and c each hold n x n f32 in row-major order (row stride n,
            // column stride 1), as the strides passed say; c is written, never read.
            unsafe {
                gemm::gemm(
                    n,
                    n,
                    n,
                    c.as_mut_ptr(),
                    1,
                    s,
                    false,
                    a.as_ptr(),
                    1,
                    s,
                    b.as_ptr(),
                    1,
                    s,
                    0f32,
                    1f32,
                    false,
                    false,
                    false,
                    parallelism,
                )
            };
            best = best.max(2.0 * (n * n * n) as f64 / start.elapsed().as_secs_f64() / 1e9);
        }
        std::hint::black_box(&c);
    }
    Ok(best)
}
