//! The decoder families as `transformers` computes them (`LlamaForCausalLM`,
//! `MistralForCausalLM`, `Qwen2ForCausalLM`, `Qwen3ForCausalLM`, `Gemma2ForCausalLM`):
//! token embedding, decoder layers of RMSNorm, grouped-query attention with rotary
//! positions and a gated MLP, a final RMSNorm and the output projection (or the embedding
//! again, when tied). What differs between the families is in [`DecoderConfig`]: biases,
//! Qwen3's per-head q/k norms, sliding windows, and Gemma 2's `1 + w` norms around each
//! sublayer, scaled embeddings and soft-capped scores and logits. One unit per decoder
//! layer; the embedding, the final norm and the head are units of their own.

use crate::config::{Activation, DecoderConfig};
use crate::kv_cache::{KvCache, LayerCache};
use crate::layers::{embed_rows, heads, linear, merge_heads, normal, project};
use crate::lora::{Adapters, LoraConfig, Projection};
use crate::quantized_base::FormatOf;
use crate::rope::RopeTables;
use crate::scoring::Scoring;
use candle_core::{Module, Result, Tensor};
use candle_nn::VarBuilder;
use std::sync::Arc;
use wick_core::{ShardedContext, Wrapped};
use wick_nn::{
    causal_attention_in_documents, gelu, rms_norm, rms_norm_unit_offset, swiglu, AttentionOptions,
    LayerWeight, Positions, RmsNorm, RotaryEmbedding,
};

/// Where a forward's tokens stand: after `Offset` positions a cache holds (0 for a whole
/// sequence), or each at its own position in its document (a packed batch).
#[derive(Clone, Copy)]
enum At<'a> {
    Offset(usize),
    Documents(&'a Positions),
}

/// The family's RMS norm of width `size` at `vb`: Gemma's scales by `1 + w`.
fn norm(vb: VarBuilder, size: usize, c: &DecoderConfig) -> Result<RmsNorm> {
    match c.is_gemma() {
        true => rms_norm_unit_offset(size, c.rms_norm_eps, vb),
        false => rms_norm(size, c.rms_norm_eps, vb),
    }
}

/// One decoder layer, `model.layers.{i}`.
#[derive(Clone)]
pub(crate) struct DecoderLayer {
    input_layernorm: RmsNorm,
    q_proj: Projection,
    k_proj: Projection,
    v_proj: Projection,
    o_proj: Projection,
    /// Qwen3's norms of each query and key head.
    qk_norm: Option<(RmsNorm, RmsNorm)>,
    /// Llama's norm before the MLP; Gemma's after the attention.
    post_attention_layernorm: RmsNorm,
    /// Gemma's norms before and after the MLP.
    feedforward_norms: Option<(RmsNorm, RmsNorm)>,
    gate_proj: Projection,
    up_proj: Projection,
    down_proj: Projection,
    activation: Activation,
    heads: usize,
    kv_heads: usize,
    head_dim: usize,
    attention: AttentionOptions,
}

