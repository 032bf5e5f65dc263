//! A Hugging Face `config.json`, read into the shape of one of the families wick builds.
//!
//! As `transformers` reads it: every field wick reads sets a size or a choice, with the
//! family's defaults where it is absent. A field that would change the math in a way wick
//! does not build (a `longrope` rope, a partial rotary factor, an activation other than
//! SiLU or GELU-tanh) is refused by name, never trained differently than `transformers`
//! would. The metadata real checkpoints carry is accepted (`fields.rs` lists it); any other
//! field is named in one warning and ignored, as `transformers` ignores it.

mod decoder;
mod fields;
mod gpt2;
mod rope;

pub use decoder::{Activation, DecoderConfig, Family};
pub use gpt2::Gpt2Config;
pub use rope::{Rope, RopeScaling};

use fields::Fields;
use serde_json::Value;
use std::path::{Path, PathBuf};

/// The model a `config.json` describes.
#[derive(Debug, Clone, PartialEq)]
pub enum ModelConfig {
    /// `model_type` `llama`, `mistral`, `qwen2`, `qwen3` or `gemma2`.
    Decoder(DecoderConfig),
    /// `model_type = "gpt2"`.
    Gpt2(Gpt2Config),
}

/// Why a `config.json` cannot be used.
#[derive(Debug, Clone, thiserror::Error)]
#[error("{}: {message}", path.display())]
pub struct ConfigError {
    /// The file.
    pub path: PathBuf,
    /// What is wrong, naming the field.
    pub message: String,
}

impl ModelConfig {
    /// Reads and checks `config.json` at `path`.
    pub fn from_file(path: impl AsRef<Path>) -> Result<Self, ConfigError> {
        let path = path.as_ref();
        let text = std::fs::read_to_string(path).map_err(|e| ConfigError {
            path: path.to_path_buf(),
            message: e.to_string(),
        })?;
        Self::from_json(&text, path)
    }

    /// Reads and checks a `config.json` text (`path` names it in errors). Each field wick
    /// does not know is named once in a warning (the `log` crate's) and ignored.
    pub fn from_json(text: &str, path: &Path) -> Result<Self, ConfigError> {
        let (config, unknown) = Self::read_json(text, path)?;
        for key in unknown {
            log::warn!(
                "{}: field '{key}' is not known to wick and is ignored",
                path.display()
            );
        }
        Ok(config)
    }

    /// [`ModelConfig::from_json`], printing nothing: the config and the fields it ignored.
    pub fn read_json(text: &str, path: &Path) -> Result<(Self, Vec<String>), ConfigError> {
        let error = |message: String| ConfigError {
            path: path.to_path_buf(),
            message,
        };
        let map = match serde_json::from_str(text) {
            Ok(Value::Object(map)) => map,
            Ok(_) => return Err(error("not a JSON object".into())),
            Err(e) => return Err(error(format!("not JSON: {e}"))),
        };
        let fields = Fields {
            path: path.to_path_buf(),
            map,
        };
        let model_type = fields
            .map
            .get("model_type")
            .and_then(Value::as_str)
            .map(str::to_string);
        let family = match model_type.as_deref() {
            Some("gpt2") => {
                let (c, unknown) = gpt2::gpt2(fields)?;
                return Ok((ModelConfig::Gpt2(c), unknown));
            }
            Some("llama") => Family::Llama,
            Some("mistral") => Family::Mistral,
            Some("qwen2") => Family::Qwen2,
            Some("qwen3") => Family::Qwen3,
            Some("gemma2") => Family::Gemma2,
            Some(other) => {
                return Err(error(format!(
                    "model_type '{other}' is not a family wick builds (llama, mistral, qwen2, \
                     qwen3, gemma2, gpt2)"
                )))
            }
            None => return Err(error("field 'model_type' is missing".into())),
        };
        let (c, unknown) = decoder::decoder(fields, family)?;
        Ok((ModelConfig::Decoder(c), unknown))
    }

    /// The vocabulary size.
    pub fn vocab_size(&self) -> usize {
        match self {
            ModelConfig::Decoder(c) => c.vocab_size,
            ModelConfig::Gpt2(c) => c.vocab_size,
        }
    }

    /// The longest sequence the model takes.
    pub fn max_positions(&self) -> usize {
        match self {
            ModelConfig::Decoder(c) => c.max_positions(),
            ModelConfig::Gpt2(c) => c.n_positions,
        }
    }

    /// The number of scalar parameters.
    pub fn num_parameters(&self) -> usize {
        self.parameter_shapes()
            .iter()
            .map(|(_, s)| s.iter().product::<usize>())
            .sum()
    }

    /// The units wick wraps (one per decoder block; the embeddings, final norm and head on
    /// their own) and their element counts, in creation order.
    pub fn unit_sizes(&self) -> Vec<(String, usize)> {
        let mut units: Vec<(String, usize)> = Vec::new();
        for (name, shape) in self.parameter_shapes() {
            let parts: Vec<&str> = name.split('.').collect();
            // `model.layers.3.mlp.up_proj.weight` is in `model.layers.3`; `lm_head.weight`
            // in `lm_head`.
            let unit = match parts.as_slice() {
                [a, b @ ("layers" | "h"), i, ..] => format!("{a}.{b}.{i}"),
                [rest @ .., _] => rest.join("."),
                [] => String::new(),
            };
            let n: usize = shape.iter().product();
            match units.last_mut() {
                Some((u, total)) if *u == unit => *total += n,
                _ => units.push((unit, n)),
            }
        }
        units
    }

    /// The model FLOPs of training on one token of a `seq`-token sample, by PaLM's
    /// accounting (torchtitan's): 6 x the parameters that multiply, which are all but the
    /// lookup tables a gather reads (the token embedding when the head has a weight of its
    /// own, GPT-2's positions), plus attention's 12 x layers x heads x head_dim x `seq`
    /// (the masked half of causal attention counted too). Under LoRA with `adapters`
    /// trainable parameters the frozen ones count 4 x (a frozen weight's backward makes
    /// only its input's gradient) and the adapters 6 x.
    pub fn flops_per_token(&self, seq: usize, adapters: Option<usize>) -> f64 {
        let (lookup, attention) = match self {
            ModelConfig::Decoder(c) => (
                if c.tie_word_embeddings {
                    0
                } else {
                    c.vocab_size * c.hidden_size
                },
                c.num_hidden_layers * c.num_attention_heads * c.head_dim,
            ),
            ModelConfig::Gpt2(c) => (c.n_positions * c.n_embd, c.n_layer * c.n_embd),
        };
        let multiplying = (self.num_parameters() - lookup) as f64;
        let weights = match adapters {
            None => 6.0 * multiplying,
            Some(adapters) => 4.0 * multiplying + 6.0 * adapters as f64,
        };
        weights + 12.0 * (attention * seq) as f64
    }

    /// Every parameter's Hugging Face name and shape, in the order wick creates them.
    pub fn parameter_shapes(&self) -> Vec<(String, Vec<usize>)> {
        let mut out = Vec::new();
        match self {
            ModelConfig::Decoder(c) => c.parameter_shapes(&mut out),
            ModelConfig::Gpt2(c) => c.parameter_shapes(&mut out),
        }
        out
    }
}
