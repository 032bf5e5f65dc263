//! Text generation over a [`KvCache`]: the prompt's positions computed once, then one new
//! token at a time, each drawn as `transformers`' `generate` draws it (greedy, or sampled
//! after its temperature, top-k and top-p warpers, in that order), ending at an end token.

use crate::CausalLm;
use candle_core::{DType, Device, Result, Tensor, D};

/// How [`generate`] picks tokens and when it stops (`transformers`' `GenerationConfig`).
#[derive(Clone, Debug, PartialEq)]
pub struct Sampling {
    /// The most tokens generated after the prompt.
    pub max_new_tokens: usize,
    /// The logits are divided by it before drawing; 0 picks the most likely token every
    /// time (greedy, `do_sample=False`).
    pub temperature: f64,
    /// Draw only among the `top_k` most likely tokens (`None`: all).
    pub top_k: Option<usize>,
    /// Draw only among the most likely tokens whose probabilities first reach `top_p`
    /// (nucleus sampling; 1: all).
    pub top_p: f64,
    /// The seed of the draws: the same seed, the same text.
    pub seed: u64,
    /// Tokens that end the generation (the tokenizer's end of text, `generation_config.json`'s
    /// `eos_token_id` list); the end token is kept as the last token generated.
    pub stop: Vec<u32>,
}

impl Default for Sampling {
    /// Greedy, 128 new tokens, no end token.
    fn default() -> Self {
        Sampling {
            max_new_tokens: 128,
            temperature: 0.0,
            top_k: None,
            top_p: 1.0,
            seed: 0,
            stop: Vec::new(),
        }
    }
}

/// Picks each next token as a [`Sampling`] says, with its own seeded draws: what
/// [`generate`] uses, for a model without a cache too (a window of logits at a time).
pub struct TokenPicker {
    sampling: Sampling,
    rng: XorShift,
}

impl TokenPicker {
    /// A picker whose draws start from `sampling.seed`.
    pub fn new(sampling: &Sampling) -> Self {
        TokenPicker {
            sampling: sampling.clone(),
            rng: XorShift::new(sampling.seed),
        }
    }

    /// The next token from one position's `logits` (`[vocab]`).
    pub fn pick(&mut self, logits: &Tensor) -> Result<u32> {
        pick(logits, &self.sampling, &mut self.rng)
    }
}

/// A 64-bit xorshift generator: the draws' only randomness.
struct XorShift(u64);

impl XorShift {
    fn new(seed: u64) -> Self {
        XorShift(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
    }

    /// A uniform draw in [0, 1).
    fn next_f64(&mut self) -> f64 {
        let mut x = self.0;
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        self.0 = x;
        (x >> 11) as f64 / (1u64 << 53) as f64
    }
}

/// Tokens after `prompt` from `lm` (its parameters whole on this rank), each handed to
/// `on_token` as it comes (to stream it); returns them. Stops after
/// `sampling.max_new_tokens`, at a token of `sampling.stop` (kept), or at the model's last
/// position.
pub fn generate(
    lm: &CausalLm,
    prompt: &[u32],
    sampling: &Sampling,
    mut on_token: impl FnMut(u32) -> Result<()>,
) -> Result<Vec<u32>> {
    if prompt.is_empty() {
        candle_core::bail!("generation needs a prompt of at least one token")
    }
    let room = lm.config().max_positions().saturating_sub(prompt.len());
    let mut cache = lm.new_cache()?;
    let mut picker = TokenPicker::new(sampling);
    let mut input = Tensor::new(prompt, &Device::Cpu)?.unsqueeze(0)?;
    let mut out = Vec::new();
    while out.len() < sampling.max_new_tokens.min(room) {
        let logits = lm.next_logits(&input, &mut cache)?.squeeze(0)?;
        let next = picker.pick(&logits)?;
        out.push(next);
        on_token(next)?;
        if sampling.stop.contains(&next) {
            break;
        }
        input = Tensor::new(&[next], &Device::Cpu)?.unsqueeze(0)?;
    }
    Ok(out)
}

/// The next token from one position's `logits` (`[vocab]`).
fn pick(logits: &Tensor, sampling: &Sampling, rng: &mut XorShift) -> Result<u32> {
    if sampling.temperature <= 0.0 {
        return logits.argmax(D::Minus1)?.to_scalar::<u32>();
    }
    let logits = (logits.to_dtype(DType::F64)? / sampling.temperature)?.to_vec1::<f64>()?;
    let mut order: Vec<usize> = (0..logits.len()).collect();
    // Most likely first; ties by id, so the same logits always give the same order.
    order.sort_by(|&a, &b| logits[b].total_cmp(&logits[a]).then(a.cmp(&b)));
    order.truncate(sampling.top_k.unwrap_or(order.len()).max(1));
    let top = logits[order[0]];
    let weights: Vec<f64> = order.iter().map(|&i| (logits[i] - top).exp()).collect();
    let total: f64 = weights.iter().sum();
    // The smallest head of the order whose probability reaches top_p (at least one).
    let mut kept = 0;
    let mut mass = 0.0;
    while kept < order.len() && (kept == 0 || mass < sampling.top_p) {
        mass += weights[kept] / total;
        kept += 1;
    }
    let kept_total: f64 = weights[..kept].iter().sum();
    let mut draw = rng.next_f64() * kept_total;
    for (i, w) in weights[..kept].iter().enumerate() {
        if draw < *w {
            return Ok(order[i] as u32);
        }
        draw -= w;
    }
    Ok(order[kept - 1] as u32)
}