impl DecoderLayer {
    fn new(
        vb: VarBuilder,
        c: &DecoderConfig,
        index: usize,
        (lora, format_of): (Option<&LoraConfig>, Option<&FormatOf>),
    ) -> Result<Self> {
        let (h, std, d) = (c.hidden_size, c.initializer_range, c.head_dim);
        let (q, kv) = (c.num_attention_heads * d, c.num_key_value_heads * d);
        let attn = vb.pp("self_attn");
        let mlp = vb.pp("mlp");
        let m = c.intermediate_size;
        // A linear layer, with its adapter under LoRA (created right after its own weights).
        let mut made = 0u64;
        let mut proj = |parent: &VarBuilder, module: &str, dims, bias| {
            let vb = parent.pp(module);
            let base = linear(&vb, dims, bias, std)?;
            let quantized = format_of.and_then(|f| f(&format!("{}.weight", vb.prefix())));
            made += 1;
            let salt = index as u64 * 8 + made;
            Projection::new(base, &vb, (module, dims), (lora, quantized), salt)
        };
        // Created in `DecoderConfig::parameter_shapes`' order.
        let input_layernorm = norm(vb.pp("input_layernorm"), h, c)?;
        let q_proj = proj(&attn, "q_proj", (h, q), c.qkv_bias)?;
        let k_proj = proj(&attn, "k_proj", (h, kv), c.qkv_bias)?;
        let v_proj = proj(&attn, "v_proj", (h, kv), c.qkv_bias)?;
        let o_proj = proj(&attn, "o_proj", (q, h), c.o_bias)?;
        let qk_norm = match c.qk_norm {
            true => Some((
                norm(attn.pp("q_norm"), d, c)?,
                norm(attn.pp("k_norm"), d, c)?,
            )),
            false => None,
        };
        let post_attention_layernorm = norm(vb.pp("post_attention_layernorm"), h, c)?;
        let pre_feedforward = match c.is_gemma() {
            true => Some(norm(vb.pp("pre_feedforward_layernorm"), h, c)?),
            false => None,
        };
        let gate_proj = proj(&mlp, "gate_proj", (h, m), c.mlp_bias)?;
        let up_proj = proj(&mlp, "up_proj", (h, m), c.mlp_bias)?;
        let down_proj = proj(&mlp, "down_proj", (m, h), c.mlp_bias)?;
        let feedforward_norms = match pre_feedforward {
            Some(pre) => Some((pre, norm(vb.pp("post_feedforward_layernorm"), h, c)?)),
            None => None,
        };
        Ok(DecoderLayer {
            input_layernorm,
            q_proj,
            k_proj,
            v_proj,
            o_proj,
            qk_norm,
            post_attention_layernorm,
            feedforward_norms,
            gate_proj,
            up_proj,
            down_proj,
            activation: c.activation,
            heads: c.num_attention_heads,
            kv_heads: c.num_key_value_heads,
            head_dim: d,
            attention: AttentionOptions {
                scale: Some(c.attention_scale),
                sliding_window: c.layer_windows[index],
                softcap: c.attn_logit_softcapping,
            },
        })
    }

    /// The heads of `projection` (`[b, t, n * head_dim]`, at the positions `at` says)
    /// as `[b, n, t, head_dim]`, each normed first where the family norms them, then
    /// rotated.
    fn rotated(
        &self,
        projection: &Tensor,
        n: usize,
        norm: Option<&RmsNorm>,
        (rope, at): (&RotaryEmbedding, At),
    ) -> Result<Tensor> {
        let split = match norm {
            None => heads(projection, n, self.head_dim)?,
            Some(norm) => {
                let (b, t, _) = projection.dims3()?;
                norm.forward(&projection.reshape((b, t, n, self.head_dim))?)?
                    .transpose(1, 2)?
            }
        };
        match at {
            At::Offset(offset) => rope.apply_at(&split, offset),
            At::Documents(positions) => rope.apply_positions(&split, positions),
        }
    }

    /// The layer's output, within each document where `documents` are given; `adapters`
    /// says whether LoRA's adapters take part and which dropout masks they draw.
    fn forward(
        &self,
        x: &Tensor,
        rope: &RotaryEmbedding,
        documents: Option<&Positions>,
        adapters: Adapters,
    ) -> Result<Tensor> {
        let attention = self.attention;
        let at = documents.map_or(At::Offset(0), At::Documents);
        self.forward_at(x, (rope, at), adapters, |q, k, v| {
            causal_attention_in_documents(q, &k, &v, &attention, documents)
        })
    }

    /// The layer's output for positions after the `cache`'s, which then holds theirs too.
    fn forward_cached(
        &self,
        x: &Tensor,
        rope: &RotaryEmbedding,
        cache: &mut LayerCache,
        offset: usize,
    ) -> Result<Tensor> {
        let attention = self.attention;
        self.forward_at(
            x,
            (rope, At::Offset(offset)),
            Adapters::On(None),
            |q, k, v| cache.attend(q, k, v, &attention),
        )
    }

