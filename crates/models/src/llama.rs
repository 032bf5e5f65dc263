//! The Llama family as `LlamaForCausalLM` computes it: token embedding, decoder layers of
//! RMSNorm, grouped-query attention with rotary positions and a SiLU-gated MLP, a final
//! RMSNorm and the output projection (or the embedding again, when tied). One unit per
//! decoder layer; the embedding, the final norm and the head are units of their own.

use crate::config::LlamaConfig;
use crate::layers::{embed, heads, linear, merge_heads, normal, project};
use candle_core::{Module, Result, Tensor};
use candle_nn::VarBuilder;
use std::sync::Arc;
use wick_core::{ShardedContext, Wrapped};
use wick_nn::{causal_attention, rms_norm, swiglu, Linear, RmsNorm, RotaryEmbedding};

/// One decoder layer, `model.layers.{i}`.
#[derive(Clone)]
pub(crate) struct DecoderLayer {
    input_layernorm: RmsNorm,
    q_proj: Linear,
    k_proj: Linear,
    v_proj: Linear,
    o_proj: Linear,
    post_attention_layernorm: RmsNorm,
    gate_proj: Linear,
    up_proj: Linear,
    down_proj: Linear,
    heads: usize,
    kv_heads: usize,
    head_dim: usize,
}

impl DecoderLayer {
    fn new(vb: VarBuilder, c: &LlamaConfig) -> Result<Self> {
        let (h, std) = (c.hidden_size, c.initializer_range);
        let (q, kv) = (
            c.num_attention_heads * c.head_dim,
            c.num_key_value_heads * c.head_dim,
        );
        let attn = vb.pp("self_attn");
        let mlp = vb.pp("mlp");
        let m = c.intermediate_size;
        Ok(DecoderLayer {
            input_layernorm: rms_norm(h, c.rms_norm_eps, vb.pp("input_layernorm"))?,
            q_proj: linear(&attn.pp("q_proj"), (h, q), c.attention_bias, std)?,
            k_proj: linear(&attn.pp("k_proj"), (h, kv), c.attention_bias, std)?,
            v_proj: linear(&attn.pp("v_proj"), (h, kv), c.attention_bias, std)?,
            o_proj: linear(&attn.pp("o_proj"), (q, h), c.attention_bias, std)?,
            post_attention_layernorm: rms_norm(
                h,
                c.rms_norm_eps,
                vb.pp("post_attention_layernorm"),
            )?,
            gate_proj: linear(&mlp.pp("gate_proj"), (h, m), c.mlp_bias, std)?,
            up_proj: linear(&mlp.pp("up_proj"), (h, m), c.mlp_bias, std)?,
            down_proj: linear(&mlp.pp("down_proj"), (m, h), c.mlp_bias, std)?,
            heads: c.num_attention_heads,
            kv_heads: c.num_key_value_heads,
            head_dim: c.head_dim,
        })
    }

    fn forward(&self, x: &Tensor, rope: &RotaryEmbedding) -> Result<Tensor> {
        let h = self.input_layernorm.forward(x)?;
        let q = rope.apply(&heads(
            &self.q_proj.forward(&h)?,
            self.heads,
            self.head_dim,
        )?)?;
        let k = rope.apply(&heads(
            &self.k_proj.forward(&h)?,
            self.kv_heads,
            self.head_dim,
        )?)?;
        let v = heads(&self.v_proj.forward(&h)?, self.kv_heads, self.head_dim)?;
        let attended = merge_heads(&causal_attention(&q, &k, &v)?)?;
        let x = (x + self.o_proj.forward(&attended)?)?;
        let h = self.post_attention_layernorm.forward(&x)?;
        // The SiLU-gated MLP: one matmul each, the gate fused with the product.
        let gated = swiglu(&self.gate_proj.forward(&h)?, &self.up_proj.forward(&h)?)?;
        x + self.down_proj.forward(&gated)?
    }
}

/// The whole model's units.
#[derive(Clone)]
pub(crate) struct Llama {
    embed_tokens: Wrapped<Tensor>,
    layers: Vec<Wrapped<DecoderLayer>>,
    norm: Wrapped<RmsNorm>,
    /// `None` when tied: the embedding projects back.
    lm_head: Option<Wrapped<Linear>>,
    rope: Arc<RotaryEmbedding>,
}

impl Llama {
    /// Creates the model's parameters through `ctx`, under Hugging Face's names.
    pub(crate) fn new(ctx: &ShardedContext, c: &LlamaConfig) -> Result<Self> {
        let (vocab, h, std) = (c.vocab_size, c.hidden_size, c.initializer_range);
        let embed_tokens = ctx.wrap("model.embed_tokens", move |vb| {
            vb.get_with_hints((vocab, h), "weight", normal(std))
        })?;
        let layers = (0..c.num_hidden_layers)
            .map(|i| {
                let c = c.clone();
                ctx.wrap(&format!("model.layers.{i}"), move |vb| {
                    DecoderLayer::new(vb, &c)
                })
            })
            .collect::<Result<_>>()?;
        let eps = c.rms_norm_eps;
        let norm = ctx.wrap("model.norm", move |vb| rms_norm(h, eps, vb))?;
        let lm_head = match c.tie_word_embeddings {
            true => None,
            false => Some(ctx.wrap("lm_head", move |vb| linear(&vb, (h, vocab), false, std))?),
        };
        let rope = RotaryEmbedding::new(
            c.head_dim,
            c.max_position_embeddings,
            c.rope_theta,
            ctx.device(),
        )?;
        Ok(Llama {
            embed_tokens,
            layers,
            norm,
            lm_head,
            rope: Arc::new(rope),
        })
    }

    /// The logits of every position of `ids` (`[batch, time]`, u32): `[batch, time, vocab]`.
    pub(crate) fn logits(&self, ids: &Tensor) -> Result<Tensor> {
        let mut x = self.embed_tokens.apply(ids, embed)?;
        for layer in &self.layers {
            let rope = self.rope.clone();
            x = layer.apply(&x, move |l, x| l.forward(x, &rope))?;
        }
        let x = self.norm.apply(&x, |n, x| n.forward(x))?;
        match &self.lm_head {
            Some(head) => head.apply(&x, |l, x| l.forward(x)),
            None => self.embed_tokens.apply(&x, |w, x| project(x, w)),
        }
    }
}
