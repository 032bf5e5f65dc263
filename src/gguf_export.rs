//! `wick export ... OUT.gguf --gguf`: a model as llama.cpp's GGUF, with its tokenizer, chat
//! template and config in llama.cpp's metadata and its matrices in the type `--quant`
//! names: a checkpoint of a `fit --model` run (merged with its adapters, for a LoRA run's
//! `--merge`), or a model as it is (`--model DIR`); or a LoRA run's adapters (`--adapter`)
//! as llama.cpp's LoRA adapter file.

use crate::export::{merge, open_for, read_adapters, whole, ExportForm, Exportable};
use crate::hf_files::{carried_side_files, completed_side_files, side_file, TOKENIZER_FILE};
use anyhow::Context;
use candle_core::Tensor;
use serde_json::Value;
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use wick_models::{
    GgufExport, GgufType, ModelConfig, TextTokenizer, CHAT_TEMPLATE_FILE, TOKENIZER_CONFIG_FILE,
};

/// What a model's GGUF holds beside its tensors.
pub struct GgufSource<'a> {
    /// The model's config.
    pub config: &'a ModelConfig,
    /// Its `config.json`.
    pub config_json: &'a Value,
    /// Its tokenizer.
    pub tokenizer: &'a TextTokenizer,
    /// The side files it carries (`tokenizer_config.json`, `chat_template.jinja`, ...).
    pub carried: Vec<(&'static str, Vec<u8>)>,
}

/// Writes the GGUF file `out` of checkpoint `checkpoint` (under a temporary name, renamed
/// when whole) and returns it.
pub fn run(
    checkpoint: &Path,
    out: &Path,
    form: ExportForm,
    ty: GgufType,
) -> anyhow::Result<PathBuf> {
    let Exportable { ck, config, lora } = open_for(checkpoint, form)?;
    let model_config = ModelConfig::from_file(&config)?;
    let write = |tmp: &Path| -> anyhow::Result<()> {
        if let (Some((lora, _)), ExportForm::Adapter) = (&lora, form) {
            let adapters = read_adapters(&ck, lora, &config)?;
            let (scale, rank) = (lora.scale(), lora.rank);
            return Ok(GgufExport::write_adapter(
                &model_config,
                &adapters,
                scale,
                rank,
                tmp,
            )?);
        }
        let tensors = match &lora {
            Some((lora, base)) => merge(&ck, lora, base, &config)?,
            None => whole(&ck, &model_config)?,
        };
        let tokenizer = ck
            .attachment(TOKENIZER_FILE)
            .with_context(|| format!("{}: holds no {TOKENIZER_FILE}", ck.dir().display()))?;
        let source = GgufSource {
            config: &model_config,
            config_json: &serde_json::from_slice(&std::fs::read(&config)?)?,
            tokenizer: &TextTokenizer::from_file(tokenizer)?,
            carried: carried_side_files(&ck)?,
        };
        write_model(source, &tensors, ty, tmp)
    };
    into_new_file(out, write)
}

/// Writes `out` by `write`, under a temporary name renamed when it is whole; refused where
/// `out` exists.
pub fn into_new_file(
    out: &Path,
    write: impl FnOnce(&Path) -> anyhow::Result<()>,
) -> anyhow::Result<PathBuf> {
    anyhow::ensure!(
        !out.exists(),
        "{} exists; export into a new file",
        out.display()
    );
    let tmp = out.with_extension("gguf.tmp");
    write(&tmp)?;
    std::fs::rename(&tmp, out)?;
    Ok(out.to_path_buf())
}

/// Writes `tensors` as the model `source` describes, with the tokenizer, chat template and
/// special tokens of its side files (completed as a Hugging Face export completes them).
pub fn write_model(
    source: GgufSource<'_>,
    tensors: &HashMap<String, Tensor>,
    ty: GgufType,
    path: &Path,
) -> anyhow::Result<()> {
    let GgufSource {
        config,
        config_json,
        tokenizer,
        carried,
    } = source;
    let files = completed_side_files(carried, config_json, tokenizer)?;
    let template =
        side_file(&files, CHAT_TEMPLATE_FILE).map(|b| String::from_utf8_lossy(b).into_owned());
    // The special tokens as llama.cpp's converter takes them: tokenizer_config.json's names,
    // else config.json's ids.
    let named: Value = side_file(&files, TOKENIZER_CONFIG_FILE)
        .map(serde_json::from_slice)
        .transpose()?
        .unwrap_or_default();
    let special = |key: &str| -> Option<u32> {
        let by_name = named[format!("{key}_token")]
            .as_str()
            .and_then(|t| tokenizer.token_to_id(t));
        let id = &config_json[format!("{key}_token_id")];
        let by_id = id.as_u64().or_else(|| id.get(0)?.as_u64());
        by_name.or(by_id.and_then(|i| u32::try_from(i).ok()))
    };
    let name = config_json["_name_or_path"].as_str().unwrap_or("wick");
    let export = GgufExport {
        config,
        name,
        tokenizer,
        bos: special("bos"),
        eos: special("eos"),
        chat_template: template.as_deref(),
    };
    Ok(export.write(path, tensors, ty)?)
}
