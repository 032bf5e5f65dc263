//! `wick export CHECKPOINT OUT_DIR`: a checkpoint of a `fit --model` run as a Hugging Face
//! model directory: its `config.json` and `tokenizer.json` as they came, the tokenizer's
//! options, chat template and generation defaults (as they came, or completed as
//! `save_pretrained` writes them: [`crate::hf_files`]), and `model.safetensors` with every
//! parameter whole under Hugging Face's names (f32), so that `transformers`'
//! `from_pretrained` loads it and a chat model still chats.
//!
//! A LoRA run's checkpoint holds adapters only: `--adapter` writes them as PEFT saves them
//! (`adapter_config.json`, `adapter_model.safetensors` under PEFT's names), which
//! `peft.PeftModel.from_pretrained` loads over the base model; `--merge` writes the base
//! model with each adapted weight replaced by W + (alpha / r) B A.

use crate::hf_files::{write_side_files, CONFIG_FILE, TOKENIZER_FILE};
use crate::hf_model::lora_of;
use anyhow::Context;
use candle_core::{Device, Shape, Tensor};
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use wick_core::{StateReader, WeightSource, PARAM_KIND};
use wick_models::{
    LoraConfig, ModelConfig, ADAPTER_CONFIG_FILE, ADAPTER_WEIGHTS_FILE, PEFT_PREFIX,
};
use wick_trainer::Checkpoint;

/// What `export` writes of a checkpoint.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ExportForm {
    /// The parameters it holds, as a model directory (not for a LoRA checkpoint).
    Whole,
    /// A LoRA checkpoint's adapters, as a PEFT adapter directory.
    Adapter,
    /// A LoRA checkpoint's adapters merged into its base model, as a model directory.
    Merged,
}

/// A checkpoint of a `fit --model` run, opened to be exported.
pub(crate) struct Exportable {
    /// The checkpoint.
    pub ck: Checkpoint,
    /// The `config.json` it holds.
    pub config: PathBuf,
    /// A LoRA run's options and its base model.
    pub lora: Option<(LoraConfig, PathBuf)>,
}

/// The checkpoint at `checkpoint`, to be exported as `form`; refused where `form` does not
/// fit it.
pub(crate) fn open_for(checkpoint: &Path, form: ExportForm) -> anyhow::Result<Exportable> {
    let ck = Checkpoint::open(checkpoint)?;
    let Some(config) = ck.attachment(CONFIG_FILE) else {
        anyhow::bail!(
            "{}: not a checkpoint of a `wick fit --model` run (it holds no {CONFIG_FILE}); \
             `wick consolidate` writes any checkpoint's parameters",
            ck.dir().display()
        )
    };
    let lora = lora_of(&ck)?;
    match (&lora, form) {
        (Some(_), ExportForm::Whole) => anyhow::bail!(
            "{}: a LoRA checkpoint holds adapters only; export --adapter writes them as PEFT \
             does, --merge writes them merged into the base model",
            ck.dir().display()
        ),
        (None, ExportForm::Adapter | ExportForm::Merged) => anyhow::bail!(
            "{}: not a checkpoint of a LoRA run (it holds no {ADAPTER_CONFIG_FILE}); export it \
             without --adapter or --merge",
            ck.dir().display()
        ),
        _ => Ok(Exportable { ck, config, lora }),
    }
}

/// Writes the directory `out` (built under a temporary name, renamed at the end) and
/// returns the files written.
pub fn run(checkpoint: &Path, out: &Path, form: ExportForm) -> anyhow::Result<Vec<PathBuf>> {
    let Exportable { ck, config, lora } = open_for(checkpoint, form)?;
    into_new_dir(out, |tmp| write_dir(&ck, &config, lora, form, tmp))
}

/// Writes a new directory `out` by `write` (into a temporary one, renamed when it is
/// whole), refused where `out` holds files; returns the paths of the files `write` names.
pub(crate) fn into_new_dir(
    out: &Path,
    write: impl FnOnce(&Path) -> anyhow::Result<Vec<&'static str>>,
) -> anyhow::Result<Vec<PathBuf>> {
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
    let names = write(&tmp)?;
    if out.exists() {
        std::fs::remove_dir(out)?;
    }
    std::fs::rename(&tmp, out)?;
    Ok(names.into_iter().map(|n| out.join(n)).collect())
}

/// Writes checkpoint `ck` (of `config`, a LoRA run's where `lora` says) into `tmp` as
/// `form`; returns the names of the files written.
fn write_dir(
    ck: &Checkpoint,
    config: &Path,
    lora: Option<(LoraConfig, PathBuf)>,
    form: ExportForm,
    tmp: &Path,
) -> anyhow::Result<Vec<&'static str>> {
    let mut names = Vec::new();
    if form != ExportForm::Adapter {
        names.extend(write_side_files(ck, tmp)?);
    }
    let mut copy = |attachment: Option<PathBuf>, name: &'static str| -> anyhow::Result<()> {
        if let Some(from) = attachment {
            std::fs::copy(&from, tmp.join(name))?;
            names.push(name);
        }
        Ok(())
    };
    match (lora, form) {
        (Some((lora, _)), ExportForm::Adapter) => {
            copy(ck.attachment(ADAPTER_CONFIG_FILE), ADAPTER_CONFIG_FILE)?;
            let adapters = read_adapters(ck, &lora, config)?;
            let renamed = adapters
                .into_iter()
                .map(|(n, t)| (format!("{PEFT_PREFIX}{n}"), t))
                .collect();
            save(&renamed, &tmp.join(ADAPTER_WEIGHTS_FILE))?;
            names.push(ADAPTER_WEIGHTS_FILE);
        }
        (Some((lora, base)), _) => {
            copy(Some(config.to_path_buf()), CONFIG_FILE)?;
            copy(ck.attachment(TOKENIZER_FILE), TOKENIZER_FILE)?;
            let merged = merge(ck, &lora, &base, config)?;
            save(&merged, &tmp.join("model.safetensors"))?;
            names.push("model.safetensors");
        }
        (None, _) => {
            copy(Some(config.to_path_buf()), CONFIG_FILE)?;
            copy(ck.attachment(TOKENIZER_FILE), TOKENIZER_FILE)?;
            wick_trainer::consolidate(ck.dir(), tmp.join("model.safetensors"), false)?;
            names.push("model.safetensors");
        }
    }
    Ok(names)
}

