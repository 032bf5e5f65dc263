//! `wick prepare --tokenizer T --output TOKENS TEXT...`: text files tokenized once into the
//! token file `wick fit --model` trains on. Each file is a document; documents are joined by
//! the tokenizer's end-of-text token where it has one. The last `--val-fraction` of the
//! tokens is held out for validation (from the start of an example, for instruction data).
//! The file records where each document starts, so that `fit --packing documents` can keep
//! each to itself.
//!
//! `--format jsonl` reads instruction data instead: each row of a JSON Lines or Parquet file
//! an example (`wick_models::Example`, in the `--schema` named or found from its columns),
//! tokenized with the mask of the targets the loss counts, examples packed one after
//! another, each closed by the end-of-text token; `--mix` interleaves the files by weights.
//! A bad row (not JSON, missing keys, a template that fails) is an error naming the file and
//! line or row, and nothing is written.
//!
//! Rows of preference pairs (`prompt`/`chosen`/`rejected`, `--schema preference` or found
//! from the first row's columns) make a preference token file: two documents per row, the
//! prompt with its chosen completion then with its rejected one, for `fit --objective dpo`.

use crate::cli::{DataFormat, PrepareArgs};
use crate::example_files;
use crate::token_shards::TokenShards;
use anyhow::Context;
use rayon::prelude::*;
use std::io::{BufRead, IsTerminal};
use wick_models::{ChatTemplate, Document, Example, Schema, TextTokenizer};

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
    let masked = args.format == DataFormat::Jsonl;
    let paired = masked && holds_pairs(args)?;
    let hash = tokenizer.hash();
    let mut writer = TokenShards::create(
        &args.output,
        args.tokens_per_file,
        (tokenizer.vocab_size(), &hash),
        (masked, args.val_fraction),
    )?;
    if paired {
        writer = writer.paired();
    }
    match args.format {
        DataFormat::Text => texts(&tokenizer, &args.texts, &mut writer, tick)?,
        DataFormat::Jsonl => jsonl(&tokenizer, args, &mut writer, tick)?,
    }
    if let Some(bar) = bar {
        bar.finish_and_clear();
    }
    anyhow::ensure!(writer.tokens() > 0, "the texts hold no tokens");
    let (written, files) = writer.finish()?;
    let counted_note = match written.counted {
        Some(c) => format!(", {c} of them counted by the loss"),
        None => String::new(),
    };
    Ok(format!(
        "wrote {}{}: {} training and {} validation tokens of {} {}{counted_note}, \
         tokenizer {} ({} ids)",
        args.output.display(),
        match args.tokens_per_file {
            Some(_) => format!(" ({files} token files)"),
            None => String::new(),
        },
        written.train,
        written.val,
        written.documents,
        match (args.format, paired) {
            (DataFormat::Text, _) => "document(s)",
            (DataFormat::Jsonl, false) => "example(s)",
            (DataFormat::Jsonl, true) => "documents (two per preference pair)",
        },
        &hash[..12],
        tokenizer.vocab_size()
    ))
}

/// Bytes of text tokenized at a time: a text file is read a block of whole lines at a
/// time, the blocks tokenized in parallel, so that memory does not grow with the file (a
/// file up to this size is tokenized whole; a longer one is, where a tokenizer's
/// pre-tokenization spans a line break, tokenized as its blocks would be).
const TEXT_BLOCK: usize = 1 << 20;

/// Rows of examples tokenized at a time, in parallel.
const ROWS_AT_A_TIME: usize = 1024;

