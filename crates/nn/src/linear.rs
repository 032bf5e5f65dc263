//! `Linear`: candle-nn's linear layer as one op on the CPU in f32: the output starts as the
//! bias's rows and the GEMM adds the product into it (no zeroed output, no second pass to
//! add the bias), and its backward sums the bias gradient row by row (Candle's
//! broadcast-add backward reduces over the batch dimensions with a strided sum, the
//! slowest part of a small model's backward) and makes the weight's gradient `gᵀ x` in
//! the weight's own layout.

use crate::cpu::{f32_inputs, fused, new_in_chunks, rows_per_task, sum_in_order};
use crate::few_rows::{matmul_wt, FEW_ROWS};
use crate::fused_op::{CpuOp, CpuOut, Fused, GradsOf, Input};
use crate::gemm::Threads;
use crate::vector_math;
use candle_core::{CpuStorage, Module, Result, Shape, Tensor};
use candle_nn::VarBuilder;
use rayon::prelude::*;

/// y = x Wᵀ + b over the last dimension of `x`. Same parameters (`weight` `[out, in]`,
/// `bias` `[out]`) and initialisation as candle-nn's `linear`. Fused bias on the CPU in f32;
/// candle-nn's `Linear` elsewhere.
#[derive(Clone, Debug)]
pub struct Linear {
    inner: candle_nn::Linear,
}

/// A [`Linear`] from `in_dim` to `out_dim` features, with a bias, its parameters from `vb`
/// exactly as `candle_nn::linear` makes them.
pub fn linear(in_dim: usize, out_dim: usize, vb: VarBuilder) -> Result<Linear> {
    Ok(Linear {
        inner: candle_nn::linear(in_dim, out_dim, vb)?,
    })
}

impl From<candle_nn::Linear> for Linear {
    /// The same layer (weight and bias), with the fused bias when it has one.
    fn from(inner: candle_nn::Linear) -> Self {
        Linear { inner }
    }
}

impl Linear {
    /// The weight, `[out, in]`.
    pub fn weight(&self) -> &Tensor {
        self.inner.weight()
    }

    /// The bias, `[out]`, if the layer has one.
    pub fn bias(&self) -> Option<&Tensor> {
        self.inner.bias()
    }
}

impl Module for Linear {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let (w, b) = (self.inner.weight(), self.inner.bias());
        let (in_dim, out_dim) = (w.dim(1)?, w.dim(0)?);
        let rows = x.elem_count() / in_dim.max(1);
        let few = rows <= FEW_ROWS && fused(&[x, w]);
        let b = b.filter(|b| fused(&[x, w, b]));
        if b.is_none() && !few {
            return self.inner.forward(x);
        }
        let x2 = x.reshape((rows, in_dim))?;
        let y = match b {
            // A generated token's few rows as dot products ([`matmul_wt`]).
            Some(b) if few => matmul_wt(&x2, w)?.apply_op2(&b.contiguous()?, Fused(AddBias))?,
            None => matmul_wt(&x2, w)?,
            Some(b) => x2.contiguous()?.apply_op3(
                &w.contiguous()?,
                &b.contiguous()?,
                Fused(ProductPlusBias),
            )?,
        };
        let mut dims = x.dims().to_vec();
        if let Some(last) = dims.last_mut() {
            *last = out_dim;
        }
        y.reshape(dims)
    }
}

/// `x Wᵀ + b` for `x` `[rows, in]`, `W` `[out, in]`, `b` `[out]`: the bias's rows, then the
/// GEMM's product added into them on the rank's pool (each output's sum in GEMM's order,
/// whatever the number of threads).
struct ProductPlusBias;

impl CpuOp<3> for ProductPlusBias {
    const NAME: &'static str = "wick-linear";

    fn cpu(&self, inputs: [Input<'_>; 3]) -> CpuOut {
        let [x, w, b] = f32_inputs(Self::NAME, inputs)?;
        let (out, in_dim) = inputs[1].1.shape().dims2()?;
        let rows = x.len() / in_dim.max(1);
        if b.len() != out || x.len() != rows * in_dim {
            candle_core::bail!(
                "{}: {} inputs, a weight of {out}x{in_dim} and a bias of {}",
                Self::NAME,
                x.len(),
                b.len()
            )
        }
        let mut y = new_in_chunks(rows * out, rows_per_task(out) * out, |_, y| {
            for row in y.chunks_exact_mut(out) {
                row.copy_from_slice(b);
            }
        });
        Threads::Pool.matmul(
            rows,
            out,
            in_dim,
            (&mut y, out),
            true,
            (x, in_dim, 1),
            (w, 1, in_dim),
            1.0,
        );
        Ok((CpuStorage::F32(y), Shape::from((rows, out))))
    }

    fn grads(&self, [x, w, b]: [&Tensor; 3], _res: &Tensor, grad: &Tensor) -> GradsOf<3> {
        let g = grad.contiguous()?;
        let dx = g.matmul(w)?;
        let dw = g.t()?.matmul(x)?;
        let db = g.apply_op1_no_bwd(&Fused(ColumnSums))?.reshape(b.shape())?;
        Ok([Some(dx), Some(dw), Some(db)])
    }
}

/// `[rows, n]` + `[n]`, broadcast over the rows.
struct AddBias;

impl CpuOp<2> for AddBias {
    const NAME: &'static str = "wick-add-bias";

    fn cpu(&self, inputs: [Input<'_>; 2]) -> CpuOut {
        let [y, b] = f32_inputs(Self::NAME, inputs)?;
        let n = b.len();
        let task = rows_per_task(n) * n;
        let mut out = vec![0f32; y.len()];
        out.par_chunks_mut(task)
            .zip(y.par_chunks(task))
            .for_each(|(out, y)| {
                for (o_row, y_row) in out.chunks_exact_mut(n).zip(y.chunks_exact(n)) {
                    for ((o, y), b) in o_row.iter_mut().zip(y_row).zip(b) {
                        *o = y + b;
                    }
                }
            });
        Ok((CpuStorage::F32(out), inputs[0].1.shape().clone()))
    }

    fn grads(&self, [_, b]: [&Tensor; 2], _res: &Tensor, grad: &Tensor) -> GradsOf<2> {
        let db = grad.contiguous()?.apply_op1_no_bwd(&Fused(ColumnSums))?;
        Ok([Some(grad.clone()), Some(db.reshape(b.shape())?)])
    }
}

/// The sums of a `[rows, n]` matrix's columns, in a fixed order (the same bits on any
/// number of threads).
struct ColumnSums;

impl CpuOp<1> for ColumnSums {
    const NAME: &'static str = "wick-column-sums";

    fn cpu(&self, inputs: [Input<'_>; 1]) -> CpuOut {
        let [g] = f32_inputs(Self::NAME, inputs)?;
        let n = inputs[0].1.shape().dims().last().copied().unwrap_or(1);
        let task = rows_per_task(n) * n;
        let partials: Vec<Vec<f32>> = g
            .par_chunks(task)
            .map(|rows| {
                let mut sums = vec![0f32; n];
                for row in rows.chunks_exact(n) {
                    vector_math::add_into(&mut sums, row);
                }
                sums
            })
            .collect();
        Ok((CpuStorage::F32(sum_in_order(partials, n)), Shape::from(n)))
    }
}
