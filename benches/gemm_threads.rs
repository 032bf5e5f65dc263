//! How far the `gemm` crate's products speed up from one thread to two at the throughput
//! example's d512 GPT shapes (1024 rows; each linear layer's forward `x·Wᵀ` and the two
//! products of its backward, `g·W` and `gᵀ·x`), the question behind the d512 single-process
//! row on CPUs where it lags. One and two threads alternate for 7 rounds; each timing is
//! the best of 5 runs, and the median round is reported. `scripts/torch_mm_threads.py`
//! times the same products with `torch.mm`, for the peer's figures.
//!
//! `cargo bench --bench gemm_threads`

use gemm::{gemm, Parallelism};
use std::time::Instant;

const ROWS: usize = 1024;
const D: usize = 512;
const ROUNDS: usize = 7;

/// A row-major operand: its values and its row length.
struct Matrix {
    values: Vec<f32>,
    cols: usize,
}

impl Matrix {
    /// Deterministic values in [0, 1).
    fn new(rows: usize, cols: usize, seed: usize) -> Matrix {
        let values = (0..rows * cols)
            .map(|i| ((i * seed) % 1000) as f32 / 1000.0)
            .collect();
        Matrix { values, cols }
    }
}

/// `dst (m x n) = a · b`, where `a` and `b` are row-major or (`transposed`) the transpose
/// of a row-major matrix, as Candle passes a transposed view's strides.
fn product(dst: &mut Matrix, a: (&Matrix, bool), b: (&Matrix, bool), k: usize, threads: usize) {
    let m = dst.values.len() / dst.cols;
    let n = dst.cols;
    let strides = |x: &Matrix, transposed: bool| {
        let (row, col) = (x.cols as isize, 1);
        if transposed {
            (col, row)
        } else {
            (row, col)
        }
    };
    let (a_rs, a_cs) = strides(a.0, a.1);
    let (b_rs, b_cs) = strides(b.0, b.1);
    let parallelism = match threads {
        1 => Parallelism::None,
        n => Parallelism::Rayon(n),
    };
    // SAFETY: each operand holds the rows and columns its strides reach (m x k, k x n and
    // m x n), and `dst` overlaps neither input.
    unsafe {
        gemm(
            m,
            n,
            k,
            dst.values.as_mut_ptr(),
            1,
            n as isize,
            false,
            a.0.values.as_ptr(),
            a_cs,
            a_rs,
            b.0.values.as_ptr(),
            b_cs,
            b_rs,
            0.0,
            1.0,
            false,
            false,
            false,
            parallelism,
        )
    }
}

/// The best of 5 runs of `f`, after one to warm up, in seconds.
fn best(mut f: impl FnMut()) -> f64 {
    f();
    (0..5)
        .map(|_| {
            let start = Instant::now();
            f();
            start.elapsed().as_secs_f64()
        })
        .fold(f64::MAX, f64::min)
}

fn median(mut xs: Vec<f64>) -> f64 {
    xs.sort_by(f64::total_cmp);
    xs[xs.len() / 2]
}

fn main() {
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(2)
        .build()
        .expect("a pool of two threads");
    pool.install(|| {
        // The GPT's linear layers as (in, out): attention's qkv and output, the MLP's two.
        for (input, output) in [(D, 3 * D), (D, D), (D, 4 * D), (4 * D, D)] {
            let x = Matrix::new(ROWS, input, 7919);
            let w = Matrix::new(output, input, 104_729);
            let g = Matrix::new(ROWS, output, 31);
            let mut y = Matrix::new(ROWS, output, 1);
            let mut dx = Matrix::new(ROWS, input, 1);
            let mut dw = Matrix::new(output, input, 1);
            let gflop = 2.0 * (ROWS * input * output) as f64 / 1e9;
            let directions: [(&str, &mut dyn FnMut(usize)); 3] = [
                ("forward x·Wᵀ", &mut |t| {
                    product(&mut y, (&x, false), (&w, true), input, t)
                }),
                ("backward g·W", &mut |t| {
                    product(&mut dx, (&g, false), (&w, false), output, t)
                }),
                ("backward gᵀ·x", &mut |t| {
                    product(&mut dw, (&g, true), (&x, false), ROWS, t)
                }),
            ];
            for (name, run) in directions {
                let (mut one, mut two) = (Vec::new(), Vec::new());
                for _ in 0..ROUNDS {
                    one.push(best(|| run(1)));
                    two.push(best(|| run(2)));
                }
                let (one, two) = (median(one), median(two));
                println!(
                    "gemm in={input} out={output} {name}: 1 thread {:.1} GFLOP/s, \
                     2 threads {:.1}, speedup {:.2}",
                    gflop / one,
                    gflop / two,
                    one / two
                );
            }
        }
    });
}
