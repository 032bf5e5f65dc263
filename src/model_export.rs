//! `wick export --model MODEL OUT`: a pretrained model as it is, converted: a GGUF file to a
//! Hugging Face directory, or (with `--gguf`) a directory or a GGUF to a GGUF, with its
//! tokenizer, chat template and generation defaults, as an export of a checkpoint writes
//! them.

use crate::export::{all_of, into_new_dir};
use crate::gguf_export::{into_new_file, write_model, GgufSource};
use crate::hf_files::{completed_side_files, read_side_files, CONFIG_FILE, TOKENIZER_FILE};
use anyhow::Context;
use serde_json::Value;
use std::path::{Path, PathBuf};
use wick_models::GgufType;

/// Writes the model at `model` (a directory or a GGUF file) to `out`: a Hugging Face
/// directory, or with `gguf` a GGUF file of that type; returns the files written.
pub fn run(model: &Path, out: &Path, gguf: Option<GgufType>) -> anyhow::Result<Vec<PathBuf>> {
    let lm = crate::hf_model::load_model(model, None)?;
    let tokenizer = lm.tokenizer().context("the model has no tokenizer")?;
    let weights = lm.weights().context("a pretrained model has weights")?;
    let tensors = all_of(weights.as_ref(), lm.config())?;
    let config_json: Value = serde_json::from_str(lm.config_json())?;
    let carried = read_side_files(model, None)?;
    if let Some(ty) = gguf {
        let source = GgufSource {
            config: lm.config(),
            config_json: &config_json,
            tokenizer,
            carried,
        };
        let file = into_new_file(out, |tmp| write_model(source, &tensors, ty, tmp))?;
        return Ok(vec![file]);
    }
    into_new_dir(out, |tmp| {
        let mut names = vec![CONFIG_FILE, TOKENIZER_FILE, "model.safetensors"];
        std::fs::write(tmp.join(CONFIG_FILE), lm.config_json())?;
        std::fs::write(tmp.join(TOKENIZER_FILE), tokenizer.json())?;
        candle_core::safetensors::save(&tensors, tmp.join("model.safetensors"))?;
        for (name, bytes) in completed_side_files(carried, &config_json, tokenizer)? {
            std::fs::write(tmp.join(name), bytes)?;
            names.push(name);
        }
        Ok(names)
    })
}
