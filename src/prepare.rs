//! `wick prepare --tokenizer T --output TOKENS TEXT...`: text files tokenized once into the
//! token file `wick fit --model` trains on. Each file is a document; documents are joined by
//! the tokenizer's end-of-text token where it has one. The last `--val-fraction` of the
//! tokens is held out for validation.

use crate::cli::PrepareArgs;
use anyhow::Context;
use std::io::IsTerminal;
use wick_models::TextTokenizer;

/// Writes the token file and says what it holds.
pub fn run(args: &PrepareArgs) -> anyhow::Result<String> {
    anyhow::ensure!(
        (0.0..1.0).contains(&args.val_fraction),
        "--val-fraction must be at least 0 and below 1, got {}",
        args.val_fraction
    );
    let tokenizer = TextTokenizer::from_file(&args.tokenizer)?;
    let end = tokenizer.end_of_text();
    let bar = (!args.no_progress && std::io::stdout().is_terminal())
        .then(|| indicatif::ProgressBar::new(args.texts.len() as u64));
    let mut ids = Vec::new();
    for (i, path) in args.texts.iter().enumerate() {
        let text =
            std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
        if i > 0 {
            ids.extend(end);
        }
        ids.extend(tokenizer.encode(&text)?);
        if let Some(bar) = &bar {
            bar.inc(1);
        }
    }
    if let Some(bar) = bar {
        bar.finish_and_clear();
    }
    anyhow::ensure!(!ids.is_empty(), "the texts hold no tokens");
    let val = (ids.len() as f64 * args.val_fraction).round() as usize;
    let (train, held_out) = ids.split_at(ids.len() - val);
    let hash = tokenizer.hash();
    wick_trainer::write_token_file(&args.output, train, held_out, &hash, tokenizer.vocab_size())?;
    Ok(format!(
        "wrote {}: {} training and {} validation tokens of {} document(s), tokenizer {} ({} ids)",
        args.output.display(),
        train.len(),
        held_out.len(),
        args.texts.len(),
        &hash[..12],
        tokenizer.vocab_size()
    ))
}
