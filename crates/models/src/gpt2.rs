//! The GPT-2 family as `GPT2LMHeadModel` computes it: token and position embeddings,
//! pre-norm blocks of multi-head causal attention and a GELU (tanh) MLP over Conv1D layers
//! (weights `[in, out]`), a final layer norm, and the output projection tied to the token
//! embedding. One unit per block; `wte`, `wpe` and `ln_f` are units of their own, `wte`
//! applied twice (in and out), so the tied weight is one parameter in one unit.

use crate::config::Gpt2Config;
use crate::kv_cache::{KvCache, LayerCache};
use crate::layers::{conv1d, embed, heads, merge_heads, normal, project};
use crate::scoring::Scoring;
use candle_core::{Module, Result, Tensor};
use candle_nn::VarBuilder;
use wick_core::{ShardedContext, Wrapped};
use wick_nn::{
    causal_attention_packed, gelu, layer_norm, AttentionOptions, LayerNorm, Linear, Positions,
};

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

    /// The block's output, within each document where `documents` are given.
    fn forward(&self, x: &Tensor, documents: Option<&Positions>) -> Result<Tensor> {
        let qkv = self.c_attn.forward(&self.ln_1.forward(x)?)?;
        self.after_attention(x, &causal_attention_packed(&qkv, self.heads, documents)?)
    }

    /// The block's output for positions after the `cache`'s, which then holds theirs too.
    fn forward_cached(&self, x: &Tensor, cache: &mut LayerCache) -> Result<Tensor> {
        let qkv = self.c_attn.forward(&self.ln_1.forward(x)?)?;
        let width = qkv.dim(2)? / 3;
        let head_dim = width / self.heads;
        let part = |i: usize| heads(&qkv.narrow(2, i * width, width)?, self.heads, head_dim);
        let options = AttentionOptions::default();
        let attended = merge_heads(&cache.attend(&part(0)?, part(1)?, part(2)?, &options)?)?;
        self.after_attention(x, &attended)
    }

    /// The rest of the block after its attention gave `attended`.
    fn after_attention(&self, x: &Tensor, attended: &Tensor) -> Result<Tensor> {
        let x = (x + self.attn_proj.forward(attended)?)?;
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

    /// The final hidden states of `ids` (`[batch, time]`, u32): `[batch, time, n_embd]`;
    /// where `documents` are given, positions restart and attention keeps within each.
    fn hidden(&self, ids: &Tensor, documents: Option<&Positions>) -> Result<Tensor> {
        let positions = match documents {
            Some(d) => d.tensor().clone(),
            None => Tensor::arange(0u32, ids.dim(1)? as u32, ids.device())?.unsqueeze(0)?,
        };
        let tokens = self.wte.apply(ids, embed)?;
        let position = self.wpe.apply(&positions, embed)?;
        let mut x = tokens.broadcast_add(&position.to_dtype(tokens.dtype())?)?;
        for block in &self.blocks {
            let documents = documents.cloned();
            x = block.apply(&x, move |b, x| b.forward(x, documents.as_ref()))?;
        }
        self.ln_f.apply(&x, |n, x| n.forward(x))
    }

    /// The logits of every position of `ids` (`[batch, time]`, u32): `[batch, time, vocab]`,
    /// within `documents` where given.
    pub(crate) fn logits(&self, ids: &Tensor, documents: Option<&Positions>) -> Result<Tensor> {
        self.wte
            .apply(&self.hidden(ids, documents)?, |w, x| project(x, w))
    }

    /// The logits of the last position of `ids` (the positions after `cache`'s):
    /// `[batch, vocab]`; the cache then holds the new positions too. Inference only.
    pub(crate) fn next_logits(&self, ids: &Tensor, cache: &mut KvCache) -> Result<Tensor> {
        let (offset, t) = (cache.len() as u32, ids.dim(1)?);
        let positions = Tensor::arange(offset, offset + t as u32, ids.device())?.unsqueeze(0)?;
        let wte = self.wte.get()?;
        let tokens = embed(&wte, ids)?;
        let position = embed(&self.wpe.get()?, &positions)?;
        let mut x = tokens.broadcast_add(&position.to_dtype(tokens.dtype())?)?;
        for (block, slot) in self.blocks.iter().zip(cache.layers_mut()) {
            x = block.get()?.forward_cached(&x, slot)?;
        }
        cache.advance(t);
        let last = self.ln_f.get()?.forward(&x.narrow(1, t - 1, 1)?)?;
        project(&last, &wte)?.squeeze(1)
    }

    /// An empty cache for [`Gpt2::next_logits`].
    pub(crate) fn new_cache(&self) -> KvCache {
        KvCache::new(self.blocks.len())
    }

    /// `scoring` of `targets` (`[batch, time]`, u32) under the logits of `ids` (within
    /// `documents`, where given), the tied projection and the score in one op.
    pub(crate) fn score(
        &self,
        (ids, targets): (&Tensor, &Tensor),
        documents: Option<&Positions>,
        scoring: Scoring,
    ) -> Result<Tensor> {
        let (x, op) = scoring.head_op(&self.hidden(ids, documents)?, targets, None)?;
        scoring.finish(
            self.wte.apply(&x, move |w, x| {
                op.apply(&wick_nn::LayerWeight::Dense(w.clone()), x)
            })?,
            targets,
        )
    }
}
