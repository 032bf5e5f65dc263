//! `wick export CHECKPOINT OUT.gguf --gguf`: a checkpoint of a `fit --model` run as
//! llama.cpp's GGUF: the model (merged with its adapters, for a LoRA run's `--merge`) with
//! its tokenizer, chat template and config in llama.cpp's metadata, its matrices in the type
//! `--quant` names; or a LoRA run's adapters (`--adapter`) as llama.cpp's LoRA adapter file.

use crate::export::{merge, open_for, read, read_adapters, ExportForm, Exportable};
use crate::hf_files::{completed_side_files, side_file, SIDE_FILES, TOKENIZER_FILE};
use anyhow::Context;
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use wick_models::{
    GgufExport, GgufType, ModelConfig, TextTokenizer, CHAT_TEMPLATE_FILE, TOKENIZER_CONFIG_FILE,
};
use wick_trainer::Checkpoint;

/// Writes the GGUF file `out` (under a temporary name, renamed when whole) and returns it.
pub fn run(
    checkpoint: &Path,
    out: &Path,
    form: ExportForm,
    ty: GgufType,
) -> anyhow::Result<PathBuf> {
    anyhow::ensure!(
        !out.exists(),
        "{} exists; export into a new file",
        out.display()
    );
    let Exportable {
        ck,
        config: config_path,
        lora,
    } = open_for(checkpoint, form)?;
    let config = ModelConfig::from_file(&config_path)?;
    let tmp = out.with_extension("gguf.tmp");
    match (lora, form) {
        (Some((lora, _)), ExportForm::Adapter) => {
            let adapters = read_adapters(&ck, &lora, &config_path)?;
            GgufExport::write_adapter(&config, &adapters, lora.scale(), lora.rank, &tmp)?;
        }
        (lora, _) => {
            let tensors = match lora {
                Some((lora, base)) => merge(&ck, &lora, &base, &config_path)?,
                None => whole(&ck, &config)?,
            };
            write_model(&ck, &config, &config_path, &tensors, ty, &tmp)?;
        }
    }
    std::fs::rename(&tmp, out)?;
    Ok(out.to_path_buf())
}

/// Every parameter of the checkpoint, whole.
fn whole(
    ck: &Checkpoint,
    config: &ModelConfig,
) -> anyhow::Result<HashMap<String, candle_core::Tensor>> {
    let weights = Checkpoint::open(ck.dir())?.into_weights();
    config
        .parameter_shapes()
        .into_iter()
        .map(|(name, shape)| Ok((name.clone(), read(weights.as_ref(), &name, &shape)?)))
        .collect()
}

/// Writes `tensors` as the model of checkpoint `ck`, with the tokenizer, chat template and
/// special tokens its side files give (completed as a Hugging Face export completes them).
fn write_model(
    ck: &Checkpoint,
    config: &ModelConfig,
    config_path: &Path,
    tensors: &HashMap<String, candle_core::Tensor>,
    ty: GgufType,
    path: &Path,
) -> anyhow::Result<()> {
    let tokenizer_path = ck
        .attachment(TOKENIZER_FILE)
        .with_context(|| format!("{}: holds no {TOKENIZER_FILE}", ck.dir().display()))?;
    let tokenizer = TextTokenizer::from_file(&tokenizer_path)?;
    let mut carried = Vec::new();
    for name in SIDE_FILES {
        if let Some(p) = ck.attachment(name) {
            carried.push((name, std::fs::read(&p)?));
        }
    }
    let files = completed_side_files(carried, config_path, &tokenizer_path)?;
    let template =
        side_file(&files, CHAT_TEMPLATE_FILE).map(|b| String::from_utf8_lossy(b).into_owned());
    // The special tokens as llama.cpp's converter takes them: tokenizer_config.json's names,
    // else config.json's ids.
    let named: serde_json::Value = side_file(&files, TOKENIZER_CONFIG_FILE)
        .map(serde_json::from_slice)
        .transpose()?
        .unwrap_or_default();
    let config_json: serde_json::Value = serde_json::from_slice(&std::fs::read(config_path)?)?;
    let special = |key: &str| -> Option<u32> {
        let by_name = named[format!("{key}_token")]
            .as_str()
            .and_then(|t| tokenizer.token_to_id(t));
        let id = &config_json[format!("{key}_token_id")];
        let by_id = id.as_u64().or_else(|| id.get(0)?.as_u64());
        by_name.or(by_id.and_then(|i| u32::try_from(i).ok()))
    };
    let name = config_json["_name_or_path"]
        .as_str()
        .unwrap_or("wick fine-tune");
    let export = GgufExport {
        config,
        name,
        tokenizer: &tokenizer,
        bos: special("bos"),
        eos: special("eos"),
        chat_template: template.as_deref(),
    };
    export.write(path, tensors, ty)?;
    Ok(())
}
