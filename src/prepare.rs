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
    let (Tokens { ids, starts }, counted) = match args.format {
        DataFormat::Text => (texts(&tokenizer, &args.texts, tick)?, None),
        DataFormat::Jsonl => {
            let (tokens, counted) = jsonl(&tokenizer, args, tick)?;
            (tokens, Some(counted))
        }
    };
    let documents = starts.len();
    if let Some(bar) = bar {
        bar.finish_and_clear();
    }
    anyhow::ensure!(!ids.is_empty(), "the texts hold no tokens");
    let (cut, [train_starts, val_starts]) =
        split_at(&ids, &starts, args.val_fraction, counted.is_some());
    let split = |range: std::ops::Range<usize>, starts| wick_trainer::TokenSplit {
        ids: &ids[range.clone()],
        counted: counted.as_deref().map(|c| &c[range]),
        starts: Some(starts),
    };
    let hash = tokenizer.hash();
    let (train, held_out) = (
        split(0..cut, &train_starts),
        split(cut..ids.len(), &val_starts),
    );
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

/// Where the training tokens end, the last `val_fraction` of `ids` held out (from the start
/// of a document where one starts after that, for `whole` documents on each side), and each
/// side's starts from its own first token (a document cut in two starts again at the cut).
fn split_at(ids: &[u32], starts: &[u64], val_fraction: f64, whole: bool) -> (usize, [Vec<u64>; 2]) {
    let val = (ids.len() as f64 * val_fraction).round() as usize;
    let mut cut = ids.len() - val;
    if whole && cut < ids.len() {
        cut = (starts.iter().map(|&s| s as usize))
            .find(|&s| s >= cut)
            .unwrap_or(cut);
    }
    let train = starts
        .iter()
        .copied()
        .filter(|&s| (s as usize) < cut)
        .collect();
    let cut_in_two = cut < ids.len() && starts.binary_search(&(cut as u64)).is_err();
    let val = (cut_in_two.then_some(0).into_iter())
        .chain(
            starts
                .iter()
                .filter(|&&s| s as usize >= cut)
                .map(|&s| s - cut as u64),
        )
        .collect();
    (cut, [train, val])
}

/// Token ids of documents one after another, and where each starts.
#[derive(Default)]
struct Tokens {
    ids: Vec<u32>,
    starts: Vec<u64>,
}

impl Tokens {
    /// Appends a document.
    fn push(&mut self, ids: impl IntoIterator<Item = u32>) {
        self.starts.push(self.ids.len() as u64);
        self.ids.extend(ids);
    }
}

/// Text files, one document each, joined by the end-of-text token (the end of the
/// document before it).
fn texts(
    tokenizer: &TextTokenizer,
    paths: &[std::path::PathBuf],
    tick: impl Fn(),
) -> anyhow::Result<Tokens> {
    let end = tokenizer.end_of_text();
    let mut tokens = Tokens::default();
    for (i, path) in paths.iter().enumerate() {
        let text =
            std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
        if i > 0 {
            tokens.ids.extend(end);
        }
        tokens.push(tokenizer.encode(&text)?);
        tick();
    }
    Ok(tokens)
}

/// JSON Lines or Parquet of examples: their ids one after another, and whether each counts.
fn jsonl(
    tokenizer: &TextTokenizer,
    args: &PrepareArgs,
    tick: impl Fn(),
) -> anyhow::Result<(Tokens, Vec<bool>)> {
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
    let (mut tokens, mut counted) = (Tokens::default(), Vec::new());
    for &(f, r) in &order {
        let row = &files[f][r];
        let at = |e: String| anyhow::anyhow!("{}: {e}", row.at);
        let example = Example::from_value(&row.value, schema).map_err(at)?;
        let (more, flags) = example
            .encode(tokenizer, template.as_ref(), eos)
            .map_err(at)?;
        tokens.push(more);
        counted.extend(flags);
        if r + 1 == files[f].len() {
            tick();
        }
    }
    Ok((tokens, counted))
}

#[cfg(test)]
mod tests {
    use super::split_at;

    #[test]
    fn the_held_out_tokens_start_at_an_example_and_each_side_counts_its_own_starts() {
        let ids = [0u32; 10];
        let starts = [0, 4, 7];
        // Examples: the cut moves to the next example's start, none is split.
        assert_eq!(
            split_at(&ids, &starts, 0.4, true),
            (7, [vec![0, 4], vec![0]])
        );
        // No example starts after the cut: the last one is cut in two.
        assert_eq!(
            split_at(&ids, &starts, 0.2, true),
            (8, [vec![0, 4, 7], vec![0]])
        );
        // Plain text is cut where the fraction falls; the second half starts again at 0.
        assert_eq!(
            split_at(&ids, &starts, 0.5, false),
            (5, [vec![0, 4], vec![0, 2]])
        );
        assert_eq!(
            split_at(&ids, &starts, 0.0, true),
            (10, [vec![0, 4, 7], vec![]])
        );
    }
}
