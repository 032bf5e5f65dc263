//! The main job's model: a small GPT-style character language model, built from candle-nn
//! layers inside `configure_sharded_model`.

use candle_core::{DType, Device, Result, Tensor, D};
use candle_nn::{Embedding, Linear, Module, VarBuilder};
use wick_core::{OptimizerConfig, ShardedContext, TrainModule, Wrapped};

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

/// Layer norm from basic ops, so autograd reaches its parameters.
#[derive(Clone)]
struct Norm {
    weight: Tensor,
    bias: Tensor,
}

impl Norm {
    fn new(size: usize, vb: VarBuilder) -> Result<Self> {
        Ok(Norm {
            weight: vb.get_with_hints(size, "weight", candle_nn::Init::Const(1.0))?,
            bias: vb.get_with_hints(size, "bias", candle_nn::Init::Const(0.0))?,
        })
    }

    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let centered = x.broadcast_sub(&x.mean_keepdim(D::Minus1)?)?;
        let var = centered.sqr()?.mean_keepdim(D::Minus1)?;
        let normed = centered.broadcast_div(&(var + 1e-5)?.sqrt()?)?;
        normed
            .broadcast_mul(&self.weight)?
            .broadcast_add(&self.bias)
    }
}

#[derive(Clone)]
struct Block {
    ln1: Norm,
    qkv: Linear,
    proj: Linear,
    ln2: Norm,
    fc: Linear,
    fc_out: Linear,
    n_head: usize,
}

impl Block {
    fn new(c: &GptConfig, vb: VarBuilder) -> Result<Self> {
        let d = c.d_model;
        Ok(Block {
            ln1: Norm::new(d, vb.pp("ln1"))?,
            qkv: candle_nn::linear(d, 3 * d, vb.pp("attn.qkv"))?,
            proj: candle_nn::linear(d, d, vb.pp("attn.proj"))?,
            ln2: Norm::new(d, vb.pp("ln2"))?,
            fc: candle_nn::linear(d, 4 * d, vb.pp("mlp.fc"))?,
            fc_out: candle_nn::linear(4 * d, d, vb.pp("mlp.out"))?,
            n_head: c.n_head,
        })
    }

    fn attention(&self, x: &Tensor, mask: &Tensor) -> Result<Tensor> {
        let (b, t, c) = x.dims3()?;
        let hd = c / self.n_head;
        let qkv = self.qkv.forward(x)?.reshape((b, t, 3, self.n_head, hd))?;
        let head = |i| {
            qkv.narrow(2, i, 1)?
                .squeeze(2)?
                .transpose(1, 2)?
                .contiguous()
        };
        let (q, k, v) = (head(0)?, head(1)?, head(2)?);
        let scores =
            (q.matmul(&k.t()?)? / (hd as f64).sqrt())?.broadcast_add(&mask.to_dtype(q.dtype())?)?;
        let weights = candle_nn::ops::softmax(&scores, D::Minus1)?;
        let out = weights.matmul(&v)?.transpose(1, 2)?.reshape((b, t, c))?;
        self.proj.forward(&out)
    }

    fn forward(&self, x: &Tensor, mask: &Tensor) -> Result<Tensor> {
        let x = (x + self.attention(&self.ln1.forward(x)?, mask)?)?;
        let h = self.fc.forward(&self.ln2.forward(&x)?)?.gelu()?;
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
    ln_f: Norm,
    out: Linear,
}

impl Head {
    fn new(c: &GptConfig, vb: VarBuilder) -> Result<Self> {
        Ok(Head {
            ln_f: Norm::new(c.d_model, vb.pp("ln_f"))?,
            out: candle_nn::linear(c.d_model, c.vocab, vb.pp("out"))?,
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
    layers: Option<Layers>,
}

impl CharGpt {
    /// A model of `config` trained with AdamW at `lr`; no parameters yet.
    pub fn new(config: GptConfig, lr: f64) -> Self {
        CharGpt {
            config,
            lr,
            layers: None,
        }
    }

    /// Logits `[batch, time, vocab]` for character ids `[batch, time]`.
    pub fn forward(&self, ids: &Tensor) -> Result<Tensor> {
        let layers = self.layers.as_ref().ok_or_else(|| {
            candle_core::Error::Msg("model used before configure_sharded_model".into())
        })?;
        let (_, t) = ids.dims2()?;
        let mask = causal_mask(t, ids.device())?;
        // Each unit runs through `apply`: under fsdp full_shard it is gathered, run and
        // freed, then gathered again and recomputed in backward.
        let mut x = layers.embed.apply(ids, move |e, ids| {
            e.tok.forward(ids)?.broadcast_add(&e.pos.narrow(0, 0, t)?)
        })?;
        for block in &layers.blocks {
            let mask = mask.clone();
            x = block.apply(&x, move |b, x| b.forward(x, &mask))?;
        }
        layers
            .head
            .apply(&x, |h, x| h.out.forward(&h.ln_f.forward(x)?))
    }

    fn loss(&self, (ids, targets): &(Tensor, Tensor)) -> Result<Tensor> {
        let logits = self.forward(ids)?;
        let (b, t, v) = logits.dims3()?;
        candle_nn::loss::cross_entropy(&logits.reshape((b * t, v))?, &targets.reshape(b * t)?)
    }
}

/// 0 on and below the diagonal, a large negative number above it.
fn causal_mask(t: usize, device: &Device) -> Result<Tensor> {
    let values: Vec<f32> = (0..t * t)
        .map(|i| if i % t > i / t { -1e9 } else { 0.0 })
        .collect();
    Tensor::from_vec(values, (t, t), device)?.to_dtype(DType::F32)
}

impl TrainModule for CharGpt {
    type Batch = (Tensor, Tensor);

    fn configure_sharded_model(&mut self, ctx: &ShardedContext) -> Result<()> {
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
        OptimizerConfig::AdamW {
            lr: self.lr,
            beta1: 0.9,
            beta2: 0.95,
            eps: 1e-8,
            weight_decay: 0.01,
        }
    }

    fn training_step(&mut self, batch: &Self::Batch, _: usize) -> Result<Tensor> {
        self.loss(batch)
    }

    fn validation_step(&mut self, batch: &Self::Batch, _: usize) -> Result<Option<Tensor>> {
        Ok(Some(self.loss(batch)?.detach()))
    }
}
