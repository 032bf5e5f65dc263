//! `wick prepare --tokenizer T --output TOKENS TEXT...`: text files tokenized once into the
//! token file `wick fit --model` trains on. Each file is a document; documents are joined by
//! the tokenizer's end-of-text token where it has one. The last `--val-fraction` of the
//! tokens is held out for validation.
//!
//! `--format jsonl` reads instruction data instead: each row of a JSON Lines or Parquet file
//! an example (`wick_models::Example`, in the `--schema` named or found from its columns),
//! tokenized with the mask of the targets the loss counts, examples packed one after
//! another, each closed by the end-of-text token; `--mix` interleaves the files by weights.
//! A bad row (not JSON, missing keys, a template that fails) is an error naming the file and
//! line or row, and nothing is written.

use crate::cli::{DataFormat, PrepareArgs};
use crate::example_files;
use anyhow::Context;
use std::io::IsTerminal;
use wick_models::{ChatTemplate, Example, TextTokenizer};

/// Writes the token file and says what it holds.
pub fn run(args: &PrepareArgs) -> anyhow::Result<String> {
    anyhow::ensure!(
        (0.0..1.0).contains(&args.val_fraction),
        "--val-fraction must be at least 0 and below 1, got {}",
        args.val_fraction
    );
    anyhow::ensure!(
        args.mix.is_none() || args.format == DataFormat::Jsonl,
        "--mix interleaves examples: it needs --format jsonl (JSON Lines or Parquet)"
    );
    let tokenizer = TextTokenizer::from_file(&args.tokenizer)?;
    let bar = (!args.no_progress && std::io::stdout().is_terminal())
        .then(|| indicatif::ProgressBar::new(args.texts.len() as u64));
    let tick = || {
        if let Some(bar) = &bar {
            bar.inc(1);
        }
    };
    let (ids, counted, documents) = match args.format {
        DataFormat::Text => (
            texts(&tokenizer, &args.texts, tick)?,
            None,
            args.texts.len(),
        ),
        DataFormat::Jsonl => {
            let (ids, counted, examples) = jsonl(&tokenizer, args, tick)?;
            (ids, Some(counted), examples)
        }
    };
    if let Some(bar) = bar {
        bar.finish_and_clear();
    }
    anyhow::ensure!(!ids.is_empty(), "the texts hold no tokens");
    let val = (ids.len() as f64 * args.val_fraction).round() as usize;
    let cut = ids.len() - val;
    let split = |range: std::ops::Range<usize>| wick_trainer::TokenSplit {
        ids: &ids[range.clone()],
        counted: counted.as_deref().map(|c| &c[range]),
    };
    let hash = tokenizer.hash();
    let (train, held_out) = (split(0..cut), split(cut..ids.len()));
    wick_trainer::write_token_file(&args.output, train, held_out, &hash, tokenizer.vocab_size())?;
    let counted_note = match &counted {
        Some(c) => format!(
            ", {} of them counted by the loss",
            c.iter().filter(|&&b| b).count()
        ),
        None => String::new(),
    };
    Ok(format!(
        "wrote {}: {} training and {} validation tokens of {documents} {}{counted_note}, \
         tokenizer {} ({} ids)",
        args.output.display(),
        train.ids.len(),
        held_out.ids.len(),
        match args.format {
            DataFormat::Text => "document(s)",
            DataFormat::Jsonl => "example(s)",
        },
        &hash[..12],
        tokenizer.vocab_size()
    ))
}

/// Text files, one document each, joined by the end-of-text token.
fn texts(
    tokenizer: &TextTokenizer,
    paths: &[std::path::PathBuf],
    tick: impl Fn(),
) -> anyhow::Result<Vec<u32>> {
    let end = tokenizer.end_of_text();
    let mut ids = Vec::new();
    for (i, path) in paths.iter().enumerate() {
        let text =
            std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
        if i > 0 {
            ids.extend(end);
        }
        ids.extend(tokenizer.encode(&text)?);
        tick();
    }
    Ok(ids)
}

/// JSON Lines of examples: their ids one after another, whether each counts, how many.
fn jsonl(
    tokenizer: &TextTokenizer,
    args: &PrepareArgs,
    tick: impl Fn(),
) -> anyhow::Result<(Vec<u32>, Vec<bool>, usize)> {
    let template = match &args.chat_template {
        Some(path) => Some(ChatTemplate::from_file(path)?),
        None => {
            let files = crate::hf_files::read_side_files(&args.tokenizer, None)?;
            crate::hf_files::chat_template(&files, &args.tokenizer)?
        }
    };
    let eos = template
        .as_ref()
        .and_then(ChatTemplate::eos_token)
        .and_then(|t| tokenizer.token_to_id(t))
        .or(tokenizer.end_of_text());
    let files = args
        .texts
        .iter()
        .map(|path| example_files::rows(path))
        .collect::<anyhow::Result<Vec<_>>>()?;
    let order: Vec<(usize, usize)> = match &args.mix {
        Some(weights) => {
            anyhow::ensure!(
                weights.len() == files.len()
                    && weights.iter().all(|w| w.is_finite() && *w >= 0.0)
                    && weights.iter().sum::<f64>() > 0.0,
                "--mix takes a weight of at least 0 for each of the {} files, not all 0; got {weights:?}",
                files.len()
            );
            let lens: Vec<usize> = files.iter().map(Vec::len).collect();
            example_files::interleaved(&lens, weights, args.seed)
        }
        None => (files.iter().enumerate())
            .flat_map(|(f, rows)| (0..rows.len()).map(move |r| (f, r)))
            .collect(),
    };
    let schema = args.schema.into();
    let (mut ids, mut counted) = (Vec::new(), Vec::new());
    for &(f, r) in &order {
        let row = &files[f][r];
        let at = |e: String| anyhow::anyhow!("{}: {e}", row.at);
        let example = Example::from_value(&row.value, schema).map_err(at)?;
        let (more, flags) = example
            .encode(tokenizer, template.as_ref(), eos)
            .map_err(at)?;
        ids.extend(more);
        counted.extend(flags);
        if r + 1 == files[f].len() {
            tick();
        }
    }
    Ok((ids, counted, order.len()))
}