    /// The layer's output for `x` at the positions `at` says, its queries and the new
    /// positions' keys and values given to `attend` (over themselves, or over a cache).
    fn forward_at(
        &self,
        x: &Tensor,
        at: (&RotaryEmbedding, At),
        adapters: Adapters,
        attend: impl FnOnce(&Tensor, Tensor, Tensor) -> Result<Tensor>,
    ) -> Result<Tensor> {
        let h = self.input_layernorm.forward(x)?;
        let norms = self.qk_norm.as_ref();
        let q = self.q_proj.forward(&h, adapters)?;
        let q = self.rotated(&q, self.heads, norms.map(|n| &n.0), at)?;
        let k = self.k_proj.forward(&h, adapters)?;
        let k = self.rotated(&k, self.kv_heads, norms.map(|n| &n.1), at)?;
        let v = self.v_proj.forward(&h, adapters)?;
        let v = heads(&v, self.kv_heads, self.head_dim)?;
        let attended = merge_heads(&attend(&q, k, v)?)?;
        let attended = self.o_proj.forward(&attended, adapters)?;
        match &self.feedforward_norms {
            // Gemma: a norm after each sublayer too.
            Some((pre, post)) => {
                let x = (x + self.post_attention_layernorm.forward(&attended)?)?;
                let mlp = self.mlp(&pre.forward(&x)?, adapters)?;
                x + post.forward(&mlp)?
            }
            None => {
                let x = (x + attended)?;
                let mlp = self.mlp(&self.post_attention_layernorm.forward(&x)?, adapters)?;
                x + mlp
            }
        }
    }

    /// The gated MLP: one matmul each, the gate's activation fused with the product where
    /// it is SiLU.
    fn mlp(&self, h: &Tensor, adapters: Adapters) -> Result<Tensor> {
        let gate = self.gate_proj.forward(h, adapters)?;
        let up = self.up_proj.forward(h, adapters)?;
        let gated = match self.activation {
            Activation::Silu => swiglu(&gate, &up)?,
            Activation::GeluTanh => (gelu(&gate)? * up)?,
        };
        self.down_proj.forward(&gated, adapters)
    }
}

/// The whole model's units.
#[derive(Clone)]
pub(crate) struct Decoder {
    /// The token embedding, held quantized where QLoRA quantizes the embeddings too.
    embed_tokens: Wrapped<LayerWeight>,
    layers: Vec<Wrapped<DecoderLayer>>,
    norm: Wrapped<RmsNorm>,
    /// The output head's weight; `None` when tied: the embedding projects back.
    lm_head: Option<Wrapped<LayerWeight>>,
    rope: Arc<RopeTables>,
    /// Gemma's embedding scale, `sqrt(hidden_size)` rounded to f32 as torch rounds it.
    embed_scale: Option<f64>,
    final_logit_softcapping: Option<f64>,
}

impl Decoder {
    /// Creates the model's parameters through `ctx`, under Hugging Face's names (and
    /// PEFT's for `lora`'s adapters), the base's linear weights born in the forms
    /// `format_of` gives (QLoRA).
    pub(crate) fn new(
        ctx: &ShardedContext,
        c: &DecoderConfig,
        lora: Option<&LoraConfig>,
        format_of: Option<FormatOf>,
    ) -> Result<Self> {
        let (vocab, h, std) = (c.vocab_size, c.hidden_size, c.initializer_range);
        // A table `[vocab, hidden]`, born in the form `format_of` gives its name, if any.
        let table = |unit: &str| {
            let format = (format_of.as_ref()).and_then(|f| f(&format!("{unit}.weight")));
            move |vb: VarBuilder| {
                let param = vb.get_with_hints((vocab, h), "weight", normal(std))?;
                LayerWeight::from_param(param, (vocab, h), format)
            }
        };
        let embed_tokens = ctx.wrap("model.embed_tokens", table("model.embed_tokens"))?;
        let layers = (0..c.num_hidden_layers)
            .map(|i| {
                let (c, lora, format_of) = (c.clone(), lora.cloned(), format_of.clone());
                ctx.wrap(&format!("model.layers.{i}"), move |vb| {
                    DecoderLayer::new(vb, &c, i, (lora.as_ref(), format_of.as_ref()))
                })
            })
            .collect::<Result<_>>()?;
        let final_norm = c.clone();
        let norm = ctx.wrap("model.norm", move |vb| norm(vb, h, &final_norm))?;
        let lm_head = match c.tie_word_embeddings {
            true => None,
            false => Some(ctx.wrap("lm_head", table("lm_head"))?),
        };
        Ok(Decoder {
            embed_tokens,
            layers,
            norm,
            lm_head,
            rope: Arc::new(RopeTables::new(c, ctx.device())),
            embed_scale: c.is_gemma().then(|| (h as f64).sqrt() as f32 as f64),
            final_logit_softcapping: c.final_logit_softcapping,
        })
    }

