//! The main job's model: a small GPT-style character language model, built from candle-nn
//! and wick-nn layers (fused layer norm, attention, GELU and cross-entropy) inside
//! `configure_sharded_model`.

use candle_core::{Result, Tensor};
use candle_nn::{Embedding, Module, VarBuilder};
use std::sync::Arc;
use wick_core::{
    Algorithm, LrSchedule, OptimizerConfig, ShardedContext, TokenBatch, TrainModule, WeightSource,
    Wrapped,
};
use wick_nn::{CausalSelfAttention, LayerNorm, Linear};

/// Layer norms' epsilon.
const EPS: f64 = 1e-5;

/// Sizes of the model.
#[derive(Debug, Clone, Copy)]
pub struct GptConfig {
    /// Distinct characters.
    pub vocab: usize,
    /// Context length in characters.
    pub block: usize,
    /// Embedding width.
    pub d_model: usize,
    /// Transformer blocks.
    pub n_layer: usize,
    /// Attention heads per block.
    pub n_head: usize,
}

#[derive(Clone)]
struct Block {
    ln1: LayerNorm,
    attn: CausalSelfAttention,
    ln2: LayerNorm,
    fc: Linear,
    fc_out: Linear,
}

impl Block {
    fn new(c: &GptConfig, vb: VarBuilder) -> Result<Self> {
        let d = c.d_model;
        Ok(Block {
            ln1: wick_nn::layer_norm(d, EPS, vb.pp("ln1"))?,
            attn: CausalSelfAttention::new(d, c.n_head, vb.pp("attn"))?,
            ln2: wick_nn::layer_norm(d, EPS, vb.pp("ln2"))?,
            fc: wick_nn::linear(d, 4 * d, vb.pp("mlp.fc"))?,
            fc_out: wick_nn::linear(4 * d, d, vb.pp("mlp.out"))?,
        })
    }

    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let x = (x + self.attn.forward(&self.ln1.forward(x)?)?)?;
        let h = wick_nn::gelu(&self.fc.forward(&self.ln2.forward(&x)?)?)?;
        x + self.fc_out.forward(&h)?
    }
}

/// Token and position embeddings.
#[derive(Clone)]
struct Embed {
    tok: Embedding,
    pos: Tensor,
}

impl Embed {
    fn new(c: &GptConfig, vb: VarBuilder) -> Result<Self> {
        let normal = candle_nn::Init::Randn {
            mean: 0.0,
            stdev: 0.02,
        };
        Ok(Embed {
            tok: Embedding::new(
                vb.get_with_hints((c.vocab, c.d_model), "tok", normal)?,
                c.d_model,
            ),
            pos: vb.get_with_hints((c.block, c.d_model), "pos", normal)?,
        })
    }
}

/// Final norm and the projection to logits.
#[derive(Clone)]
struct Head {
    ln_f: LayerNorm,
    out: Linear,
}

impl Head {
    fn new(c: &GptConfig, vb: VarBuilder) -> Result<Self> {
        Ok(Head {
            ln_f: wick_nn::layer_norm(c.d_model, EPS, vb.pp("ln_f"))?,
            out: wick_nn::linear(c.d_model, c.vocab, vb.pp("out"))?,
        })
    }
}

/// The model's units: each is gathered on its own under sharding strategies.
#[derive(Clone)]
struct Layers {
    embed: Wrapped<Embed>,
    blocks: Vec<Wrapped<Block>>,
    head: Wrapped<Head>,
}

/// A GPT-style character model; parameters exist only after `configure_sharded_model`.
#[derive(Clone)]
pub struct CharGpt {
    config: GptConfig,
    lr: f64,
    schedule: LrSchedule,
    /// Where the parameters come from instead of their initializers (a checkpoint).
    weights: Option<Arc<dyn WeightSource>>,
    layers: Option<Layers>,
}

impl CharGpt {
    /// A model of `config` trained with AdamW at `lr` (constant); no parameters yet.
    pub fn new(config: GptConfig, lr: f64) -> Self {
        CharGpt {
            config,
            lr,
            schedule: LrSchedule::constant(),
            weights: None,
            layers: None,
        }
    }

    /// The same model trained along `schedule` (a factor of `lr` per step).
    pub fn with_schedule(mut self, schedule: LrSchedule) -> Self {
        self.schedule = schedule;
        self
    }

    /// The same model with its parameters read from `weights` (a checkpoint of any world
    /// size) instead of initialized.
    pub fn with_weights(mut self, weights: Arc<dyn WeightSource>) -> Self {
        self.weights = Some(weights);
        self
    }

