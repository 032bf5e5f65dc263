//! Token files and `TokenDataset`: text tokenized once (`wick prepare`) into a safetensors
//! file of two 1-D integer tensors, `train` and `val`, served as windows of `seq + 1`
//! tokens: the model reads the first `seq` and predicts the last `seq`.
//!
//! Instruction data adds `train_mask` and `val_mask` (u8, one per token: 1 where the token
//! counts as a target of the loss, 0 for a prompt's): a window's uncounted targets come out
//! as [`wick_core::IGNORE_INDEX`], `transformers`' -100 label.
//!
//! `train_starts` and `val_starts` (i64, which Candle, NumPy and PyTorch all read) record
//! where each document (each example) starts,
//! so that windows can hold whole documents, each kept to itself ([`Packing`]).
//!
//! The file's metadata names the tokenizer that made it (`wick.tokenizer`, the SHA-256 of
//! its `tokenizer.json`) and its vocabulary size (`wick.vocab_size`), so that a file made by
//! another tokenizer, or with ids a model cannot embed, is refused before training.

use crate::checkpoint::CheckpointError;
use crate::data::packing::{best_fit_decreasing, Packing};
use crate::{Dataset, TrainerError};
use candle_core::{Device, Tensor};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use wick_core::{FileError, SafetensorsFile, TokenBatch, IGNORE_INDEX};

/// The metadata key of the tokenizer's hash.
pub const TOKENIZER_KEY: &str = "wick.tokenizer";
/// The metadata key of the vocabulary size.
pub const VOCAB_KEY: &str = "wick.vocab_size";

/// Which part of a token file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Split {
    /// The tokens to train on.
    Train,
    /// The tokens held out for validation.
    Val,
}

impl Split {
    /// The tensor's name in the file.
    pub fn name(self) -> &'static str {
        match self {
            Split::Train => "train",
            Split::Val => "val",
        }
    }

    /// The name of its mask, in a file of instruction data.
    pub fn mask_name(self) -> &'static str {
        match self {
            Split::Train => "train_mask",
            Split::Val => "val_mask",
        }
    }

    /// The name of its documents' starts.
    pub fn starts_name(self) -> &'static str {
        match self {
            Split::Train => "train_starts",
            Split::Val => "val_starts",
        }
    }
}

/// The tokens of one split and, for instruction data, whether each counts as a target;
/// where known, where each document starts.
#[derive(Clone, Copy, Debug)]
pub struct TokenSplit<'a> {
    /// The ids.
    pub ids: &'a [u32],
    /// One flag per id (`None`: every token counts).
    pub counted: Option<&'a [bool]>,
    /// The index of each document's first token, from 0, increasing (`None`: unknown).
    pub starts: Option<&'a [u64]>,
}

impl<'a> From<&'a [u32]> for TokenSplit<'a> {
    fn from(ids: &'a [u32]) -> Self {
        TokenSplit {
            ids,
            counted: None,
            starts: None,
        }
    }
}

// `&Vec<u32>` and `&[u32; N]` too, which the old `&[u32]` parameter took by coercion.
impl<'a> From<&'a Vec<u32>> for TokenSplit<'a> {
    fn from(ids: &'a Vec<u32>) -> Self {
        ids.as_slice().into()
    }
}

impl<'a, const N: usize> From<&'a [u32; N]> for TokenSplit<'a> {
    fn from(ids: &'a [u32; N]) -> Self {
        ids.as_slice().into()
    }
}

/// Writes a token file at `path`: `train` and `val` as u16 when every id fits (a vocabulary
/// of at most 65536), else u32, their masks where they have them (both or neither), with
/// the tokenizer's hash and vocabulary size. Written under a temporary name and renamed, so
/// a failed write leaves nothing.
pub fn write_token_file<'a>(
    path: &Path,
    train: impl Into<TokenSplit<'a>>,
    val: impl Into<TokenSplit<'a>>,
    tokenizer_hash: &str,
    vocab_size: usize,
) -> Result<(), TrainerError> {
    let (train, val) = (train.into(), val.into());
    check_splits(&train, &val, vocab_size)?;
    let narrow = vocab_size <= 1 << 16;
    let tensors: Vec<(&str, safetensors::Dtype, Vec<u8>)> =
        [(Split::Train, &train), (Split::Val, &val)]
            .into_iter()
            .flat_map(|(split, tokens)| encoded(split, tokens, narrow))
            .collect();
    let io = |cause| TrainerError::Io {
        path: path.to_path_buf(),
        cause,
    };
    let views = (tensors.iter())
        .map(|(name, dtype, bytes)| {
            let len = bytes.len() / (dtype.bitsize() / 8);
            safetensors::tensor::TensorView::new(*dtype, vec![len], bytes).map(|v| (*name, v))
        })
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| io(std::io::Error::other(e.to_string())))?;
    let metadata = BTreeMap::from([
        (TOKENIZER_KEY.to_string(), tokenizer_hash.to_string()),
        (VOCAB_KEY.to_string(), vocab_size.to_string()),
    ]);
    let mut data = safetensors::serialize(views, Some(metadata.into_iter().collect()))
        .map_err(|e| io(std::io::Error::other(e.to_string())))?;
    sort_header(&mut data);
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, data).map_err(io)?;
    std::fs::rename(&tmp, path).map_err(io)
}

