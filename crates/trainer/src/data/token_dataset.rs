//! `TokenDataset`: token files (`wick prepare`, [`crate::write_token_file`]) served as
//! windows of `seq + 1` tokens: the model reads the first `seq` and predicts the last `seq`.
//! One file or several, taken as one corpus (a corpus prepared as several files); each
//! file's windows are its own, memory-mapped, so a corpus larger than memory trains in a
//! resident set that does not grow with it.
//!
//! A file of instruction data has a mask: a window's uncounted targets come out as
//! [`wick_core::IGNORE_INDEX`], `transformers`' -100 label. Where the file records where
//! each document starts, windows can hold whole documents, each kept to itself
//! ([`Packing`]).
//!
//! The file's metadata names the tokenizer that made it (`wick.tokenizer`, the SHA-256 of
//! its `tokenizer.json`) and its vocabulary size (`wick.vocab_size`), so that a file made by
//! another tokenizer, or with ids a model cannot embed, is refused before training.

use crate::checkpoint::CheckpointError;
use crate::data::packing::Packing;
use crate::data::split_file::{Rows, SplitFile};
use crate::data::token_file::Split;
use crate::{Dataset, TrainerError};
use candle_core::{Device, Tensor};
use std::path::Path;
use wick_core::{FileError, TokenBatch};

/// Windows of one split of one or several token files, as their [`Packing`] lays them:
/// under `Concat`, window i of a file is its tokens `i * seq .. i * seq + seq + 1` (every
/// token but the first a target exactly once); under `Documents` and `Padded`, whole
/// documents, each its own inputs and targets, positions restarting at each, the rest of
/// the window padding that is not counted. The files' windows follow one another, in the
/// order given. A [`DataLoader`](crate::DataLoader) orders the windows (seeded) and resumes
/// from a checkpoint's data position as for any dataset.
#[derive(Clone)]
pub struct TokenDataset {
    files: Vec<SplitFile>,
    /// The windows before each file's end.
    ends: Vec<usize>,
    seq: usize,
}

impl TokenDataset {
    /// Split `split` of the token file `path`, in windows of `seq + 1` tokens, packed as
    /// the data's convention has it: [`Packing::Documents`] for instruction data whose file
    /// records its examples' starts, [`Packing::Concat`] otherwise.
    pub fn open(path: impl AsRef<Path>, split: Split, seq: usize) -> Result<Self, TrainerError> {
        Self::open_with(path, split, seq, None)
    }

    /// [`TokenDataset::open`] with the packing given (`None`: the data's default).
    pub fn open_with(
        path: impl AsRef<Path>,
        split: Split,
        seq: usize,
        packing: Option<Packing>,
    ) -> Result<Self, TrainerError> {
        Self::open_files(&[path.as_ref()], split, seq, packing)
    }

    /// Split `split` of every token file of `paths`, one corpus: the same kind of data
    /// (instruction data or text) in each, packed alike.
    pub fn open_files(
        paths: &[impl AsRef<Path>],
        split: Split,
        seq: usize,
        packing: Option<Packing>,
    ) -> Result<Self, TrainerError> {
        let mut files: Vec<SplitFile> = Vec::new();
        let mut tokens = 0;
        for path in paths {
            let (file, n) = SplitFile::open(path.as_ref(), split, seq, packing)?;
            if let Some(first) = files.first() {
                let kind_of = |f: &SplitFile| (f.is_masked(), f.is_paired(), f.packing());
                if kind_of(&file) != kind_of(first) {
                    let kind = |f: &SplitFile| match (f.is_masked(), f.is_paired()) {
                        (_, true) => "preference pairs",
                        (true, false) => "instruction data",
                        (false, false) => "text",
                    };
                    return Err(file_error(
                        path.as_ref(),
                        format!(
                            "holds {}, packed as {}; {} holds {}, packed as {}: one corpus is one kind",
                            kind(&file),
                            file.packing().name(),
                            first.path().display(),
                            kind(first),
                            first.packing().name()
                        ),
                    ));
                }
            }
            tokens += n;
            files.push(file);
        }
        let ends = (files.iter())
            .scan(0, |end, f| {
                *end += f.len();
                Some(*end)
            })
            .collect::<Vec<_>>();
        let Some(first) = files.first() else {
            return Err(TrainerError::config("data", "no token files"));
        };
        if ends.last() == Some(&0) {
            let what = match files.len() {
                1 => format!("'{}': {tokens} tokens", split.name()),
                n => format!(
                    "the '{}' splits of its {n} files: {tokens} tokens",
                    split.name()
                ),
            };
            return Err(file_error(
                first.path(),
                format!(
                    "{what}, too few for one window of {} (--seq {seq} and its next token)",
                    seq + 1
                ),
            ));
        }
        Ok(TokenDataset { files, ends, seq })
    }

