//! wick-nn alone: a one-block causal language model over random tokens, built from a
//! candle-nn `VarBuilder` with wick-nn's fused layers, trained with candle-nn's AdamW.
//!
//! `cargo run --release -p wick-nn --example tiny_lm`

use candle_core::{DType, Device, Module, Result, Tensor};
use candle_nn::{Optimizer, VarBuilder, VarMap};
use wick_nn::{cross_entropy, gelu, layer_norm, CausalSelfAttention};

const VOCAB: usize = 16;
const WIDTH: usize = 32;
const TIME: usize = 12;

fn main() -> Result<()> {
    let vars = VarMap::new();
    let vb = VarBuilder::from_varmap(&vars, DType::F32, &Device::Cpu);
    let embed = candle_nn::embedding(VOCAB, WIDTH, vb.pp("embed"))?;
    let ln1 = layer_norm(WIDTH, 1e-5, vb.pp("ln1"))?;
    let attn = CausalSelfAttention::new(WIDTH, 4, vb.pp("attn"))?;
    let ln2 = layer_norm(WIDTH, 1e-5, vb.pp("ln2"))?;
    let fc = candle_nn::linear(WIDTH, 4 * WIDTH, vb.pp("fc"))?;
    let out = candle_nn::linear(4 * WIDTH, VOCAB, vb.pp("out"))?;
    let mut opt = candle_nn::AdamW::new_lr(vars.all_vars(), 1e-2)?;
    // A sequence that repeats with period 4: the model can learn to predict it.
    let ids: Vec<u32> = (0..=TIME as u32).map(|i| (i * 5) % 4).collect();
    let x = Tensor::new(&ids[..TIME], &Device::Cpu)?.unsqueeze(0)?;
    let y = Tensor::new(&ids[1..], &Device::Cpu)?;
    for step in 0..=60 {
        let h = embed.forward(&x)?;
        let h = (&h + attn.forward(&ln1.forward(&h)?)?)?;
        let logits = out.forward(&gelu(&fc.forward(&ln2.forward(&h)?)?)?)?;
        let loss = cross_entropy(&logits.squeeze(0)?, &y)?;
        if step % 20 == 0 {
            println!("step {step}: loss {:.4}", loss.to_scalar::<f32>()?);
        }
        opt.backward_step(&loss)?;
    }
    Ok(())
}
