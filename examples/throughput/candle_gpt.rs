//! The plain Candle baseline of the throughput rows: the same GPT as a Candle user writes
//! it (candle-nn layers, composite ops, candle-nn's AdamW over a `VarMap`), run in a child
//! process with Candle's default settings.

use crate::char_gpt::GptConfig;
use crate::{data, median_step, BATCH, LR, STEPS};
use candle_core::{DType, Device, Module, Result, Tensor};
use candle_nn::{Embedding, Linear, Optimizer, VarBuilder, VarMap};
use std::time::Instant;
use wick::nn::{causal_attention_composite, cross_entropy_composite, layer_norm_composite};

/// The same GPT as a plain Candle user writes it: candle-nn layers and composite ops.
struct CandleGpt {
    tok: Embedding,
    pos: Tensor,
    blocks: Vec<[(Tensor, Tensor); 2]>,
    linears: Vec<[Linear; 4]>,
    ln_f: (Tensor, Tensor),
    out: Linear,
    n_head: usize,
}

impl CandleGpt {
    fn new(c: &GptConfig, vb: VarBuilder) -> Result<Self> {
        let d = c.d_model;
        let norm = |vb: VarBuilder| -> Result<(Tensor, Tensor)> {
            Ok((
                vb.get_with_hints(d, "weight", candle_nn::Init::Const(1.0))?,
                vb.get_with_hints(d, "bias", candle_nn::Init::Const(0.0))?,
            ))
        };
        let (mut blocks, mut linears) = (Vec::new(), Vec::new());
        for i in 0..c.n_layer {
            let vb = vb.pp(format!("blocks.{i}"));
            blocks.push([norm(vb.pp("ln1"))?, norm(vb.pp("ln2"))?]);
            linears.push([
                candle_nn::linear(d, 3 * d, vb.pp("attn.qkv"))?,
                candle_nn::linear(d, d, vb.pp("attn.proj"))?,
                candle_nn::linear(d, 4 * d, vb.pp("mlp.fc"))?,
                candle_nn::linear(4 * d, d, vb.pp("mlp.out"))?,
            ]);
        }
        Ok(CandleGpt {
            tok: candle_nn::embedding(c.vocab, d, vb.pp("tok"))?,
            pos: vb.get((c.block, d), "pos")?,
            blocks,
            linears,
            ln_f: norm(vb.pp("ln_f"))?,
            out: candle_nn::linear(d, c.vocab, vb.pp("out"))?,
            n_head: c.n_head,
        })
    }

    fn loss(&self, ids: &Tensor, targets: &Tensor) -> Result<Tensor> {
        let (b, t) = ids.dims2()?;
        let mut x = self.tok.forward(ids)?.broadcast_add(&self.pos)?;
        let c = x.dim(2)?;
        let hd = c / self.n_head;
        for ([ln1, ln2], [qkv, proj, fc, fc_out]) in self.blocks.iter().zip(&self.linears) {
            let h = layer_norm_composite(&x, &ln1.0, &ln1.1, 1e-5)?;
            let qkv = qkv.forward(&h)?.reshape((b, t, 3, self.n_head, hd))?;
            let head = |i| {
                qkv.narrow(2, i, 1)?
                    .squeeze(2)?
                    .transpose(1, 2)?
                    .contiguous()
            };
            let a = causal_attention_composite(&head(0)?, &head(1)?, &head(2)?)?;
            x = (&x + proj.forward(&a.transpose(1, 2)?.reshape((b, t, c))?)?)?;
            let h = fc
                .forward(&layer_norm_composite(&x, &ln2.0, &ln2.1, 1e-5)?)?
                .gelu()?;
            x = (&x + fc_out.forward(&h)?)?;
        }
        let logits =
            self.out
                .forward(&layer_norm_composite(&x, &self.ln_f.0, &self.ln_f.1, 1e-5)?)?;
        cross_entropy_composite(&logits.reshape((b * t, ()))?, &targets.reshape(b * t)?)
    }
}

/// A plain Candle loop's seconds per step.
pub(crate) fn candle_step(c: GptConfig) -> anyhow::Result<f64> {
    let vars = VarMap::new();
    let model = CandleGpt::new(&c, VarBuilder::from_varmap(&vars, DType::F32, &Device::Cpu))?;
    let mut opt = candle_nn::AdamW::new(
        vars.all_vars(),
        candle_nn::ParamsAdamW {
            lr: LR,
            ..Default::default()
        },
    )?;
    let data = data(&c, STEPS);
    let mut times = vec![Instant::now()];
    for step in 0..STEPS.total() {
        let indices: Vec<usize> = (step * BATCH..(step + 1) * BATCH).collect();
        let wick::core::TokenBatch { ids, targets, .. } =
            wick::trainer::Dataset::batch(&data, &indices, &Device::Cpu)?;
        opt.backward_step(&model.loss(&ids, &targets)?)?;
        times.push(Instant::now());
    }
    Ok(median_step(&times[1..], STEPS.warmup))
}
