//! `wick sample CHECKPOINT --prompt TEXT` (or `--model DIR`, or `--chat MESSAGE`): text
//! from a model, on one CPU rank: the main job's (characters), or a Hugging Face model's
//! (a `fit --model` checkpoint's, read at any world size and strategy, or a model
//! directory's) through [`Generator`], its KV cache and end tokens. The same seed gives the
//! same text.

use crate::char_corpus::Vocab;
use crate::char_gpt::CharGpt;
use crate::cli::{ModelSource, SampleArgs};
use crate::generator::Generator;
use crate::main_job::{configure_on_one_cpu, corpus, main_job_config};
use candle_core::{Device, Tensor};
use serde_json::json;
use std::io::Write;
use std::path::Path;
use wick_models::{Sampling, TokenPicker};
use wick_trainer::Checkpoint;

/// Writes to `out` what `wick sample` prints: the prompt and its continuation, or the
/// answer to `--chat`, each token's text as it comes; a line end at the end.
pub fn run(args: &SampleArgs, out: &mut impl Write) -> anyhow::Result<()> {
    if let Some(generator) = Generator::open(args.from.source())? {
        let prompt = match (&args.chat, &args.prompt) {
            (Some(message), _) => {
                generator.chat_prompt(&[json!({ "role": "user", "content": message })])?
            }
            (None, Some(text)) => {
                write!(out, "{text}")?;
                generator.text_prompt(text)?
            }
            (None, None) => unreachable!("clap requires --prompt unless --chat is given"),
        };
        generator.stream(&prompt, &args.sampling, out)?;
        writeln!(out)?;
        return Ok(());
    }
    let ModelSource::Checkpoint(path) = args.from.source() else {
        unreachable!("a model directory always opens a generator")
    };
    let Some(text) = &args.prompt else {
        anyhow::bail!("--chat needs a chat model; the main job's model continues a --prompt")
    };
    writeln!(out, "{}", sample_characters(path, text, args)?)?;
    Ok(())
}

/// The prompt and `args.sampling.max_new_tokens` characters after it from the main job's
/// model in the checkpoint at `path`.
fn sample_characters(path: &Path, prompt: &str, args: &SampleArgs) -> anyhow::Result<String> {
    let checkpoint = Checkpoint::open(path)?;
    let text = corpus(args.data.as_deref())?;
    let vocab = Vocab::of(&text);
    let mut ids = vocab.encode(prompt).map_err(|c| {
        anyhow::anyhow!("the prompt's character {c:?} is not in the corpus's vocabulary")
    })?;
    anyhow::ensure!(!ids.is_empty(), "--prompt must not be empty");
    let config = main_job_config(vocab.len());
    let mut model = CharGpt::new(config, 1e-3).with_weights(checkpoint.into_weights());
    // The strategy holds the parameters the model's views read.
    let _strategy = configure_on_one_cpu(&mut model)?;
    let s = &args.sampling;
    let mut picker = TokenPicker::new(&Sampling {
        temperature: s.temperature,
        top_k: s.top_k,
        top_p: s.top_p,
        seed: s.seed,
        ..Sampling::default()
    });
    let prompt_len = ids.len();
    // The character model has no cache: each draw reads the logits of the last window.
    for _ in 0..s.max_new_tokens {
        let window = &ids[ids.len().saturating_sub(config.block)..];
        let input = Tensor::new(window, &Device::Cpu)?.unsqueeze(0)?;
        let logits = model.forward(&input)?.squeeze(0)?;
        ids.push(picker.pick(&logits.get(window.len() - 1)?)?);
    }
    Ok(format!("{prompt}{}", vocab.decode(&ids[prompt_len..])))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cli::{ModelChoice, SamplingArgs};

    /// `wick sample`'s output for `args`.
    fn sample(args: &SampleArgs) -> anyhow::Result<String> {
        let mut out = Vec::new();
        run(args, &mut out)?;
        Ok(String::from_utf8(out)?.trim_end().to_string())
    }

    #[test]
    fn the_same_seed_gives_the_same_text_from_a_two_rank_checkpoint() {
        let dir = crate::main_job::trained_checkpoint(wick_strategies::StrategyKind::Zero3, 3);
        let root = dir.path();
        let args = |seed, prompt: &str| SampleArgs {
            from: ModelChoice {
                checkpoint: Some(root.join("ck/last")),
                model: None,
            },
            prompt: Some(prompt.into()),
            chat: None,
            sampling: SamplingArgs {
                max_new_tokens: 40,
                temperature: 1.0,
                top_k: None,
                top_p: 1.0,
                seed,
            },
            data: None,
        };
        let (a, b, c) = (
            sample(&args(5, "The ")).unwrap(),
            sample(&args(5, "The ")).unwrap(),
            sample(&args(6, "The ")).unwrap(),
        );
        assert_eq!(a, b);
        assert_ne!(a, c, "another seed drew the same 40 characters");
        assert!(a.starts_with("The ") && a.chars().count() == 44, "{a:?}");
        let e = sample(&args(5, "\u{1F600}")).unwrap_err();
        assert!(
            e.to_string().contains("not in the corpus's vocabulary"),
            "{e}"
        );
    }
}