/// Every parameter of checkpoint `ck` (of a model of `config`), whole.
pub(crate) fn whole(
    ck: &Checkpoint,
    config: &ModelConfig,
) -> anyhow::Result<HashMap<String, Tensor>> {
    let weights = Checkpoint::open(ck.dir())?.into_weights();
    all_of(weights.as_ref(), config)
}

/// Every parameter of a model of `config`, whole, from `weights`.
pub(crate) fn all_of(
    weights: &dyn WeightSource,
    config: &ModelConfig,
) -> anyhow::Result<HashMap<String, Tensor>> {
    config
        .parameter_shapes()
        .into_iter()
        .map(|(name, shape)| Ok((name.clone(), read(weights, &name, &shape)?)))
        .collect()
}

/// A whole tensor of `shape` read from `weights`.
pub(crate) fn read(
    weights: &dyn WeightSource,
    name: &str,
    shape: &[usize],
) -> anyhow::Result<Tensor> {
    let shape = Shape::from(shape.to_vec());
    let values = weights.read(name, &shape, 0..shape.elem_count())?;
    Ok(Tensor::from_vec(values, shape, &Device::Cpu)?)
}

/// The adapters a LoRA checkpoint holds, by wick's names (those of its manifest).
pub(crate) fn read_adapters(
    ck: &Checkpoint,
    lora: &LoraConfig,
    config: &Path,
) -> anyhow::Result<HashMap<String, Tensor>> {
    let shapes: Vec<(String, Vec<usize>)> = ck
        .parameters()
        .map(|(n, s)| (n.to_string(), s.to_vec()))
        .collect();
    let mut expected = lora.adapter_shapes(&ModelConfig::from_file(config)?);
    let mut held = shapes.clone();
    expected.sort();
    held.sort();
    anyhow::ensure!(
        held == expected,
        "{}: holds {} parameters, not the {} adapters its {ADAPTER_CONFIG_FILE} describes",
        ck.dir().display(),
        shapes.len(),
        expected.len()
    );
    // The checkpoint opened above serves the whole tensors (no second open and check).
    shapes
        .into_iter()
        .map(|(name, dims)| {
            let shape = Shape::from(dims);
            let n = shape.elem_count();
            let flat = ck.read(PARAM_KIND, &[(name.clone(), shape.clone())], 0..n)?;
            Ok((name, flat.reshape(shape)?))
        })
        .collect()
}

/// Every base parameter of `config`'s model from `base`, each adapted weight replaced by
/// W + (alpha / r) B A, in f32.
pub(crate) fn merge(
    ck: &Checkpoint,
    lora: &LoraConfig,
    base: &Path,
    config: &Path,
) -> anyhow::Result<HashMap<String, Tensor>> {
    let adapters = read_adapters(ck, lora, config)?;
    let base_model = wick_models::CausalLm::from_pretrained(base)
        .with_context(|| format!("the base model of {}", ck.dir().display()))?;
    let weights = base_model
        .weights()
        .context("a pretrained model has weights")?;
    // A QLoRA run trained over its base's decoded values: merged into those (a base kept
    // as read is already read as its blocks decode).
    let record = crate::hf_model::quantized_base_of(ck)?;
    let quantized = match record.map(|r| (r.form, r.embeddings)) {
        Some((wick_models::QuantizedBase::In(format), embeddings)) => Some((format, embeddings)),
        Some((wick_models::QuantizedBase::AsRead, _)) | None => None,
    };
    let mut out = HashMap::new();
    for (name, shape) in base_model.config().parameter_shapes() {
        let mut w = read(weights.as_ref(), &name, &shape)?;
        let quantized = quantized.filter(|&(_, e)| wick_models::is_quantized_weight(&name, e));
        if let Some((q, _)) = quantized {
            let values = q.round_trip(&w.flatten_all()?.to_vec1()?)?;
            w = Tensor::from_vec(values, w.shape(), w.device())?;
        }
        let layer = name.strip_suffix(".weight").unwrap_or(&name);
        let (a, b) = (
            adapters.get(&format!("{layer}.lora_A.weight")),
            adapters.get(&format!("{layer}.lora_B.weight")),
        );
        if let (Some(a), Some(b)) = (a, b) {
            w = (w + b.matmul(a)?.affine(lora.scale(), 0.0)?)?;
        }
        out.insert(name, w);
    }
    Ok(out)
}

/// `tensors` as one safetensors file, as `transformers` and PEFT write theirs.
fn save(tensors: &HashMap<String, Tensor>, path: &Path) -> anyhow::Result<()> {
    candle_core::safetensors::save(tensors, path)
        .with_context(|| format!("writing {}", path.display()))
}