/// Text files, one document each, joined by the end-of-text token (the end of the
/// document before it).
fn texts(
    tokenizer: &TextTokenizer,
    paths: &[std::path::PathBuf],
    writer: &mut TokenShards,
    tick: impl Fn(),
) -> anyhow::Result<()> {
    let end = tokenizer.end_of_text();
    for (i, path) in paths.iter().enumerate() {
        let reading = || format!("reading {}", path.display());
        let mut file = std::io::BufReader::new(std::fs::File::open(path).with_context(reading)?);
        if i > 0 {
            writer.append(&Vec::from_iter(end), None)?;
        }
        let mut first = true;
        loop {
            // A few blocks, one per thread, tokenized together.
            let mut blocks = Vec::new();
            for _ in 0..rayon::current_num_threads() {
                let mut block = String::new();
                while block.len() < TEXT_BLOCK
                    && file.read_line(&mut block).with_context(reading)? > 0
                {}
                if block.is_empty() {
                    break;
                }
                blocks.push(block);
            }
            let ids = (blocks.par_iter())
                .map(|b| tokenizer.encode(b))
                .collect::<candle_core::Result<Vec<_>>>()?;
            for ids in &ids {
                match first {
                    true => writer.push(ids, None)?,
                    false => writer.append(ids, None)?,
                }
                first = false;
            }
            if blocks.len() < rayon::current_num_threads() {
                break;
            }
        }
        if first {
            writer.push(&[], None)?;
        }
        tick();
    }
    Ok(())
}

/// JSON Lines or Parquet of examples, each a document with the flags of the targets it
/// counts, read and tokenized a chunk of rows at a time (in parallel).
fn jsonl(
    tokenizer: &TextTokenizer,
    args: &PrepareArgs,
    writer: &mut TokenShards,
    tick: impl Fn(),
) -> anyhow::Result<()> {
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
    let mut files = args
        .texts
        .iter()
        .map(|path| example_files::rows(path))
        .collect::<anyhow::Result<Vec<_>>>()?;
    let lens: Vec<usize> = files.iter().map(|f| f.len).collect();
    let mut order: Box<dyn Iterator<Item = usize>> = match &args.mix {
        Some(weights) => {
            anyhow::ensure!(
                weights.len() == files.len()
                    && weights.iter().all(|w| w.is_finite() && *w >= 0.0)
                    && weights.iter().sum::<f64>() > 0.0,
                "--mix takes a weight of at least 0 for each of the {} files, not all 0; got {weights:?}",
                files.len()
            );
            Box::new(example_files::interleaved(&lens, weights, args.seed))
        }
        None => Box::new(
            (lens.clone().into_iter().enumerate()).flat_map(|(f, n)| std::iter::repeat_n(f, n)),
        ),
    };
    let schema = args.schema.into();
    let mut taken = vec![0; files.len()];
    loop {
        let mut rows = Vec::with_capacity(ROWS_AT_A_TIME);
        for f in order.by_ref().take(ROWS_AT_A_TIME) {
            let row = files[f]
                .next()
                .context("a file ended before its rows were counted")??;
            taken[f] += 1;
            if taken[f] == lens[f] {
                tick();
            }
            rows.push(row);
        }
        if rows.is_empty() {
            return Ok(());
        }
        let encoded: Vec<anyhow::Result<Vec<Document>>> = (rows.par_iter())
            .map(|row| {
                let at = |e: String| anyhow::anyhow!("{}: {e}", row.at);
                let example = Example::from_value(&row.value, schema).map_err(at)?;
                let template = template.as_ref();
                match (example, writer.is_paired()) {
                    (Example::Preference(pair), true) => {
                        Ok(pair.encode(tokenizer, template, eos).map_err(at)?.to_vec())
                    }
                    (Example::Preference(_), false) | (_, true) => Err(at(
                        "preference pairs and single examples do not mix in one token file".into(),
                    )),
                    (example, false) => Ok(vec![example
                        .encode(tokenizer, template, eos)
                        .map_err(at)?]),
                }
            })
            .collect();
        for documents in encoded {
            for (ids, flags) in documents? {
                writer.push(&ids, Some(&flags))?;
            }
        }
    }
}

/// Whether the rows are preference pairs: `--schema preference`, or, found from the
/// columns, the first file's first row has `chosen` and `rejected`.
fn holds_pairs(args: &PrepareArgs) -> anyhow::Result<bool> {
    Ok(match args.schema.into() {
        Schema::Preference => true,
        Schema::Auto => match args.texts.first() {
            Some(path) => {
                let first = example_files::rows(path)?.next().transpose()?;
                first.is_some_and(|row| {
                    matches!(
                        Example::from_value(&row.value, Schema::Auto),
                        Ok(Example::Preference(_))
                    )
                })
            }
            None => false,
        },
        _ => false,
    })
}
