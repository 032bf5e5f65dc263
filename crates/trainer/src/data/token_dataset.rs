//! Token files and `TokenDataset`: text tokenized once (`wick prepare`) into a safetensors
//! file of two 1-D integer tensors, `train` and `val`, served as windows of `seq + 1`
//! tokens: the model reads the first `seq` and predicts the last `seq`.
//!
//! Instruction data adds `train_mask` and `val_mask` (u8, one per token: 1 where the token
//! counts as a target of the loss, 0 for a prompt's): a window's uncounted targets come out
//! as [`wick_core::IGNORE_INDEX`], `transformers`' -100 label.
//!
//! The file's metadata names the tokenizer that made it (`wick.tokenizer`, the SHA-256 of
//! its `tokenizer.json`) and its vocabulary size (`wick.vocab_size`), so that a file made by
//! another tokenizer, or with ids a model cannot embed, is refused before training.

use crate::checkpoint::CheckpointError;
use crate::{Dataset, TrainerError};
use candle_core::{Device, Tensor};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use wick_core::{FileError, SafetensorsFile};

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
}

/// The tokens of one split and, for instruction data, whether each counts as a target.
#[derive(Clone, Copy, Debug)]
pub struct TokenSplit<'a> {
    /// The ids.
    pub ids: &'a [u32],
    /// One flag per id (`None`: every token counts).
    pub counted: Option<&'a [bool]>,
}

impl<'a> From<&'a [u32]> for TokenSplit<'a> {
    fn from(ids: &'a [u32]) -> Self {
        TokenSplit { ids, counted: None }
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
    for split in [&train, &val] {
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
    for (name, split) in [("train", &train), ("val", &val)] {
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
    let narrow = vocab_size <= 1 << 16;
    let bytes = |ids: &[u32]| -> Vec<u8> {
        match narrow {
            true => ids.iter().flat_map(|&i| (i as u16).to_le_bytes()).collect(),
            false => ids.iter().flat_map(|&i| i.to_le_bytes()).collect(),
        }
    };
    let dtype = match narrow {
        true => safetensors::Dtype::U16,
        false => safetensors::Dtype::U32,
    };
    let (train_bytes, val_bytes) = (bytes(train.ids), bytes(val.ids));
    let flags = |c: Option<&[bool]>| c.map(|c| c.iter().map(|&b| b as u8).collect::<Vec<u8>>());
    let (train_mask, val_mask) = (flags(train.counted), flags(val.counted));
    let io = |cause| TrainerError::Io {
        path: path.to_path_buf(),
        cause,
    };
    use safetensors::tensor::TensorView;
    let mut views = vec![
        (
            "train",
            TensorView::new(dtype, vec![train.ids.len()], &train_bytes),
        ),
        (
            "val",
            TensorView::new(dtype, vec![val.ids.len()], &val_bytes),
        ),
    ];
    for (name, mask) in [("train_mask", &train_mask), ("val_mask", &val_mask)] {
        if let Some(mask) = mask {
            views.push((
                name,
                TensorView::new(safetensors::Dtype::U8, vec![mask.len()], mask),
            ));
        }
    }
    let views = views
        .into_iter()
        .map(|(n, v)| v.map(|v| (n, v)))
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

/// Windows of `seq + 1` tokens of one split of a token file, memory-mapped: window i
/// starts at token `i * seq`, so every token but the first is a target exactly once. A
/// [`DataLoader`](crate::DataLoader) orders them (seeded) and resumes from a checkpoint's
/// data position as for any dataset.
#[derive(Clone)]
pub struct TokenDataset {
    file: Arc<SafetensorsFile>,
    split: Split,
    seq: usize,
    windows: usize,
    /// The file holds the split's mask (instruction data).
    masked: bool,
}

fn file_error(path: &Path, tensor: Option<&str>, message: String) -> TrainerError {
    TrainerError::Checkpoint(CheckpointError::File(FileError::new(path, tensor, message)))
}

impl TokenDataset {
    /// Split `split` of the token file `path`, in windows of `seq + 1` tokens.
    pub fn open(path: impl AsRef<Path>, split: Split, seq: usize) -> Result<Self, TrainerError> {
        let path = path.as_ref();
        let file = SafetensorsFile::open(path).map_err(CheckpointError::File)?;
        let name = split.name();
        let shape = file.shape(name).map_err(CheckpointError::File)?;
        let &[tokens] = shape.as_slice() else {
            return Err(file_error(
                path,
                Some(name),
                format!("shape {shape:?}, expected one dimension of token ids"),
            ));
        };
        let masked = file.names().iter().any(|n| n == split.mask_name());
        if masked {
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
        if seq == 0 {
            return Err(TrainerError::config(
                "seq",
                "must be at least 1 token, got 0",
            ));
        }
        let windows = tokens.saturating_sub(1) / seq;
        if windows == 0 {
            return Err(file_error(
                path,
                Some(name),
                format!("{tokens} tokens, too few for one window of {} (--seq {seq} and its next token)", seq + 1),
            ));
        }
        Ok(TokenDataset {
            file: Arc::new(file),
            split,
            seq,
            windows,
            masked,
        })
    }

    /// Whether the split has a mask: some targets may not count.
    pub fn is_masked(&self) -> bool {
        self.masked
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

impl Dataset for TokenDataset {
    type Batch = (Tensor, Tensor);

    fn len(&self) -> usize {
        self.windows
    }

    fn batch(&self, indices: &[usize], device: &Device) -> candle_core::Result<Self::Batch> {
        let (n, seq) = (indices.len(), self.seq);
        let (mut inputs, mut targets) = (Vec::with_capacity(n * seq), Vec::with_capacity(n * seq));
        for &i in indices {
            let window = self
                .file
                .read_u32(self.split.name(), i * seq..i * seq + seq + 1)?;
            inputs.extend_from_slice(&window[..seq]);
            if self.masked {
                let range = i * seq + 1..i * seq + seq + 1;
                let counted = self.file.read_u32(self.split.mask_name(), range)?;
                targets.extend(window[1..].iter().zip(counted).map(|(&t, c)| match c {
                    0 => wick_core::IGNORE_INDEX,
                    _ => t,
                }));
            } else {
                targets.extend_from_slice(&window[1..]);
            }
        }
        Ok((
            Tensor::from_vec(inputs, (n, seq), device)?,
            Tensor::from_vec(targets, (n, seq), device)?,
        ))
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
        let (x, y) = data.batch(&[1, 4], &Device::Cpu).unwrap();
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
                .0
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
}
