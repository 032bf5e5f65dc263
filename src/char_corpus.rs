//! The main job's data: fixed-length windows of a text, as character ids.

use candle_core::{Device, Result, Tensor};
use wick_core::TokenBatch;
use wick_trainer::Dataset;

/// The corpus that ships with wick: licence texts that allow verbatim copies (GPL-3,
/// LGPL-2.1, Apache-2.0, MPL-2.0, GFDL-1.3, Artistic, CC0), about 126 KB of English.
pub const BUNDLED_TEXT: &str = include_str!("../data/licenses.txt");

/// The characters of a text, sorted, as a vocabulary.
#[derive(Debug, Clone)]
pub struct Vocab {
    chars: Vec<char>,
}

impl Vocab {
    /// Every distinct character of `text`.
    pub fn of(text: &str) -> Self {
        let mut chars: Vec<char> = text.chars().collect();
        chars.sort_unstable();
        chars.dedup();
        Vocab { chars }
    }

    /// The number of characters.
    pub fn len(&self) -> usize {
        self.chars.len()
    }

    /// The text of `ids` (ids outside the vocabulary are skipped).
    pub fn decode(&self, ids: &[u32]) -> String {
        ids.iter()
            .filter_map(|&i| self.chars.get(i as usize))
            .collect()
    }

    /// The ids of `text`'s characters (characters outside the vocabulary are an error).
    pub fn encode(&self, text: &str) -> std::result::Result<Vec<u32>, char> {
        text.chars()
            .map(|c| {
                self.chars
                    .binary_search(&c)
                    .map(|i| i as u32)
                    .map_err(|_| c)
            })
            .collect()
    }
}

/// Windows of `block` ids starting every `stride` characters; the target is the window
/// shifted by one.
pub struct CharWindows {
    ids: Vec<u32>,
    block: usize,
    stride: usize,
}

impl CharWindows {
    /// Windows over `ids`.
    pub fn new(ids: Vec<u32>, block: usize, stride: usize) -> Self {
        CharWindows {
            ids,
            block,
            stride: stride.max(1),
        }
    }
}

impl Dataset for CharWindows {
    type Batch = TokenBatch;

    fn len(&self) -> usize {
        match self.ids.len().checked_sub(self.block + 1) {
            Some(room) => room / self.stride + 1,
            None => 0,
        }
    }

    fn tokens_per_sample(&self) -> usize {
        self.block
    }

    fn batch(&self, indices: &[usize], device: &Device) -> Result<Self::Batch> {
        let window = |off: usize| -> Vec<u32> {
            indices
                .iter()
                .flat_map(|&i| {
                    self.ids[i * self.stride + off..i * self.stride + off + self.block].to_vec()
                })
                .collect()
        };
        let shape = (indices.len(), self.block);
        Ok(TokenBatch::new(
            Tensor::from_vec(window(0), shape, device)?,
            Tensor::from_vec(window(1), shape, device)?,
        ))
    }
}
