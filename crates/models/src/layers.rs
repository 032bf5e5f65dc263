//! Pieces both families build from: weights drawn as Hugging Face initializes a new model,
//! linear layers over them, and the embedding lookup and tied projection.

use candle_core::{Result, Tensor};
use candle_nn::{Init, VarBuilder};
use wick_nn::{LayerWeight, Linear};

/// Normal(0, `std`): Hugging Face's init of linear and embedding weights.
pub(crate) fn normal(std: f64) -> Init {
    Init::Randn {
        mean: 0.0,
        stdev: std,
    }
}

/// A linear layer with `weight` `[out, in]` (and `bias` `[out]` when `bias`).
pub(crate) fn linear(
    vb: &VarBuilder,
    dims: (usize, usize),
    bias: bool,
    std: f64,
) -> Result<Linear> {
    let (in_dim, out_dim) = dims;
    let weight = vb.get_with_hints((out_dim, in_dim), "weight", normal(std))?;
    let bias = match bias {
        true => Some(vb.get_with_hints(out_dim, "bias", Init::Const(0.0))?),
        false => None,
    };
    Ok(Linear::from(candle_nn::Linear::new(weight, bias)))
}

/// GPT-2's Conv1D: `weight` stored `[in, out]` (applied as x W + b), `bias` `[out]`.
pub(crate) fn conv1d(vb: &VarBuilder, dims: (usize, usize), std: f64) -> Result<Linear> {
    let (in_dim, out_dim) = dims;
    let weight = vb.get_with_hints((in_dim, out_dim), "weight", normal(std))?;
    let bias = vb.get_with_hints(out_dim, "bias", Init::Const(0.0))?;
    // A linear layer's weight is [out, in]: the transpose, a view (x Wᵀᵀ = x W).
    Ok(Linear::from(candle_nn::Linear::new(
        weight.t()?,
        Some(bias),
    )))
}

/// Rows `ids` (`[batch, time]`, u32) of the embedding `table` (`[vocab, width]`).
pub(crate) fn embed(table: &Tensor, ids: &Tensor) -> Result<Tensor> {
    embed_rows(&LayerWeight::Dense(table.clone()), ids)
}

/// [`embed`] from a table that may be held quantized: only the rows `ids` name decoded.
pub(crate) fn embed_rows(table: &LayerWeight, ids: &Tensor) -> Result<Tensor> {
    let (b, t) = ids.dims2()?;
    let (_, width) = table.out_in()?;
    table.rows(&ids.flatten_all()?)?.reshape((b, t, width))
}

/// `x` (`[batch, time, width]`) against every row of `table` (`[vocab, width]`): the
/// logits of an output projection tied to the embedding.
pub(crate) fn project(x: &Tensor, table: &Tensor) -> Result<Tensor> {
    let (b, t, c) = x.dims3()?;
    let vocab = table.dim(0)?;
    wick_nn::matmul_wt(&x.reshape((b * t, c))?, table)?.reshape((b, t, vocab))
}

/// `y` (`[batch, time, heads * head_dim]`) as `[batch, heads, time, head_dim]`.
pub(crate) fn heads(y: &Tensor, heads: usize, head_dim: usize) -> Result<Tensor> {
    let (b, t, _) = y.dims3()?;
    y.reshape((b, t, heads, head_dim))?.transpose(1, 2)
}

/// `a` (`[batch, heads, time, head_dim]`) back as `[batch, time, heads * head_dim]`.
pub(crate) fn merge_heads(a: &Tensor) -> Result<Tensor> {
    let (b, h, t, d) = a.dims4()?;
    a.transpose(1, 2)?.reshape((b, t, h * d))
}