    /// The file and its window of window `i`.
    fn locate(&self, i: usize) -> (&SplitFile, usize) {
        let f = self.ends.partition_point(|&end| end <= i);
        let before = if f == 0 { 0 } else { self.ends[f - 1] };
        (&self.files[f], i - before)
    }

    /// Whether the split has a mask: some targets may not count.
    pub fn is_masked(&self) -> bool {
        self.files[0].is_masked()
    }

    /// Whether its documents are preference pairs (`wick prepare` of `prompt`/`chosen`/
    /// `rejected` rows): read them with [`crate::PreferenceDataset`].
    pub fn is_paired(&self) -> bool {
        self.files[0].is_paired()
    }

    /// How the windows are laid out.
    pub fn packing(&self) -> Packing {
        self.files[0].packing()
    }

    /// How many documents were longer than a window and cut to it (0 under `Concat`).
    pub fn truncated(&self) -> usize {
        self.files.iter().map(SplitFile::truncated).sum()
    }

    /// The input positions of all windows that hold a document's token, and all of them:
    /// what is not padding (every position under `Concat`).
    pub fn fill(&self) -> (usize, usize) {
        (self.files.iter().map(SplitFile::fill)).fold((0, 0), |(a, b), (c, d)| (a + c, b + d))
    }

    /// The documents of window `i`, (first token in its file, tokens) each; `None` under
    /// `Concat`.
    pub fn documents_of(&self, i: usize) -> candle_core::Result<Option<Vec<(u64, usize)>>> {
        let (file, i) = self.locate(i);
        file.documents_of(i)
    }

    /// The first file.
    pub fn path(&self) -> &Path {
        self.files[0].path()
    }

    /// How many files the windows come from.
    pub fn files(&self) -> usize {
        self.files.len()
    }

    /// Checks every file was made by the tokenizer whose hash is `hash`, for a model of
    /// `vocab_size` ids.
    pub fn check(&self, hash: &str, vocab_size: usize) -> Result<(), TrainerError> {
        self.files
            .iter()
            .try_for_each(|f| f.check(hash, vocab_size))
    }

    /// Tokens the model reads per window.
    pub fn seq(&self) -> usize {
        self.seq
    }
}

fn file_error(path: &Path, message: String) -> TrainerError {
    TrainerError::Checkpoint(CheckpointError::File(FileError::new(path, None, message)))
}

impl Dataset for TokenDataset {
    type Batch = TokenBatch;

    fn len(&self) -> usize {
        *self.ends.last().expect("at least one file")
    }

    fn batch(&self, indices: &[usize], device: &Device) -> candle_core::Result<Self::Batch> {
        let (n, seq) = (indices.len(), self.seq);
        let mut rows = Rows::default();
        for &i in indices {
            let (file, i) = self.locate(i);
            file.window(i, &mut rows)?;
        }
        let tensor = |v: Vec<u32>| Tensor::from_vec(v, (n, seq), device);
        let (ids, targets) = (tensor(rows.inputs)?, tensor(rows.targets)?);
        Ok(match self.packing() {
            Packing::Concat => TokenBatch::new(ids, targets),
            _ => TokenBatch::packed(ids, targets, tensor(rows.positions)?),
        })
    }

