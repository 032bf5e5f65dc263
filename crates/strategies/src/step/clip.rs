//! Gradient clipping by global norm, across shards.

use candle_core::{DType, Tensor};
use wick_core::CollectiveExt;
use wick_core::{Collective, ReduceOp, Result};

/// The sum of the squares of every element of `grads`, this rank's part of the squared
/// global norm. It stays on the gradients' device; one scalar is read back.
pub(crate) fn sum_of_squares(grads: &[Tensor]) -> Result<f64> {
    Ok(match grads {
        [] => 0.0,
        _ => {
            let per_grad = grads
                .iter()
                .map(|g| g.sqr()?.sum_all()?.to_dtype(DType::F64))
                .collect::<candle_core::Result<Vec<_>>>()?;
            Tensor::stack(&per_grad, 0)?.sum_all()?.to_scalar::<f64>()?
        }
    })
}

/// Scales `grads` in place so that their global norm, `norm`, is at most `max_norm`, the
/// way torch's `clip_grad_norm_` does (coefficient `max_norm / (norm + 1e-6)`, never above
/// 1); nothing without a `max_norm`.
pub(crate) fn clip_to(grads: &mut [Tensor], norm: f64, max_norm: Option<f64>) -> Result<()> {
    let Some(max_norm) = max_norm else {
        return Ok(());
    };
    let coefficient = max_norm / (norm + 1e-6);
    if coefficient < 1.0 {
        for g in grads.iter_mut() {
            *g = g.affine(coefficient, 0.0)?;
        }
    }
    Ok(())
}

/// The global L2 norm of `grads` (what a step reports), which are then clipped to
/// `max_norm` ([`clip_to`]).
///
/// `shards_over`: the world whose ranks hold disjoint parts of the gradients (shards); the
/// squares are summed over it. `None` when every rank holds whole gradients.
pub(crate) fn clip_grad_norm(
    grads: &mut [Tensor],
    max_norm: Option<f64>,
    shards_over: Option<&dyn Collective>,
) -> Result<f64> {
    let mut squares = sum_of_squares(grads)?;
    if let Some(world) = shards_over {
        squares = world.all_reduce_scalar(squares as f32, ReduceOp::Sum)? as f64;
    }
    let norm = squares.sqrt();
    clip_to(grads, norm, max_norm)?;
    Ok(norm)
}