/// The tensors of one split: its ids as u16 when `narrow` (else u32), its mask (u8) and its
/// documents' starts (i64) where it has them.
fn encoded(
    split: Split,
    tokens: &TokenSplit,
    narrow: bool,
) -> Vec<(&'static str, safetensors::Dtype, Vec<u8>)> {
    use safetensors::Dtype;
    let ids = match narrow {
        true => (
            Dtype::U16,
            tokens
                .ids
                .iter()
                .flat_map(|&i| (i as u16).to_le_bytes())
                .collect(),
        ),
        false => (
            Dtype::U32,
            tokens.ids.iter().flat_map(|&i| i.to_le_bytes()).collect(),
        ),
    };
    let mut all = vec![(split.name(), ids.0, ids.1)];
    if let Some(counted) = tokens.counted {
        all.push((
            split.mask_name(),
            Dtype::U8,
            counted.iter().map(|&b| b as u8).collect(),
        ));
    }
    if let Some(starts) = tokens.starts {
        let bytes = starts
            .iter()
            .flat_map(|&s| (s as i64).to_le_bytes())
            .collect();
        all.push((split.starts_name(), Dtype::I64, bytes));
    }
    all
}

/// Checks a token file's splits: a mask of one flag per token in both or neither, starts
/// as [`check_starts`] wants them, every id below `vocab_size`.
fn check_splits(
    train: &TokenSplit,
    val: &TokenSplit,
    vocab_size: usize,
) -> Result<(), TrainerError> {
    for split in [train, val] {
        if split.counted.is_some_and(|c| c.len() != split.ids.len()) {
            return Err(TrainerError::config("mask", "needs one flag per token"));
        }
    }
    if train.counted.is_some() != val.counted.is_some() {
        return Err(TrainerError::config(
            "mask",
            "both splits have one or neither",
        ));
    }
    check_starts(train, val)?;
    for (name, split) in [("train", train), ("val", val)] {
        if let Some(at) = split.ids.iter().position(|&id| id as usize >= vocab_size) {
            // Narrowed to u16 it would wrap to another token, silently.
            return Err(TrainerError::config(
                "vocab-size",
                format!(
                    "{name} token {at} is id {}, not below the vocabulary's {vocab_size}",
                    split.ids[at]
                ),
            ));
        }
    }
    Ok(())
}

/// Checks that both splits record their documents' starts or neither, each from 0,
/// increasing, within its tokens.
fn check_starts(train: &TokenSplit, val: &TokenSplit) -> Result<(), TrainerError> {
    if train.starts.is_some() != val.starts.is_some() {
        return Err(TrainerError::config(
            "starts",
            "both splits have them or neither",
        ));
    }
    for (name, split) in [("train", train), ("val", val)] {
        let Some(starts) = split.starts else { continue };
        let ordered = starts.windows(2).all(|w| w[0] < w[1]);
        let first =
            starts.first().is_none_or(|&s| s == 0) && (split.ids.is_empty() || !starts.is_empty());
        let inside = starts
            .last()
            .is_none_or(|&s| (s as usize) < split.ids.len());
        if !(ordered && first && inside) {
            return Err(TrainerError::config(
                "starts",
                format!(
                    "{name}'s must start at 0 and increase within its {} tokens",
                    split.ids.len()
                ),
            ));
        }
    }
    Ok(())
}