    fn tokens_per_sample(&self) -> usize {
        self.seq
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::data::token_file::{write_token_file, TokenSplit};
    use wick_core::IGNORE_INDEX;

    #[test]
    fn windows_overlap_by_one_token_and_bad_files_are_named() {
        let (_dir, path) = crate::data::scratch_file("tokens.safetensors");
        let train: Vec<u32> = (0..21).collect();
        write_token_file(&path, &train, &[7, 8, 9], "abc", 300).unwrap();
        let data = TokenDataset::open(&path, Split::Train, 4).unwrap();
        assert_eq!(data.len(), 5);
        let TokenBatch {
            ids: x,
            targets: y,
            positions,
        } = data.batch(&[1, 4], &Device::Cpu).unwrap();
        assert!(positions.is_none());
        assert_eq!(
            x.to_vec2::<u32>().unwrap(),
            [[4, 5, 6, 7], [16, 17, 18, 19]]
        );
        assert_eq!(
            y.to_vec2::<u32>().unwrap(),
            [[5, 6, 7, 8], [17, 18, 19, 20]]
        );
        data.check("abc", 300).unwrap();
        let e = data.check("xyz", 300).unwrap_err().to_string();
        assert!(
            e.contains("tokens.safetensors") && e.contains("another tokenizer"),
            "{e}"
        );
        let e = data.check("abc", 200).unwrap_err().to_string();
        assert!(e.contains("300 ids") && e.contains("200"), "{e}");
        let e = TokenDataset::open(&path, Split::Val, 4)
            .err()
            .unwrap()
            .to_string();
        assert!(
            e.contains("'val'") && e.contains("3 tokens, too few for one window of 5"),
            "{e}"
        );
        // Wide vocabularies are stored as u32.
        write_token_file(&path, &[70_000, 1, 2], &[3, 4], "abc", 80_000).unwrap();
        let wide = TokenDataset::open(&path, Split::Train, 2).unwrap();
        assert_eq!(
            wide.batch(&[0], &Device::Cpu)
                .unwrap()
                .ids
                .to_vec2::<u32>()
                .unwrap(),
            [[70_000, 1]]
        );
    }

    #[test]
    fn an_id_outside_the_vocabulary_is_refused_and_nothing_is_written() {
        let (_dir, path) = crate::data::scratch_file("tokens.safetensors");
        // 65 536 as a u16 would be token 0.
        let e = write_token_file(&path, &[1, 65_536, 2], &[3], "abc", 1 << 16)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("train token 1 is id 65536") && e.contains("65536"),
            "{e}"
        );
        let e = write_token_file(&path, &[1], &[300], "abc", 300)
            .unwrap_err()
            .to_string();
        assert!(e.contains("val token 0 is id 300"), "{e}");
        assert!(!path.exists());
    }

