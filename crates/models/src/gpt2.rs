//! The GPT-2 family as `GPT2LMHeadModel` computes it: token and position embeddings,
//! pre-norm blocks of multi-head causal attention and a GELU (tanh) MLP over Conv1D layers
//! (weights `[in, out]`), a final layer norm, and the output projection tied to the token
//! embedding. One unit per block; `wte`, `wpe` and `ln_f` are units of their own, `wte`
//! applied twice (in and out), so the tied weight is one parameter in one unit.

use crate::config::Gpt2Config;
use crate::layers::{conv1d, embed, loss_rows, normal, project};
use candle_core::{Module, Result, Tensor};
use candle_nn::VarBuilder;
use wick_core::{ShardedContext, Wrapped};
use wick_nn::{causal_attention_packed, gelu, layer_norm, linear_cross_entropy, LayerNorm, Linear};

/// One block, `transformer.h.{i}`.
#[derive(Clone)]
pub(crate) struct Block {
    ln_1: LayerNorm,
    c_attn: Linear,
    attn_proj: Linear,
    ln_2: LayerNorm,
    c_fc: Linear,
    mlp_proj: Linear,
    heads: usize,
}

impl Block {
    fn new(vb: VarBuilder, c: &Gpt2Config) -> Result<Self> {
        let (e, std) = (c.n_embd, c.initializer_range);
        // Hugging Face scales the init of the projections into the residual stream.
        let proj_std = std / (2.0 * c.n_layer as f64).sqrt();
        let eps = c.layer_norm_epsilon;
        Ok(Block {
            ln_1: layer_norm(e, eps, vb.pp("ln_1"))?,
            c_attn: conv1d(&vb.pp("attn.c_attn"), (e, 3 * e), std)?,
            attn_proj: conv1d(&vb.pp("attn.c_proj"), (e, e), proj_std)?,
            ln_2: layer_norm(e, eps, vb.pp("ln_2"))?,
            c_fc: conv1d(&vb.pp("mlp.c_fc"), (e, c.n_inner), std)?,
            mlp_proj: conv1d(&vb.pp("mlp.c_proj"), (c.n_inner, e), proj_std)?,
            heads: c.n_head,
        })
    }

    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let qkv = self.c_attn.forward(&self.ln_1.forward(x)?)?;
        let attended = causal_attention_packed(&qkv, self.heads)?;
        let x = (x + self.attn_proj.forward(&attended)?)?;
        let hidden = gelu(&self.c_fc.forward(&self.ln_2.forward(&x)?)?)?;
        x + self.mlp_proj.forward(&hidden)?
    }
}

/// The whole model's units.
#[derive(Clone)]
pub(crate) struct Gpt2 {
    wte: Wrapped<Tensor>,
    wpe: Wrapped<Tensor>,
    blocks: Vec<Wrapped<Block>>,
    ln_f: Wrapped<LayerNorm>,
}

impl Gpt2 {
    /// Creates the model's parameters through `ctx`, under Hugging Face's names.
    pub(crate) fn new(ctx: &ShardedContext, c: &Gpt2Config) -> Result<Self> {
        let (vocab, e, positions, std) =
            (c.vocab_size, c.n_embd, c.n_positions, c.initializer_range);
        let wte = ctx.wrap("transformer.wte", move |vb| {
            vb.get_with_hints((vocab, e), "weight", normal(std))
        })?;
        let wpe = ctx.wrap("transformer.wpe", move |vb| {
            vb.get_with_hints((positions, e), "weight", normal(std))
        })?;
        let blocks = (0..c.n_layer)
            .map(|i| {
                let c = c.clone();
                ctx.wrap(&format!("transformer.h.{i}"), move |vb| Block::new(vb, &c))
            })
            .collect::<Result<_>>()?;
        let eps = c.layer_norm_epsilon;
        let ln_f = ctx.wrap("transformer.ln_f", move |vb| layer_norm(e, eps, vb))?;
        Ok(Gpt2 {
            wte,
            wpe,
            blocks,
            ln_f,
        })
    }

    /// The final hidden states of `ids` (`[batch, time]`, u32): `[batch, time, n_embd]`.
    fn hidden(&self, ids: &Tensor) -> Result<Tensor> {
        let t = ids.dim(1)?;
        let positions = Tensor::arange(0u32, t as u32, ids.device())?.unsqueeze(0)?;
        let tokens = self.wte.apply(ids, embed)?;
        let position = self.wpe.apply(&positions, embed)?;
        let mut x = tokens.broadcast_add(&position.to_dtype(tokens.dtype())?)?;
        for block in &self.blocks {
            x = block.apply(&x, |b, x| b.forward(x))?;
        }
        self.ln_f.apply(&x, |n, x| n.forward(x))
    }

    /// The logits of every position of `ids` (`[batch, time]`, u32): `[batch, time, vocab]`.
    pub(crate) fn logits(&self, ids: &Tensor) -> Result<Tensor> {
        self.wte.apply(&self.hidden(ids)?, |w, x| project(x, w))
    }

    /// The mean cross-entropy of `targets` (`[batch, time]`, u32) under the logits of `ids`,
    /// the tied projection and the loss in one op ([`wick_nn::linear_cross_entropy`]).
    pub(crate) fn loss(&self, ids: &Tensor, targets: &Tensor) -> Result<Tensor> {
        let (x, targets) = loss_rows(&self.hidden(ids)?, targets)?;
        self.wte
            .apply(&x, move |w, x| linear_cross_entropy(x, w, &targets, None))
    }
}