    /// Logits `[batch, time, vocab]` for character ids `[batch, time]`.
    pub fn forward(&self, ids: &Tensor) -> Result<Tensor> {
        let layers = self.layers.as_ref().ok_or_else(|| {
            candle_core::Error::Msg("model used before configure_sharded_model".into())
        })?;
        let (_, t) = ids.dims2()?;
        // Each unit runs through `apply`: under fsdp full_shard it is gathered, run and
        // freed, then gathered again and recomputed in backward.
        let mut x = layers.embed.apply(ids, move |e, ids| {
            e.tok.forward(ids)?.broadcast_add(&e.pos.narrow(0, 0, t)?)
        })?;
        for block in &layers.blocks {
            x = block.apply(&x, |b, x| b.forward(x))?;
        }
        layers
            .head
            .apply(&x, |h, x| h.out.forward(&h.ln_f.forward(x)?))
    }

    fn loss(&self, TokenBatch { ids, targets, .. }: &TokenBatch) -> Result<Tensor> {
        let logits = self.forward(ids)?;
        let (b, t, v) = logits.dims3()?;
        wick_nn::cross_entropy(&logits.reshape((b * t, v))?, &targets.reshape(b * t)?)
    }
}

impl TrainModule for CharGpt {
    type Batch = TokenBatch;

    fn configure_sharded_model(&mut self, ctx: &ShardedContext) -> Result<()> {
        if let Some(w) = &self.weights {
            ctx.load_weights(w.clone());
        }
        let c = self.config;
        self.layers = Some(Layers {
            embed: ctx.wrap("embed", move |vb| Embed::new(&c, vb))?,
            blocks: (0..c.n_layer)
                .map(|i| ctx.wrap(&format!("blocks.{i}"), move |vb| Block::new(&c, vb)))
                .collect::<Result<_>>()?,
            head: ctx.wrap("head", move |vb| Head::new(&c, vb))?,
        });
        Ok(())
    }

    fn configure_optimizers(&self) -> OptimizerConfig {
        OptimizerConfig::from(Algorithm::AdamW {
            lr: self.lr,
            beta1: 0.9,
            beta2: 0.95,
            eps: 1e-8,
            weight_decay: 0.01,
        })
        .with_schedule(self.schedule)
    }

    fn training_step(&mut self, batch: &Self::Batch, _: usize) -> Result<Tensor> {
        self.loss(batch)
    }

    /// PaLM's accounting ([`TrainModule::flops_per_token`]): every parameter but the token
    /// and position tables multiplies. A block holds 12 d² + 13 d (qkv and projection,
    /// the two MLP layers, two layer norms), the head 2 d + d vocab + vocab.
    fn flops_per_token(&self, seq: usize) -> Option<f64> {
        let GptConfig {
            vocab,
            d_model: d,
            n_layer,
            ..
        } = self.config;
        let multiplying = n_layer * (12 * d * d + 13 * d) + 2 * d + d * vocab + vocab;
        Some(6.0 * multiplying as f64 + 12.0 * (n_layer * d * seq) as f64)
    }

    fn validation_step(&mut self, batch: &Self::Batch, _: usize) -> Result<Option<Tensor>> {
        Ok(Some(self.loss(batch)?.detach()))
    }

    fn test_step(&mut self, batch: &Self::Batch, _: usize) -> Result<Option<Tensor>> {
        Ok(Some(self.loss(batch)?.detach()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::{DType, Device};
    use candle_nn::VarMap;

    #[test]
    fn the_flops_count_every_parameter_but_the_lookup_tables() {
        let c = GptConfig {
            vocab: 65,
            block: 64,
            d_model: 48,
            n_layer: 3,
            n_head: 4,
        };
        // Every parameter the layers make, counted where they are made.
        let vars = VarMap::new();
        let vb = VarBuilder::from_varmap(&vars, DType::F32, &Device::Cpu);
        Embed::new(&c, vb.pp("embed")).unwrap();
        for i in 0..c.n_layer {
            Block::new(&c, vb.pp(format!("blocks.{i}"))).unwrap();
        }
        Head::new(&c, vb.pp("head")).unwrap();
        let all: usize = vars.all_vars().iter().map(|v| v.elem_count()).sum();
        let lookup = (c.vocab + c.block) * c.d_model;
        let attention = 12 * c.n_layer * c.d_model * c.block;
        assert_eq!(
            CharGpt::new(c, 1e-3).flops_per_token(c.block),
            Some(6.0 * (all - lookup) as f64 + attention as f64)
        );
    }
}