/// Puts the keys of a serialized safetensors file's header in sorted order, padded to its
/// length: safetensors writes `__metadata__` from a `HashMap`, whose order changes from one
/// run to the next, and the same tokens must give the same bytes.
fn sort_header(data: &mut [u8]) {
    let len = u64::from_le_bytes(data[..8].try_into().expect("8 bytes")) as usize;
    let header = &mut data[8..8 + len];
    let parsed: serde_json::Value =
        serde_json::from_slice(header).expect("safetensors wrote a JSON header");
    // serde_json's maps keep their keys sorted.
    let sorted = serde_json::to_vec(&parsed).expect("JSON serializes");
    header[..sorted.len()].copy_from_slice(&sorted);
    header[sorted.len()..].fill(b' ');
}

/// Windows of one split of a token file, memory-mapped, as its [`Packing`] lays them:
/// under `Concat`, window i is tokens `i * seq .. i * seq + seq + 1` (every token but the
/// first a target exactly once); under `Documents` and `Padded`, whole documents, each its
/// own inputs and targets, positions restarting at each, the rest of the window padding
/// that is not counted. A [`DataLoader`](crate::DataLoader) orders the windows (seeded) and
/// resumes from a checkpoint's data position as for any dataset.
#[derive(Clone)]
pub struct TokenDataset {
    file: Arc<SafetensorsFile>,
    split: Split,
    seq: usize,
    windows: Windows,
    /// The file holds the split's mask (instruction data).
    masked: bool,
}

/// Where a dataset's windows come from.
#[derive(Clone)]
enum Windows {
    /// Window i starts at token `i * seq`; this many windows.
    Concat(usize),
    /// Window i holds these documents, (first token, tokens) each, at most `seq + 1`
    /// tokens each; and how many documents were cut to that.
    Documents {
        bins: Arc<Vec<Vec<(u64, usize)>>>,
        packing: Packing,
        truncated: usize,
    },
}

fn file_error(path: &Path, tensor: Option<&str>, message: String) -> TrainerError {
    TrainerError::Checkpoint(CheckpointError::File(FileError::new(path, tensor, message)))
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
        let path = path.as_ref();
        let file = SafetensorsFile::open(path).map_err(CheckpointError::File)?;
        let tokens = checked_tokens(&file, split)?;
        let masked = file.names().iter().any(|n| n == split.mask_name());
        let has_starts = file.names().iter().any(|n| n == split.starts_name());
        if seq == 0 {
            return Err(TrainerError::config(
                "seq",
                "must be at least 1 token, got 0",
            ));
        }
        let default = match masked && has_starts {
            true => Packing::Documents,
            false => Packing::Concat,
        };
        let windows = match packing.unwrap_or(default) {
            Packing::Concat => Windows::Concat(tokens.saturating_sub(1) / seq),
            packing => {
                if !has_starts {
                    return Err(file_error(
                        path,
                        Some(split.starts_name()),
                        format!(
                            "--packing {} needs the documents' starts, which this file does not \
                         record: run wick prepare again",
                            packing.name()
                        ),
                    ));
                }
                documents(&file, split, tokens, seq, packing)?
            }
        };
        let dataset = TokenDataset {
            file: Arc::new(file),
            split,
            seq,
            windows,
            masked,
        };
        if dataset.len() == 0 {
            return Err(file_error(
                path,
                Some(split.name()),
                format!("{tokens} tokens, too few for one window of {} (--seq {seq} and its next token)", seq + 1),
            ));
        }
        Ok(dataset)
    }

    /// Whether the split has a mask: some targets may not count.
    pub fn is_masked(&self) -> bool {
        self.masked
    }

    /// How the windows are laid out.
    pub fn packing(&self) -> Packing {
        match &self.windows {
            Windows::Concat(_) => Packing::Concat,
            Windows::Documents { packing, .. } => *packing,
        }
    }

    /// How many documents were longer than a window and cut to it (0 under `Concat`).
    pub fn truncated(&self) -> usize {
        match &self.windows {
            Windows::Concat(_) => 0,
            Windows::Documents { truncated, .. } => *truncated,
        }
    }

    /// The input positions of all windows that hold a document's token, and all of them:
    /// what is not padding (every position under `Concat`).
    pub fn fill(&self) -> (usize, usize) {
        let all = self.len() * self.seq;
        match &self.windows {
            Windows::Concat(_) => (all, all),
            Windows::Documents { bins, .. } => {
                let used = bins.iter().flatten().map(|&(_, n)| n - 1).sum();
                (used, all)
            }
        }
    }

    /// The documents of window `i`, (first token, tokens) each; `None` under `Concat`.
    pub fn documents_of(&self, i: usize) -> Option<&[(u64, usize)]> {
        match &self.windows {
            Windows::Concat(_) => None,
            Windows::Documents { bins, .. } => bins.get(i).map(Vec::as_slice),
        }
    }

    /// The file.
    pub fn path(&self) -> &Path {
        self.file.path()
    }

    /// A metadata value of the file.
    fn meta(&self, key: &str) -> Option<&str> {
        self.file
            .metadata()
            .and_then(|m| m.get(key))
            .map(String::as_str)
    }

    /// Checks the file was made by the tokenizer whose hash is `hash`, for a model of
    /// `vocab_size` ids.
    pub fn check(&self, hash: &str, vocab_size: usize) -> Result<(), TrainerError> {
        let path: PathBuf = self.path().to_path_buf();
        match self.meta(TOKENIZER_KEY) {
            Some(h) if h == hash => {}
            Some(h) => {
                return Err(file_error(
                    &path,
                    None,
                    format!(
                        "made by another tokenizer (hash {h}) than the model's ({hash}); run wick \
                     prepare again with the model's tokenizer.json"
                    ),
                ))
            }
            None => {
                return Err(file_error(
                    &path,
                    None,
                    format!("has no '{TOKENIZER_KEY}' metadata: not a wick token file"),
                ))
            }
        }
        let file_vocab: usize = self
            .meta(VOCAB_KEY)
            .and_then(|v| v.parse().ok())
            .ok_or_else(|| file_error(&path, None, format!("has no '{VOCAB_KEY}' metadata")))?;
        if file_vocab > vocab_size {
            return Err(file_error(&path, None, format!(
                "its tokenizer has {file_vocab} ids, more than the model's vocabulary of {vocab_size}"
            )));
        }
        Ok(())
    }

    /// Tokens the model reads per window.
    pub fn seq(&self) -> usize {
        self.seq
    }
}

