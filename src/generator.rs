//! A Hugging Face model, from a `fit --model` checkpoint, a model directory or a GGUF file, ready to
//! generate on one CPU rank: its tokenizer, its chat template and the tokens that end a
//! turn, with the text written to the terminal as the tokens come.

use crate::cli::{ModelSource, SamplingArgs};
use crate::hf_files::{chat_template, read_side_files, side_file, GENERATION_CONFIG_FILE};
use crate::main_job::configure_on_one_cpu;
use anyhow::Context;
use serde_json::Value;
use std::io::Write;
use wick_core::RankStrategy;
use wick_models::{generate, CausalLm, ChatTemplate, Sampling, TextTokenizer};
use wick_trainer::Checkpoint;

/// A language model with what generation needs beside it.
pub struct Generator {
    lm: CausalLm,
    tokenizer: TextTokenizer,
    template: Option<ChatTemplate>,
    /// The tokens that end a generation.
    stop: Vec<u32>,
    /// Holds the parameters the model's views read.
    _strategy: Box<dyn RankStrategy>,
}

impl Generator {
    /// The model `source` names; `None` for a checkpoint of the main job (it has no
    /// `config.json`). Its side files (chat template, generation defaults) are read from
    /// the model directory, or from the checkpoint's attachments.
    pub fn open(source: ModelSource<'_>) -> anyhow::Result<Option<Self>> {
        let (mut lm, from) = match source {
            ModelSource::Checkpoint(path) => {
                let checkpoint = Checkpoint::open(path)?;
                let dir = checkpoint.dir().to_path_buf();
                match crate::hf_model::from_checkpoint(checkpoint)? {
                    Some(lm) => (lm, dir),
                    None => return Ok(None),
                }
            }
            ModelSource::Model(path) => {
                (crate::hf_model::load_model(path, None)?, path.to_path_buf())
            }
        };
        let tokenizer = lm
            .tokenizer()
            .cloned()
            .with_context(|| format!("{}: holds no tokenizer", from.display()))?;
        let files = read_side_files(&from, None)?;
        let template = chat_template(&files, &from)?;
        let generation_config = side_file(&files, GENERATION_CONFIG_FILE);
        let stop = stop_tokens(generation_config, &tokenizer, template.as_ref())?;
        let strategy = configure_on_one_cpu(&mut lm)?;
        Ok(Some(Generator {
            lm,
            tokenizer,
            template,
            stop,
            _strategy: strategy,
        }))
    }

    /// The ids of `text` as `tokenizer(text)` gives them (with the special tokens the
    /// tokenizer adds, a Llama's BOS).
    pub fn text_prompt(&self, text: &str) -> anyhow::Result<Vec<u32>> {
        Ok(self.tokenizer.encode_with_special_tokens(text)?)
    }

    /// The ids of `messages` rendered by the chat template with the generation prompt, as
    /// `apply_chat_template(messages, add_generation_prompt=True)` gives them.
    pub fn chat_prompt(&self, messages: &[Value]) -> anyhow::Result<Vec<u32>> {
        let template = self.template.as_ref().context(
            "the model has no chat template (chat_template.jinja, or tokenizer_config.json's \
             chat_template)",
        )?;
        let text = template
            .render(messages, true)
            .map_err(anyhow::Error::msg)?;
        Ok(self.tokenizer.encode(&text)?)
    }

    /// Generates after `prompt` as `args` say, ending at an end token, writing the text of
    /// the new tokens (not the end token's) to `out` as they come; returns that text.
    pub fn stream(
        &self,
        prompt: &[u32],
        args: &SamplingArgs,
        out: &mut impl Write,
    ) -> anyhow::Result<String> {
        let sampling = Sampling {
            max_new_tokens: args.max_new_tokens,
            temperature: args.temperature,
            top_k: args.top_k,
            top_p: args.top_p,
            seed: args.seed,
            stop: self.stop.clone(),
        };
        let mut ids = Vec::new();
        let mut written = 0;
        let mut text = String::new();
        generate(&self.lm, prompt, &sampling, |id| {
            if self.stop.contains(&id) {
                return Ok(());
            }
            ids.push(id);
            text = self.tokenizer.decode(&ids)?;
            // A character split over tokens is written once it is whole.
            if !text.ends_with('\u{FFFD}') {
                let io = |e: std::io::Error| candle_core::Error::Msg(e.to_string());
                out.write_all(&text.as_bytes()[written..]).map_err(io)?;
                out.flush().map_err(io)?;
                written = text.len();
            }
            Ok(())
        })?;
        Ok(text)
    }
}

/// The tokens that end a generation: `generation_config.json`'s `eos_token_id` (one or a
/// list), the chat template's `eos_token`, and the tokenizer's end of text.
fn stop_tokens(
    generation_config: Option<&[u8]>,
    tokenizer: &TextTokenizer,
    template: Option<&ChatTemplate>,
) -> anyhow::Result<Vec<u32>> {
    let mut stop = Vec::new();
    if let Some(bytes) = generation_config {
        let config: Value = serde_json::from_slice(bytes)
            .with_context(|| format!("{GENERATION_CONFIG_FILE} is not JSON"))?;
        let ids = match &config["eos_token_id"] {
            Value::Array(list) => list.iter().filter_map(Value::as_u64).collect(),
            v => v.as_u64().into_iter().collect::<Vec<_>>(),
        };
        stop.extend(ids.into_iter().filter_map(|id| u32::try_from(id).ok()));
    }
    let named = template.and_then(ChatTemplate::eos_token);
    stop.extend(named.and_then(|t| tokenizer.token_to_id(t)));
    stop.extend(tokenizer.end_of_text());
    stop.sort_unstable();
    stop.dedup();
    Ok(stop)
}
