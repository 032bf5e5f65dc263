//! The fields of one `config.json` as they are taken: each read, checked or known to leave
//! the math alone. What is left at the end is not known to wick; `transformers` ignores such
//! fields, and so does wick, after one warning that names each.

use super::ConfigError;
use serde_json::{Map, Value};
use std::path::PathBuf;

/// Fields real checkpoints carry that change nothing wick computes: token ids, generation
/// and bookkeeping, the heads and outputs of other tasks. The published configs of each
/// family are tests of this list (tests/fixtures/configs).
const METADATA: &[&str] = &[
    "_name_or_path",
    "architectures",
    "bos_token_id",
    "cache_implementation",
    "chunk_size_feed_forward",
    "dtype",
    "eos_token_id",
    "id2label",
    "initializer_range",
    "is_encoder_decoder",
    "is_llama_config",
    "label2id",
    "model_type",
    "name_or_path",
    "output_attentions",
    "output_hidden_states",
    "pad_token_id",
    "problem_type",
    "return_dict",
    "torch_dtype",
    "transformers_version",
    "use_cache",
];

/// The fields of one config, taken as they are read.
pub(crate) struct Fields {
    pub(crate) path: PathBuf,
    pub(crate) map: Map<String, Value>,
}

impl Fields {
    pub(crate) fn error(&self, message: String) -> ConfigError {
        ConfigError {
            path: self.path.clone(),
            message,
        }
    }

    pub(crate) fn take(&mut self, key: &str) -> Option<Value> {
        self.map.remove(key).filter(|v| !v.is_null())
    }

    pub(crate) fn usize(&mut self, key: &str) -> Result<Option<usize>, ConfigError> {
        match self.take(key) {
            None => Ok(None),
            Some(v) => v
                .as_u64()
                .filter(|&n| n > 0)
                .map(|n| Some(n as usize))
                .ok_or_else(|| {
                    self.error(format!("field '{key}' must be a positive integer, got {v}"))
                }),
        }
    }

    pub(crate) fn required(&mut self, key: &str) -> Result<usize, ConfigError> {
        self.usize(key)?
            .ok_or_else(|| self.error(format!("field '{key}' is missing")))
    }

    pub(crate) fn float(&mut self, key: &str) -> Result<Option<f64>, ConfigError> {
        match self.take(key) {
            None => Ok(None),
            Some(v) => v
                .as_f64()
                .map(Some)
                .ok_or_else(|| self.error(format!("field '{key}' must be a number, got {v}"))),
        }
    }

    pub(crate) fn bool(&mut self, key: &str, default: bool) -> Result<bool, ConfigError> {
        match self.take(key) {
            None => Ok(default),
            Some(Value::Bool(b)) => Ok(b),
            Some(v) => Err(self.error(format!("field '{key}' must be true or false, got {v}"))),
        }
    }

    /// A field that must hold `want` when present (`want` also when absent).
    pub(crate) fn expect(&mut self, key: &str, want: &Value, why: &str) -> Result<(), ConfigError> {
        match self.take(key) {
            Some(v) if v != *want => Err(self.error(format!(
                "field '{key}' is {v}; wick supports only {want} ({why})"
            ))),
            _ => Ok(()),
        }
    }

    /// A dropout rate. wick trains without dropout, which changes training (not the
    /// forward at evaluation, where `transformers` applies none either): said once, on
    /// the log, rather than refused, since published GPT-2 checkpoints set 0.1.
    pub(crate) fn dropout(&mut self, key: &str) -> Result<(), ConfigError> {
        if let Some(p) = self.float(key)?.filter(|&p| p != 0.0) {
            log::info!(
                "{}: field '{key}' is {p}; wick trains without dropout",
                self.path.display()
            );
        }
        Ok(())
    }

    /// Ends the reading: the metadata and `ignored` go; the names of the fields left,
    /// which wick does not know, are returned.
    pub(crate) fn unknown_fields(mut self, ignored: &[&str]) -> Vec<String> {
        for key in METADATA.iter().chain(ignored) {
            self.map.remove(*key);
        }
        self.map.keys().cloned().collect()
    }
}