/// The number of tokens of `split` in `file`, checked: one dimension of u16 or u32 ids,
/// and a mask of one u8 flag per token where there is one.
fn checked_tokens(file: &SafetensorsFile, split: Split) -> Result<usize, TrainerError> {
    let path = file.path();
    let name = split.name();
    let shape = file.shape(name).map_err(CheckpointError::File)?;
    let &[tokens] = shape.as_slice() else {
        return Err(file_error(
            path,
            Some(name),
            format!("shape {shape:?}, expected one dimension of token ids"),
        ));
    };
    if file.names().iter().any(|n| n == split.mask_name()) {
        let mask = split.mask_name();
        let (shape, dtype) = (
            file.shape(mask).map_err(CheckpointError::File)?,
            file.dtype(mask).map_err(CheckpointError::File)?,
        );
        if shape != [tokens] || dtype != "U8" {
            return Err(file_error(
                path,
                Some(mask),
                format!("{dtype} of shape {shape:?}, expected U8 flags, one per token of '{name}' ({tokens})"),
            ));
        }
    }
    let dtype = file.dtype(name).map_err(CheckpointError::File)?;
    if dtype != "U16" && dtype != "U32" {
        return Err(file_error(
            path,
            Some(name),
            format!("dtype {dtype}, expected U16 or U32 token ids"),
        ));
    }
    Ok(tokens)
}

/// The windows of whole documents of `split` (of `tokens` tokens): each document of at
/// least two tokens (one target) cut to `seq + 1`, then placed by best-fit decreasing
/// (`Documents`) or one per window (`Padded`).
fn documents(
    file: &SafetensorsFile,
    split: Split,
    tokens: usize,
    seq: usize,
    packing: Packing,
) -> Result<Windows, TrainerError> {
    let name = split.starts_name();
    let shape = file.shape(name).map_err(CheckpointError::File)?;
    let starts = file
        .read_u64(name, 0..shape.iter().product())
        .map_err(CheckpointError::File)?;
    let bad = starts.first().is_some_and(|&s| s != 0)
        || starts.windows(2).any(|w| w[0] >= w[1])
        || starts.last().is_some_and(|&s| s as usize >= tokens);
    if bad {
        return Err(file_error(
            file.path(),
            Some(name),
            format!("must start at 0 and increase within the {tokens} tokens"),
        ));
    }
    let ends = starts.iter().skip(1).copied().chain([tokens as u64]);
    let whole: Vec<(u64, usize)> = (starts.iter().zip(ends))
        .map(|(&s, e)| (s, (e - s) as usize))
        .filter(|&(_, n)| n >= 2)
        .collect();
    let truncated = whole.iter().filter(|&&(_, n)| n > seq + 1).count();
    let docs: Vec<(u64, usize)> = whole.iter().map(|&(s, n)| (s, n.min(seq + 1))).collect();
    let bins = match packing {
        Packing::Padded => docs.iter().map(|&d| vec![d]).collect(),
        _ => {
            // A document of n tokens fills n - 1 positions (its inputs; its targets are
            // the same positions shifted by one).
            let sizes: Vec<usize> = docs.iter().map(|&(_, n)| n - 1).collect();
            (best_fit_decreasing(&sizes, seq).into_iter())
                .map(|bin| bin.into_iter().map(|i| docs[i]).collect())
                .collect()
        }
    };
    Ok(Windows::Documents {
        bins: Arc::new(bins),
        packing,
        truncated,
    })
}

