//! `wick export CHECKPOINT OUT_DIR`: a checkpoint of a `fit --model` run as a Hugging Face
//! model directory: its `config.json` and `tokenizer.json` as they came, and
//! `model.safetensors` with every parameter whole under Hugging Face's names (f32), so that
//! `transformers`' `from_pretrained` loads it.

use crate::lm_job::{CONFIG_FILE, TOKENIZER_FILE};
use std::path::{Path, PathBuf};
use wick_trainer::Checkpoint;

/// Writes the directory `out` (built under a temporary name, renamed at the end) and
/// returns the files written.
pub fn run(checkpoint: &Path, out: &Path) -> anyhow::Result<Vec<PathBuf>> {
    let ck = Checkpoint::open(checkpoint)?;
    let Some(config) = ck.attachment(CONFIG_FILE) else {
        anyhow::bail!(
            "{}: not a checkpoint of a `wick fit --model` run (it holds no {CONFIG_FILE}); \
             `wick consolidate` writes any checkpoint's parameters",
            ck.dir().display()
        )
    };
    let in_use = out.exists() && std::fs::read_dir(out).map_or(true, |mut d| d.next().is_some());
    anyhow::ensure!(
        !in_use,
        "{} exists and is not empty; export into a new directory",
        out.display()
    );
    let tmp = out.with_extension("tmp");
    if tmp.exists() {
        std::fs::remove_dir_all(&tmp)?;
    }
    std::fs::create_dir_all(&tmp)?;
    let mut names = vec![CONFIG_FILE];
    std::fs::copy(&config, tmp.join(CONFIG_FILE))?;
    if let Some(tokenizer) = ck.attachment(TOKENIZER_FILE) {
        std::fs::copy(&tokenizer, tmp.join(TOKENIZER_FILE))?;
        names.push(TOKENIZER_FILE);
    }
    wick_trainer::consolidate(ck.dir(), tmp.join("model.safetensors"), false)?;
    names.push("model.safetensors");
    if out.exists() {
        std::fs::remove_dir(out)?;
    }
    std::fs::rename(&tmp, out)?;
    Ok(names.into_iter().map(|n| out.join(n)).collect())
}
