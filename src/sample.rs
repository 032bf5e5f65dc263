//! `wick sample CHECKPOINT --prompt TEXT --tokens N`: text from a checkpoint's model (the
//! main job's, or a `fit --model` run's with its tokenizer), its parameters read from a
//! checkpoint of any world size and strategy, on one CPU rank. The same seed gives the same
//! text.

use crate::char_corpus::Vocab;
use crate::char_gpt::CharGpt;
use crate::cli::SampleArgs;
use crate::main_job::{configure_on_one_cpu, corpus, main_job_config};
use candle_core::{DType, Device, Tensor, D};
use wick_trainer::Checkpoint;

/// A 64-bit xorshift generator: the sampler's only randomness, seeded by `--seed`.
struct XorShift(u64);

impl XorShift {
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

/// The prompt followed by `args.tokens` generated tokens: characters of the main job's
/// model, or, from a checkpoint of a `fit --model` run, tokens of its tokenizer.
pub fn sample(args: &SampleArgs) -> anyhow::Result<String> {
    let checkpoint = Checkpoint::open(&args.checkpoint)?;
    if checkpoint
        .attachment(crate::hf_model::CONFIG_FILE)
        .is_some()
    {
        let mut lm = crate::hf_model::from_checkpoint(checkpoint)?.expect("it has a config");
        let tokenizer = lm
            .tokenizer()
            .cloned()
            .ok_or_else(|| anyhow::anyhow!("the checkpoint holds no tokenizer.json"))?;
        let prompt = tokenizer.encode(&args.prompt)?;
        let _strategy = configure_on_one_cpu(&mut lm)?;
        let context = lm.config().max_positions();
        let ids = generate(args, prompt, context, |input| lm.logits(input))?;
        return Ok(format!("{}{}", args.prompt, tokenizer.decode(&ids)?));
    }
    let text = corpus(args.data.as_deref())?;
    let vocab = Vocab::of(&text);
    let prompt = vocab.encode(&args.prompt).map_err(|c| {
        anyhow::anyhow!("the prompt's character {c:?} is not in the corpus's vocabulary")
    })?;
    let config = main_job_config(vocab.len());
    let mut model = CharGpt::new(config, 1e-3).with_weights(checkpoint.into_weights());
    // The strategy holds the parameters the model's views read.
    let _strategy = configure_on_one_cpu(&mut model)?;
    let ids = generate(args, prompt, config.block, |input| model.forward(input))?;
    Ok(format!("{}{}", args.prompt, vocab.decode(&ids)))
}

/// `args.tokens` ids after `prompt`, each drawn from the logits `logits` gives for the last
/// `context` ids (`[1, time]` in, `[1, time, vocab]` out); returns the new ids only.
fn generate(
    args: &SampleArgs,
    mut ids: Vec<u32>,
    context: usize,
    logits: impl Fn(&Tensor) -> candle_core::Result<Tensor>,
) -> anyhow::Result<Vec<u32>> {
    anyhow::ensure!(!ids.is_empty(), "--prompt must not be empty");
    let mut rng = XorShift(args.seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1);
    let prompt_len = ids.len();
    for _ in 0..args.tokens {
        let window = &ids[ids.len().saturating_sub(context)..];
        let input = Tensor::new(window, &Device::Cpu)?.unsqueeze(0)?;
        let out = logits(&input)?.squeeze(0)?;
        let last = out.get(window.len() - 1)?.to_dtype(DType::F64)?;
        let next = match args.temperature {
            t if t <= 0.0 => last.argmax(D::Minus1)?.to_scalar::<u32>()?,
            t => {
                let probs = candle_nn::ops::softmax(&(last / t)?, D::Minus1)?.to_vec1::<f64>()?;
                let draw = rng.next_f64();
                let mut total = 0.0;
                let pick = probs.iter().position(|p| {
                    total += p;
                    draw < total
                });
                pick.unwrap_or(probs.len() - 1) as u32
            }
        };
        ids.push(next);
    }
    Ok(ids.split_off(prompt_len))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_same_seed_gives_the_same_text_from_a_two_rank_checkpoint() {
        let dir = crate::main_job::trained_checkpoint(wick_strategies::StrategyKind::Zero3, 3);
        let root = dir.path();
        let args = |seed| SampleArgs {
            checkpoint: root.join("ck/last"),
            prompt: "The ".into(),
            tokens: 40,
            temperature: 1.0,
            seed,
            data: None,
        };
        let (a, b, c) = (
            sample(&args(5)).unwrap(),
            sample(&args(5)).unwrap(),
            sample(&args(6)).unwrap(),
        );
        assert_eq!(a, b);
        assert_ne!(a, c, "another seed drew the same 40 characters");
        assert!(a.starts_with("The ") && a.chars().count() == 44, "{a:?}");
        let e = sample(&SampleArgs {
            prompt: "\u{1F600}".into(),
            ..args(5)
        })
        .unwrap_err();
        assert!(
            e.to_string().contains("not in the corpus's vocabulary"),
            "{e}"
        );
    }
}
