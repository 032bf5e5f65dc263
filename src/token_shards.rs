//! `prepare`'s output: one token file, or, with `--tokens-per-file N`, a directory of token
//! files of about N tokens each (whole documents each, so a file can run past N by its last
//! document), each a token file of its own with its own held-out part; `fit --data DIR`
//! takes them as one corpus.

use std::path::{Path, PathBuf};
use wick_trainer::{TokenFileWriter, TrainerError, Written};

/// The token files being written.
pub struct TokenShards {
    output: PathBuf,
    per_file: Option<usize>,
    vocab_size: usize,
    masked: bool,
    /// The file being written, and the ones finished.
    current: TokenFileWriter,
    finished: Vec<Written>,
    val_fraction: f64,
    tokenizer_hash: String,
    /// Documents come in preference pairs, which no file boundary splits.
    paired: bool,
}

impl TokenShards {
    /// Writers of `output` (a directory when `per_file` is given) for a tokenizer of
    /// `vocab_size` ids and the hash `tokenizer_hash`, each file's last `val_fraction` held
    /// out; `masked` for instruction data.
    pub fn create(
        output: &Path,
        per_file: Option<usize>,
        (vocab_size, tokenizer_hash): (usize, &str),
        (masked, val_fraction): (bool, f64),
    ) -> anyhow::Result<Self> {
        if per_file.is_some() {
            std::fs::create_dir_all(output)?;
        }
        let first = Self::path_of(output, per_file, 0);
        Ok(TokenShards {
            output: output.to_path_buf(),
            per_file,
            vocab_size,
            masked,
            current: TokenFileWriter::create(&first, vocab_size, masked)?,
            finished: Vec::new(),
            val_fraction,
            tokenizer_hash: tokenizer_hash.to_string(),
            paired: false,
        })
    }

    /// Marks the documents as preference pairs ([`TokenFileWriter::paired`]): a file ends
    /// only after a pair's second document.
    pub fn paired(mut self) -> Self {
        self.paired = true;
        self.current = self.current.paired();
        self
    }

    /// Whether the documents are preference pairs.
    pub fn is_paired(&self) -> bool {
        self.paired
    }

    /// File `i`'s path: `output` itself, or `output/tokens-{i:05}.safetensors`.
    fn path_of(output: &Path, per_file: Option<usize>, i: usize) -> PathBuf {
        match per_file {
            Some(_) => output.join(format!("tokens-{i:05}.safetensors")),
            None => output.to_path_buf(),
        }
    }

    /// Starts a document, in the next file when this one holds its share.
    pub fn push(&mut self, ids: &[u32], counted: Option<&[bool]>) -> Result<(), TrainerError> {
        let between_pairs = !self.paired || self.current.documents().is_multiple_of(2);
        if between_pairs && self.per_file.is_some_and(|n| self.current.tokens() >= n) {
            let next = Self::path_of(&self.output, self.per_file, self.finished.len() + 1);
            let mut next = TokenFileWriter::create(&next, self.vocab_size, self.masked)?;
            if self.paired {
                next = next.paired();
            }
            let done = std::mem::replace(&mut self.current, next);
            self.finished
                .push(done.finish(self.val_fraction, &self.tokenizer_hash)?);
        }
        self.current.push(ids, counted)
    }

    /// Appends to the last document.
    pub fn append(&mut self, ids: &[u32], counted: Option<&[bool]>) -> Result<(), TrainerError> {
        self.current.append(ids, counted)
    }

    /// Tokens of every file so far.
    pub fn tokens(&self) -> usize {
        let done: usize = self.finished.iter().map(|w| w.train + w.val).sum();
        done + self.current.tokens()
    }

    /// Writes the last file; what all of them hold, and how many there are.
    pub fn finish(mut self) -> Result<(Written, usize), TrainerError> {
        let last = self
            .current
            .finish(self.val_fraction, &self.tokenizer_hash)?;
        self.finished.push(last);
        let sum = |f: fn(&Written) -> usize| self.finished.iter().map(f).sum();
        let counted = (self.finished.iter())
            .map(|w| w.counted)
            .sum::<Option<usize>>();
        let all = Written {
            train: sum(|w| w.train),
            val: sum(|w| w.val),
            documents: sum(|w| w.documents),
            counted,
        };
        Ok((all, self.finished.len()))
    }
}
