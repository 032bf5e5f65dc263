//! The token file's format and its writers: a safetensors file of the `train` and `val` ids
//! (u16 where the vocabulary allows, else u32), for instruction data a mask of the targets
//! that count (`train_mask`, `val_mask`, u8), each document's first token (`train_starts`,
//! `val_starts`, i64, which Candle, NumPy and PyTorch all read), and the tokenizer's hash
//! and vocabulary size in the metadata. [`write_token_file`] writes splits held in memory;
//! [`TokenFileWriter`](crate::TokenFileWriter) writes a corpus of any size as its documents
//! come, in bounded memory.
//! Both write under a temporary name and rename, so a failed write leaves nothing.

use crate::data::token_parts::{id_bytes, once, write_parts, Part};
use crate::TrainerError;
use safetensors::Dtype;
use std::collections::HashMap;
use std::path::Path;

/// The metadata key of the tokenizer's hash.
pub const TOKENIZER_KEY: &str = "wick.tokenizer";
/// The metadata key of the vocabulary size.
pub const VOCAB_KEY: &str = "wick.vocab_size";
/// The metadata key that marks preference data: its documents come in pairs, a prompt
/// with its chosen completion, then the same prompt with its rejected one.
pub const PAIRS_KEY: &str = "wick.pairs";
/// [`PAIRS_KEY`]'s value.
pub const PAIRS_VALUE: &str = "chosen,rejected";

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

/// Writes a token file at `path` from splits in memory: `train` and `val` as u16 when every
/// id fits (a vocabulary of at most 65536), else u32, their masks and starts where they have
/// them (both or neither), with the tokenizer's hash and vocabulary size.
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
    let mut parts = Vec::new();
    for (split, tokens) in [(Split::Train, &train), (Split::Val, &val)] {
        parts.push(Part::ids(
            split.name(),
            narrow,
            tokens.ids.len(),
            once(id_bytes(tokens.ids, narrow)),
        ));
        if let Some(counted) = tokens.counted {
            let flags = counted.iter().map(|&b| b as u8).collect();
            parts.push(Part::new(
                split.mask_name(),
                Dtype::U8,
                counted.len(),
                once(flags),
            ));
        }
        if let Some(starts) = tokens.starts {
            let bytes = starts
                .iter()
                .flat_map(|&s| (s as i64).to_le_bytes())
                .collect();
            parts.push(Part::new(
                split.starts_name(),
                Dtype::I64,
                starts.len(),
                once(bytes),
            ));
        }
    }
    write_parts(path, parts, metadata(tokenizer_hash, vocab_size))
}

/// The file's metadata: the tokenizer's hash and vocabulary size.
pub(crate) fn metadata(tokenizer_hash: &str, vocab_size: usize) -> HashMap<String, String> {
    HashMap::from([
        (TOKENIZER_KEY.to_string(), tokenizer_hash.to_string()),
        (VOCAB_KEY.to_string(), vocab_size.to_string()),
    ])
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

/// Whether `starts` are document starts of `tokens` tokens: from 0, increasing, each
/// within them (what a token file's writer checks and its reader checks again).
pub(crate) fn starts_are_valid(starts: &[u64], tokens: usize) -> bool {
    starts.first().is_none_or(|&s| s == 0)
        && starts.windows(2).all(|w| w[0] < w[1])
        && starts.last().is_none_or(|&s| (s as usize) < tokens)
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
        let covered = split.ids.is_empty() || !starts.is_empty();
        if !(covered && starts_are_valid(starts, split.ids.len())) {
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
