//! `wick fit --model`: fine-tune a Hugging Face model directory, or pre-train a new model of
//! a `config.json`, on the token file `wick prepare` wrote, with every option of the main
//! job. Its checkpoints carry the model's `config.json` and `tokenizer.json` (and the
//! tokenizer's options, chat template and generation defaults where the model has them), so
//! that `validate`, `sample` and `export` need nothing else; under `--lora-rank` they hold the
//! adapters only, with PEFT's `adapter_config.json` naming the base model's directory.

use crate::cli::{FitArgs, PackingArg};
use crate::program_trainer::{FitReport, ProgramTrainer};
use anyhow::Context;
use std::path::{Path, PathBuf};
use wick_core::OptimizerConfig;
use wick_models::{
    CausalLm, LoraConfig, QuantizedBaseRecord, TextTokenizer, ADAPTER_CONFIG_FILE,
    QUANTIZED_BASE_FILE,
};
use wick_trainer::{
    Checkpoint, DataLoader, Dataset, ModelCheckpoint, Packing, Split, TokenDataset,
};

use crate::hf_files::{CONFIG_FILE, TOKENIZER_FILE};

/// Whether `--model` names a pretrained model (a Hugging Face directory or a GGUF file),
/// not the `config.json` of a new one.
pub fn is_pretrained(model: &Path) -> bool {
    model.is_dir() || wick_models::is_gguf(model)
}

/// The model `--model` names: a Hugging Face directory or a GGUF file (its own tokenizer,
/// unless `tokenizer` replaces it), or a `config.json` for a new model (`tokenizer`
/// required).
pub fn load_model(model: &Path, tokenizer: Option<&Path>) -> anyhow::Result<CausalLm> {
    let lm = match is_pretrained(model) {
        true => CausalLm::from_pretrained(model)?,
        false => CausalLm::from_config(model)?,
    };
    let lm = match tokenizer {
        Some(path) => lm.with_tokenizer(Some(TextTokenizer::from_file(path)?)),
        None => lm,
    };
    anyhow::ensure!(
        lm.tokenizer().is_some(),
        "{}: no tokenizer; pass --tokenizer, the one `wick prepare` tokenized the data with",
        model.display()
    );
    Ok(lm)
}

/// The model a checkpoint of a `fit --model` run holds (its config and tokenizer from the
/// checkpoint, its parameters read from the checkpoint's files), or `None` for a checkpoint
/// of the character model. A LoRA run's checkpoint holds the adapters only: the base
/// weights are read from the model directory its `adapter_config.json` names.
pub fn from_checkpoint(checkpoint: Checkpoint) -> anyhow::Result<Option<CausalLm>> {
    let Some(config) = checkpoint.attachment(CONFIG_FILE) else {
        return Ok(None);
    };
    let tokenizer = checkpoint
        .attachment(TOKENIZER_FILE)
        .map(TextTokenizer::from_file)
        .transpose()?;
    let Some((lora, base)) = lora_of(&checkpoint)? else {
        let lm = CausalLm::from_config(&config)?
            .with_tokenizer(tokenizer)
            .with_weights(checkpoint.into_weights());
        return Ok(Some(lm));
    };
    let lm = CausalLm::from_pretrained(&base)
        .with_context(|| {
            format!(
                "the base model of LoRA checkpoint {}",
                checkpoint.dir().display()
            )
        })?
        .with_tokenizer(tokenizer);
    let quantized = quantized_base_of(&checkpoint)?;
    let lm = lm.with_adapters(lora, checkpoint.into_weights())?;
    Ok(Some(match quantized {
        Some(QuantizedBaseRecord { form, embeddings }) => {
            let lm = lm.with_quantized_base(form)?;
            match embeddings {
                true => lm.with_quantized_embeddings()?,
                false => lm,
            }
        }
        None => lm,
    }))
}

/// The form a QLoRA run's checkpoint kept its base in, if it is one, and whether its
/// embeddings too.
pub fn quantized_base_of(checkpoint: &Checkpoint) -> anyhow::Result<Option<QuantizedBaseRecord>> {
    let Some(path) = checkpoint.attachment(QUANTIZED_BASE_FILE) else {
        return Ok(None);
    };
    let text = std::fs::read_to_string(&path)?;
    let form = text.trim().parse().map_err(anyhow::Error::msg);
    Ok(Some(form.with_context(|| path.display().to_string())?))
}

/// The LoRA options of a checkpoint of a LoRA run, and its base model's directory.
pub fn lora_of(checkpoint: &Checkpoint) -> anyhow::Result<Option<(LoraConfig, PathBuf)>> {
    let Some(path) = checkpoint.attachment(ADAPTER_CONFIG_FILE) else {
        return Ok(None);
    };
    let text = std::fs::read_to_string(&path)?;
    let (lora, base) = LoraConfig::from_peft_json(&text, &path)?;
    let base = base.with_context(|| format!("{}: no base_model_name_or_path", path.display()))?;
    Ok(Some((lora, base.into())))
}