impl TokenDataset {
    /// Window `i` under `Concat`: inputs, targets and nothing else.
    fn concat_window(
        &self,
        i: usize,
        (inputs, targets): (&mut Vec<u32>, &mut Vec<u32>),
    ) -> candle_core::Result<()> {
        let seq = self.seq;
        let window = self
            .file
            .read_u32(self.split.name(), i * seq..i * seq + seq + 1)?;
        inputs.extend_from_slice(&window[..seq]);
        targets.extend(self.targets(&window, i * seq + 1)?);
        Ok(())
    }

    /// The targets of the tokens `window[1..]`, the first of them token `at` of the split:
    /// [`IGNORE_INDEX`] where the mask does not count them.
    fn targets(&self, window: &[u32], at: usize) -> candle_core::Result<Vec<u32>> {
        let next = &window[1..];
        if !self.masked {
            return Ok(next.to_vec());
        }
        let counted = (self.file).read_u32(self.split.mask_name(), at..at + next.len())?;
        Ok(next
            .iter()
            .zip(counted)
            .map(|(&t, c)| if c == 0 { IGNORE_INDEX } else { t })
            .collect())
    }

    /// A window of whole documents, each from position 0, then padding (id 0, not
    /// counted, each pad a document of its own so that nothing attends to it).
    fn documents_window(
        &self,
        docs: &[(u64, usize)],
        (inputs, targets, positions): (&mut Vec<u32>, &mut Vec<u32>, &mut Vec<u32>),
    ) -> candle_core::Result<()> {
        let mut used = 0;
        for &(start, n) in docs {
            let start = start as usize;
            let tokens = self.file.read_u32(self.split.name(), start..start + n)?;
            inputs.extend_from_slice(&tokens[..n - 1]);
            targets.extend(self.targets(&tokens, start + 1)?);
            positions.extend(0..n as u32 - 1);
            used += n - 1;
        }
        let pad = self.seq - used;
        inputs.extend(std::iter::repeat_n(0, pad));
        targets.extend(std::iter::repeat_n(IGNORE_INDEX, pad));
        positions.extend(std::iter::repeat_n(0, pad));
        Ok(())
    }
}

impl Dataset for TokenDataset {
    type Batch = TokenBatch;

    fn len(&self) -> usize {
        match &self.windows {
            Windows::Concat(n) => *n,
            Windows::Documents { bins, .. } => bins.len(),
        }
    }

    fn batch(&self, indices: &[usize], device: &Device) -> candle_core::Result<Self::Batch> {
        let (n, seq) = (indices.len(), self.seq);
        let mut inputs = Vec::with_capacity(n * seq);
        let mut targets = Vec::with_capacity(n * seq);
        let tensor = |v: Vec<u32>| Tensor::from_vec(v, (n, seq), device);
        match &self.windows {
            Windows::Concat(_) => {
                for &i in indices {
                    self.concat_window(i, (&mut inputs, &mut targets))?;
                }
                Ok(TokenBatch::new(tensor(inputs)?, tensor(targets)?))
            }
            Windows::Documents { bins, .. } => {
                let mut positions = Vec::with_capacity(n * seq);
                for &i in indices {
                    let parts = (&mut inputs, &mut targets, &mut positions);
                    self.documents_window(&bins[i], parts)?;
                }
                let (ids, targets) = (tensor(inputs)?, tensor(targets)?);
                Ok(TokenBatch::packed(ids, targets, tensor(positions)?))
            }
        }
    }

    fn tokens_per_sample(&self) -> usize {
        self.seq
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn windows_overlap_by_one_token_and_bad_files_are_named() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("tokens.safetensors");
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
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("tokens.safetensors");
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
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("tokens.safetensors");
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
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("tokens.safetensors");
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
}
