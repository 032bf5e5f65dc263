//! How far the `gemm` crate's products speed up from one thread to two at the throughput
//! example's d512 GPT shapes (1024 rows; each linear layer's forward `x·Wᵀ` and the two
//! products of its backward, `g·W` and `gᵀ·x`), the question behind the d512 single-process
//! row on CPUs where it lags. One and two threads alternate for 7 rounds; each timing is
//! the best of 5 runs, and the median round is reported. `scripts/torch_mm_threads.py`
//! times the same products with `torch.mm`, for the peer's figures.
//!
//! Each layer's forward is also timed with `W` first copied transposed (the copy, on the
//! same threads, inside the timing), and a last line says whether its bits equal the plain
//! forward's: the workaround, not adopted, for the forwards whose strided weight `gemm`
//! packs on the calling thread alone (`gemm-common` 0.19's `do_prepack_lhs`).
//!
//! `cargo bench --bench gemm_threads`; `GEMM_SHAPES=1408:512,576:576 cargo bench --bench
//! gemm_threads` times these `in:out` layers instead.

use gemm::{gemm, Parallelism};
use rayon::prelude::*;
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

/// `x`'s transpose, row-major, written a block of its rows per task on the current pool.
fn transposed(x: &Matrix) -> Matrix {
    const ROWS_PER_TASK: usize = 16;
    let rows = x.values.len() / x.cols;
    let mut values = vec![0f32; x.values.len()];
    values
        .par_chunks_mut(ROWS_PER_TASK * rows)
        .enumerate()
        .for_each(|(task, block)| {
            let first = task * ROWS_PER_TASK;
            for (r, source) in x.values.chunks_exact(x.cols).enumerate() {
                let source = &source[first..first + block.len() / rows];
                for (c, &v) in source.iter().enumerate() {
                    block[c * rows + r] = v;
                }
            }
        });
    Matrix { values, cols: rows }
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

/// The linear layers to time, as `(in, out)`: `GEMM_SHAPES`'s, or the d512 GPT's
/// (attention's qkv and output, the MLP's two).
fn shapes() -> Vec<(usize, usize)> {
    let Ok(list) = std::env::var("GEMM_SHAPES") else {
        return vec![(D, 3 * D), (D, D), (D, 4 * D), (4 * D, D)];
    };
    let parse = |s: &str| s.trim().parse::<usize>().ok().filter(|&n| n > 0);
    list.split(',')
        .map(|shape| {
            shape
                .split_once(':')
                .and_then(|(i, o)| Some((parse(i)?, parse(o)?)))
                .unwrap_or_else(|| panic!("GEMM_SHAPES: `{shape}` is not in:out"))
        })
        .collect()
}

fn main() {
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(2)
        .build()
        .expect("a pool of two threads");
    let one_thread = rayon::ThreadPoolBuilder::new()
        .num_threads(1)
        .build()
        .expect("a pool of one thread");
    pool.install(|| {
        for (input, output) in shapes() {
            let x = Matrix::new(ROWS, input, 7919);
            let w = Matrix::new(output, input, 104_729);
            let g = Matrix::new(ROWS, output, 31);
            let mut y = Matrix::new(ROWS, output, 1);
            let mut y_copied = Matrix::new(ROWS, output, 1);
            let mut dx = Matrix::new(ROWS, input, 1);
            let mut dw = Matrix::new(output, input, 1);
            let gflop = 2.0 * (ROWS * input * output) as f64 / 1e9;
            let directions: [(&str, &mut dyn FnMut(usize)); 4] = [
                ("forward x·Wᵀ", &mut |t| {
                    product(&mut y, (&x, false), (&w, true), input, t)
                }),
                ("forward x·(Wᵀ copied)", &mut |t| {
                    let wt = match t {
                        1 => one_thread.install(|| transposed(&w)),
                        _ => transposed(&w),
                    };
                    product(&mut y_copied, (&x, false), (&wt, false), input, t)
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
            let same = y
                .values
                .iter()
                .zip(&y_copied.values)
                .all(|(a, b)| a.to_bits() == b.to_bits());
            println!("gemm in={input} out={output} forward with W copied: the same bits {same}");
        }
    });
}