/// The token files `data` names: itself, the `*.safetensors` of a directory (in name
/// order), or a comma-separated list.
fn token_files(data: &Path) -> anyhow::Result<Vec<PathBuf>> {
    if data.is_dir() {
        let mut files: Vec<PathBuf> = std::fs::read_dir(data)
            .with_context(|| format!("reading {}", data.display()))?
            .map(|e| e.map(|e| e.path()))
            .collect::<std::io::Result<_>>()?;
        files.retain(|f| f.extension().is_some_and(|e| e == "safetensors"));
        files.sort();
        anyhow::ensure!(
            !files.is_empty(),
            "{}: no *.safetensors token files",
            data.display()
        );
        return Ok(files);
    }
    let text = data.to_string_lossy();
    match data.exists() || !text.contains(',') {
        true => Ok(vec![data.to_path_buf()]),
        false => Ok(text.split(',').map(PathBuf::from).collect()),
    }
}

/// Split `split` of the token file(s) `data` in windows of `seq`, packed as `packing` says
/// (`None`: the data's default), checked against `lm`'s tokenizer and vocabulary.
pub fn tokens(
    lm: &CausalLm,
    data: &Path,
    split: Split,
    (seq, packing): (usize, Option<PackingArg>),
) -> anyhow::Result<TokenDataset> {
    let max = lm.config().max_positions();
    anyhow::ensure!(
        seq <= max,
        "--seq {seq} is longer than the model's {max} positions"
    );
    let files = token_files(data)?;
    let set = TokenDataset::open_files(&files, split, seq, packing.map(Into::into))?;
    anyhow::ensure!(
        !set.is_paired(),
        "{} holds preference pairs (prompt, chosen, rejected): tune on it with \
         --objective dpo or ipo",
        set.path().display()
    );
    if set.packing() != Packing::Concat {
        let (used, all) = set.fill();
        log::info!(
            "{} split: windows of {seq} packed as {}: {} windows, {:.1}% padding",
            split.name(),
            set.packing().name(),
            set.len(),
            100.0 * (all - used) as f64 / all as f64
        );
    }
    if set.truncated() > 0 {
        log::warn!(
            "{}: {} of the {} split's examples are longer than --seq {seq} and were cut to it",
            data.display(),
            set.truncated(),
            split.name()
        );
    }
    let tokenizer = lm.tokenizer().context("the model has no tokenizer")?;
    set.check(&tokenizer.hash(), lm.config().vocab_size())?;
    Ok(set)
}

/// Trains the model `model` names as `args` says.
pub fn run(args: &FitArgs, model: &Path) -> anyhow::Result<FitReport> {
    let data = args
        .data
        .as_deref()
        .context("--model needs --data TOKENS, a token file that `wick prepare` wrote")?;
    let optimizer = OptimizerConfig::adamw(args.lr).with_schedule(args.lr_schedule());
    let mut lm = load_model(model, args.tokenizer.as_deref())?.with_optimizer(optimizer);
    if let Some(lora) = args.lora() {
        anyhow::ensure!(
            is_pretrained(model),
            "--lora-rank fine-tunes a pretrained model (a directory or a GGUF file); {} is a \
             config.json",
            model.display()
        );
        lm = lm.with_lora(lora)?;
    }
    if let Some(quantization) = args.quantize_base().map_err(anyhow::Error::msg)? {
        lm = lm.with_quantized_base(quantization)?;
        if args.quantize_embeddings {
            lm = lm.with_quantized_embeddings()?;
        }
    }
    let tokenizer = lm.tokenizer().context("the model has no tokenizer")?;
    let mut checkpoints = ModelCheckpoint::new(&args.checkpoint_dir)
        .with_attachment(CONFIG_FILE, lm.config_json().as_bytes().to_vec())
        .with_attachment(TOKENIZER_FILE, tokenizer.json().as_bytes().to_vec());
    for (name, bytes) in crate::hf_files::read_side_files(model, args.tokenizer.as_deref())? {
        checkpoints = checkpoints.with_attachment(name, bytes);
    }
    if let Some(lora) = lm.lora() {
        // The checkpoint holds the adapters; the base weights stay where they are.
        let base = std::fs::canonicalize(model)?;
        let adapter_config = lora.to_peft_json(&base.to_string_lossy());
        checkpoints = checkpoints.with_attachment(ADAPTER_CONFIG_FILE, adapter_config.into_bytes());
    }
    if let Some(form) = lm.quantized_base() {
        let embeddings = lm.quantized_embeddings();
        let record = QuantizedBaseRecord { form, embeddings }.to_string();
        checkpoints = checkpoints.with_attachment(QUANTIZED_BASE_FILE, record.into_bytes());
    }
    if args.objective.preference_loss().is_some() {
        let files = token_files(data)?;
        return crate::preference_fit::run(args, (model, lm), &files, checkpoints);
    }
    let train = tokens(&lm, data, Split::Train, (args.seq, args.packing))?;
    let val = tokens(&lm, data, Split::Val, (args.seq, args.packing))?;
    let (train, val) = (
        DataLoader::new(train, args.batch_size),
        DataLoader::new(val, args.batch_size).without_shuffle(),
    );
    ProgramTrainer::new(args, checkpoints)?.fit(args, lm, &train, &val)
}