    #[test]
    fn documents_are_packed_whole_each_from_position_zero_and_padding_is_not_counted() {
        let (_dir, path) = crate::data::scratch_file("tokens.safetensors");
        // Documents of 4, 6, 3, 9 (longer than a window of 6: cut), 1 (no target: left
        // out) and 3 tokens; the second token of each is a prompt's (not counted).
        let lens = [4usize, 6, 3, 9, 1, 3];
        let mut ids = Vec::new();
        let mut counted = Vec::new();
        let mut starts = Vec::new();
        for (d, &n) in lens.iter().enumerate() {
            starts.push(ids.len() as u64);
            ids.extend((0..n as u32).map(|i| 100 * (d as u32 + 1) + i));
            counted.extend((0..n).map(|i| i != 1));
        }
        let split = |ids: &'static [u32]| TokenSplit {
            ids,
            counted: Some(&[true, true, true][..ids.len()]),
            starts: Some(&[0]),
        };
        let train = TokenSplit {
            ids: &ids,
            counted: Some(&counted),
            starts: Some(&starts),
        };
        write_token_file(&path, train, split(&[1, 2, 3]), "abc", 1000).unwrap();
        let data = TokenDataset::open(&path, Split::Train, 5).unwrap();
        assert_eq!(data.packing(), Packing::Documents);
        assert_eq!(data.truncated(), 1);
        // Inputs of 3, 5, 2, 5 (cut to 6 tokens) and 2 in windows of 5: best fit
        // decreasing gives [5], [5], [3, 2], [2].
        assert_eq!(data.len(), 4);
        let all: Vec<usize> = (0..4).collect();
        let batch = data.batch(&all, &Device::Cpu).unwrap();
        let positions = batch.positions.unwrap().to_vec2::<u32>().unwrap();
        let ids = batch.ids.to_vec2::<u32>().unwrap();
        let targets = batch.targets.to_vec2::<u32>().unwrap();
        let x = IGNORE_INDEX;
        let row = |first: u32| (first..first + 5).collect::<Vec<u32>>();
        // The two windows of five positions: the 6-token document and the cut 9-token one.
        let mut full: Vec<Vec<u32>> = vec![ids[0].clone(), ids[1].clone()];
        full.sort();
        assert_eq!(full, [row(200), row(400)]);
        assert_eq!(positions[0], [0, 1, 2, 3, 4]);
        // The document of 4 tokens (inputs 3) then the one of 3 (inputs 2): each from
        // position 0, its own targets only, its second token not counted.
        assert_eq!(ids[2], [100, 101, 102, 300, 301]);
        assert_eq!(targets[2], [x, 102, 103, x, 302]);
        assert_eq!(positions[2], [0, 1, 2, 0, 1]);
        // The last document and three pads: each pad at position 0, none counted.
        assert_eq!(ids[3], [600, 601, 0, 0, 0]);
        assert_eq!(targets[3], [x, 602, x, x, x]);
        assert_eq!(positions[3], [0, 1, 0, 0, 0]);
        // One document per window when padded; the tokens one after another under concat.
        let padded = TokenDataset::open_with(&path, Split::Train, 5, Some(Packing::Padded));
        assert_eq!(padded.unwrap().len(), 5);
        let concat = TokenDataset::open_with(&path, Split::Train, 5, Some(Packing::Concat));
        let concat = concat.unwrap();
        assert_eq!(concat.len(), (ids_len(&lens) - 1) / 5);
        let first = concat.batch(&[0], &Device::Cpu).unwrap();
        assert!(first.positions.is_none());
        assert_eq!(
            first.ids.to_vec2::<u32>().unwrap()[0],
            [100, 101, 102, 103, 200]
        );
    }

    fn ids_len(lens: &[usize]) -> usize {
        lens.iter().sum()
    }

    #[test]
    fn starts_that_do_not_count_up_from_zero_are_refused() {
        let (_dir, path) = crate::data::scratch_file("tokens.safetensors");
        let with = |starts: &'static [u64]| TokenSplit {
            ids: &[1, 2, 3, 4],
            counted: None,
            starts: Some(starts),
        };
        for bad in [&[1u64, 2][..], &[0, 2, 2], &[0, 4]] {
            let e = write_token_file(&path, with(bad), with(&[0]), "abc", 10).unwrap_err();
            assert!(
                e.to_string().contains("must start at 0 and increase"),
                "{e}"
            );
        }
        let e = write_token_file(&path, with(&[0]), &[1, 2], "abc", 10).unwrap_err();
        assert!(e.to_string().contains("both splits"), "{e}");
        assert!(!path.exists());
        // A file without starts cannot be packed by document.
        write_token_file(&path, &[1, 2, 3, 4], &[1, 2], "abc", 10).unwrap();
        let e = TokenDataset::open_with(&path, Split::Train, 2, Some(Packing::Documents));
        let e = e.err().unwrap().to_string();
        assert!(
            e.contains("train_starts") && e.contains("prepare again"),
            "{e}"
        );
    }

    #[test]
    fn several_files_are_one_corpus_and_must_be_one_kind() {
        let dir = tempfile::tempdir().unwrap();
        let (a, b, c) = (
            dir.path().join("a"),
            dir.path().join("b"),
            dir.path().join("c"),
        );
        let ids = |from: u32, n: u32| (from..from + n).collect::<Vec<u32>>();
        write_token_file(&a, &ids(0, 9), &ids(100, 3), "abc", 1000).unwrap();
        // Too few tokens for a window of its own: it adds none.
        write_token_file(&b, &ids(200, 2), &ids(300, 3), "abc", 1000).unwrap();
        write_token_file(&c, &ids(400, 5), &ids(500, 3), "abc", 1000).unwrap();
        let data = TokenDataset::open_files(&[&a, &b, &c], Split::Train, 4, None).unwrap();
        assert_eq!((data.len(), data.files()), (3, 3));
        let batch = data.batch(&[2, 0, 1], &Device::Cpu).unwrap();
        let rows = batch.ids.to_vec2::<u32>().unwrap();
        assert_eq!(rows, [ids(400, 4), ids(0, 4), ids(4, 4)]);
        data.check("abc", 1000).unwrap();
        // Instruction data beside text is refused, naming both files.
        let counted = [true; 3];
        let masked = |ids: &'static [u32]| TokenSplit {
            ids,
            counted: Some(&counted[..ids.len()]),
            starts: None,
        };
        write_token_file(&b, masked(&[1, 2, 3]), masked(&[4, 5]), "abc", 1000).unwrap();
        let e = TokenDataset::open_files(&[&a, &b], Split::Train, 2, None)
            .err()
            .unwrap();
        let e = e.to_string();
        assert!(
            e.contains("holds instruction data") && e.contains("holds text"),
            "{e}"
        );
        let none = TokenDataset::open_files(&[&b], Split::Val, 4, None)
            .err()
            .unwrap();
        assert!(
            none.to_string().contains("too few for one window"),
            "{none}"
        );
    }
}