    /// The final hidden states of `ids` (`[batch, time]`, u32): `[batch, time, hidden]`,
    /// each document kept to itself where `documents` are given; `adapters` says whether
    /// LoRA's adapters take part and which dropout masks they draw.
    fn hidden(
        &self,
        ids: &Tensor,
        documents: Option<&Positions>,
        adapters: Adapters,
    ) -> Result<Tensor> {
        let rope = self.rope.for_len(ids.dim(1)?)?;
        let mut x = self.scaled(self.embed_tokens.apply(ids, embed_rows)?)?;
        for layer in &self.layers {
            let (rope, documents) = (rope.clone(), documents.cloned());
            x = layer.apply(&x, move |l, x| {
                l.forward(x, &rope, documents.as_ref(), adapters)
            })?;
        }
        self.norm.apply(&x, |n, x| n.forward(x))
    }

    /// `f(weight, x)` inside the unit that holds the output projection's weight
    /// (`[vocab, hidden]`): `lm_head`'s, or the embedding's when tied.
    fn head<F>(&self, x: &Tensor, f: F) -> Result<Tensor>
    where
        F: Fn(&LayerWeight, &Tensor) -> Result<Tensor> + Send + Sync + 'static,
    {
        self.lm_head
            .as_ref()
            .unwrap_or(&self.embed_tokens)
            .apply(x, f)
    }

    /// The logits of every position of `ids` (`[batch, time]`, u32): `[batch, time, vocab]`,
    /// within `documents` where given.
    pub(crate) fn logits(&self, ids: &Tensor, documents: Option<&Positions>) -> Result<Tensor> {
        let x = self.hidden(ids, documents, Adapters::On(None))?;
        self.capped(self.head(&x, |w, x| project(x, &w.decoded()?))?)
    }

    /// The logits of the last position of `ids` (`[batch, time]`, u32, the positions after
    /// `cache`'s): `[batch, vocab]`. The cache then holds the new positions too. Inference
    /// only: the blocks run outside the units, over this step's parameters.
    pub(crate) fn next_logits(&self, ids: &Tensor, cache: &mut KvCache) -> Result<Tensor> {
        let (offset, t) = (cache.len(), ids.dim(1)?);
        let rope = self.rope.for_len(offset + t)?;
        let mut x = self.scaled(embed_rows(&self.embed_tokens.get()?, ids)?)?;
        for (layer, slot) in self.layers.iter().zip(cache.layers_mut()) {
            x = layer.get()?.forward_cached(&x, &rope, slot, offset)?;
        }
        cache.advance(t);
        let last = self.norm.get()?.forward(&x.narrow(1, t - 1, 1)?)?;
        let weight = self.lm_head.as_ref().unwrap_or(&self.embed_tokens).get()?;
        self.capped(project(&last, &weight.decoded()?)?)?.squeeze(1)
    }

    /// The token embeddings `x`, scaled where the family scales them (Gemma).
    fn scaled(&self, x: Tensor) -> Result<Tensor> {
        match self.embed_scale {
            Some(scale) => x.affine(scale, 0.0),
            None => Ok(x),
        }
    }

    /// An empty cache for [`Decoder::next_logits`].
    pub(crate) fn new_cache(&self) -> KvCache {
        KvCache::new(self.layers.len())
    }

    /// `logits` soft-capped where the family caps them.
    fn capped(&self, logits: Tensor) -> Result<Tensor> {
        match self.final_logit_softcapping {
            // cap tanh(logits / cap), dividing as torch does.
            Some(cap) => {
                let cap = Tensor::new(cap as f32, logits.device())?.to_dtype(logits.dtype())?;
                logits.broadcast_div(&cap)?.tanh()?.broadcast_mul(&cap)
            }
            None => Ok(logits),
        }
    }

    /// `scoring` of `targets` (`[batch, time]`, u32; [`wick_nn::IGNORE_INDEX`] not
    /// counted) under the logits of `ids` (within `documents`, where given): the output
    /// projection and the score in one op, so on the CPU the logits never exist whole.
    pub(crate) fn score(
        &self,
        (ids, targets): (&Tensor, &Tensor),
        documents: Option<&Positions>,
        adapters: Adapters,
        scoring: Scoring,
    ) -> Result<Tensor> {
        let hidden = self.hidden(ids, documents, adapters)?;
        let (x, op) = scoring.head_op(&hidden, targets, self.final_logit_softcapping)?;
        scoring.finish(self.head(&x, move |w, x| op.apply(w, x))?, targets)
    }
}
