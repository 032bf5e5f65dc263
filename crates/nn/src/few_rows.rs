//! `x Wᵀ` for a few rows of `x`, as generation makes them (one new token a step): `W`'s
//! rows shared out between the threads in blocks, each block one sequential GEMM, so the
//! weights stream through memory once and every thread streams. Candle's matmul splits so
//! little work poorly between threads (on two cores, one row ran slower on two threads
//! than on one).

use crate::cpu::{f32_inputs, fused};
use crate::fused_op::{CpuOp, CpuOut, Fused, GradsOf, Input};
use crate::gemm::Threads;
use candle_core::{CpuStorage, Result, Shape, Tensor};
use rayon::prelude::*;

/// At most this many rows take the few-rows kernel; more go to Candle's matmul.
pub const FEW_ROWS: usize = 4;

/// Rows of W a task multiplies: fixed, so that the blocks do not depend on the threads.
const BLOCK: usize = 32;

/// `x Wᵀ` for `x` of `[rows, in]` and `w` of `[out, in]`: `[rows, out]`. Up to [`FEW_ROWS`]
/// rows of f32 on the CPU over blocks of `w`'s rows in parallel (each output summed in one
/// order, whatever the threads); Candle's matmul otherwise. Differentiable either way.
pub fn matmul_wt(x: &Tensor, w: &Tensor) -> Result<Tensor> {
    let (rows, in_dim) = x.dims2()?;
    if rows > FEW_ROWS || !fused(&[x, w]) || w.dim(1)? != in_dim {
        return x.matmul(&w.t()?);
    }
    x.contiguous()?.apply_op2(&w.contiguous()?, Fused(FewRows))
}

/// [`matmul_wt`]'s kernel.
struct FewRows;

impl CpuOp<2> for FewRows {
    const NAME: &'static str = "wick-few-rows-matmul";

    fn cpu(&self, inputs: [Input<'_>; 2]) -> CpuOut {
        let [x, w] = f32_inputs(Self::NAME, inputs)?;
        let in_dim = inputs[1].1.dims()[1];
        let (rows, out) = (x.len() / in_dim, w.len() / in_dim);
        // Blocks of W's rows, one sequential GEMM a block, shared out between the threads;
        // small blocks keep both busy on a layer's few hundred rows. Every output's sum runs
        // in GEMM's order, whatever the number of threads.
        let block = BLOCK.min(out.max(1));
        let product = |y: &mut [f32], w: &[f32]| {
            let n = w.len() / in_dim;
            // y (rows x n) = x (rows x in) . w_blockᵀ (w read with its strides swapped).
            Threads::One.matmul(
                rows,
                n,
                in_dim,
                (y, n),
                false,
                (x, in_dim, 1),
                (w, 1, in_dim),
                1.0,
            );
        };
        let mut y = vec![0f32; rows * out];
        if rows == 1 {
            y.par_chunks_mut(block)
                .zip(w.par_chunks(block * in_dim))
                .for_each(|(y, w)| product(y, w));
        } else {
            let blocks: Vec<Vec<f32>> = w
                .par_chunks(block * in_dim)
                .map(|w| {
                    let mut y = vec![0f32; rows * (w.len() / in_dim)];
                    product(&mut y, w);
                    y
                })
                .collect();
            for (b, part) in blocks.iter().enumerate() {
                let n = part.len() / rows;
                for (r, part_row) in part.chunks_exact(n).enumerate() {
                    y[r * out + b * block..][..n].copy_from_slice(part_row);
                }
            }
        }
        Ok((CpuStorage::F32(y), Shape::from((rows, out))))
    }

    fn grads(&self, [x, w]: [&Tensor; 2], _res: &Tensor, grad: &Tensor) -> GradsOf<2> {
        Ok([Some(grad.matmul(w)?), Some(grad.t()?.matmul(x)?)])
    }
}
