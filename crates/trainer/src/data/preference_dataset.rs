//! `PreferenceDataset`: the pairs of a preference token file, each a sample of two rows.

use crate::data::data_loader::Dataset;
use crate::{Packing, Split, TokenDataset, TrainerError};
use candle_core::{Device, Tensor};
use std::path::Path;
use std::sync::Arc;
use wick_core::PreferenceBatch;

/// The preference pairs of token files `wick prepare` wrote from `prompt`/`chosen`/
/// `rejected` rows: pair i is documents 2i (the prompt and its chosen completion) and
/// 2i + 1 (the prompt and its rejected one), each one row of `seq` positions (cut to it,
/// padded after it, the prompt's targets and the padding not counted).
///
/// A sample is a pair, so both its rows are always in one batch on one rank; a batch is
/// its pairs' chosen rows, then their rejected rows ([`PreferenceBatch`]), with the
/// reference's log-probabilities of them where given ([`PreferenceDataset::with_reference`]).
#[derive(Clone)]
pub struct PreferenceDataset {
    rows: TokenDataset,
    /// Per pair, the reference's log-probabilities of its (chosen, rejected) rows.
    reference: Option<Arc<Vec<[f32; 2]>>>,
}

impl PreferenceDataset {
    /// Split `split` of the preference token files `paths`, rows of `seq` positions.
    pub fn open_files(
        paths: &[impl AsRef<Path>],
        split: Split,
        seq: usize,
    ) -> Result<Self, TrainerError> {
        let rows = TokenDataset::open_files(paths, split, seq, Some(Packing::Padded))?;
        if !rows.is_paired() {
            return Err(TrainerError::config(
                "objective",
                format!(
                    "{} holds no preference pairs: run wick prepare on rows of prompt, chosen \
                     and rejected",
                    rows.path().display()
                ),
            ));
        }
        // Every document of a pair has a target (prepare refuses one without), so none
        // was dropped from the windows and they pair up.
        if !rows.len().is_multiple_of(2) {
            return Err(TrainerError::config(
                "objective",
                format!(
                    "{}: the '{}' split has {} rows, not pairs of them",
                    rows.path().display(),
                    split.name(),
                    rows.len()
                ),
            ));
        }
        Ok(PreferenceDataset {
            rows,
            reference: None,
        })
    }

    /// The same pairs carrying the reference's log-probabilities of each pair's (chosen,
    /// rejected) rows, one entry per pair in order.
    pub fn with_reference(mut self, reference: Vec<[f32; 2]>) -> Result<Self, TrainerError> {
        if reference.len() != self.len() {
            return Err(TrainerError::config(
                "reference",
                format!(
                    "{} reference log-probability pairs for {} preference pairs",
                    reference.len(),
                    self.len()
                ),
            ));
        }
        self.reference = Some(Arc::new(reference));
        Ok(self)
    }

    /// The rows' dataset (windows of one document each).
    pub fn rows(&self) -> &TokenDataset {
        &self.rows
    }
}

impl Dataset for PreferenceDataset {
    type Batch = PreferenceBatch;

    fn len(&self) -> usize {
        self.rows.len() / 2
    }

    fn batch(&self, indices: &[usize], device: &Device) -> candle_core::Result<PreferenceBatch> {
        let order: Vec<usize> = (indices.iter().map(|&i| 2 * i))
            .chain(indices.iter().map(|&i| 2 * i + 1))
            .collect();
        let rows = self.rows.batch(&order, device)?;
        let reference = match &self.reference {
            Some(r) => {
                let values: Vec<f32> = (indices.iter().map(|&i| r[i][0]))
                    .chain(indices.iter().map(|&i| r[i][1]))
                    .collect();
                Some(Tensor::from_vec(values, order.len(), device)?)
            }
            None => None,
        };
        PreferenceBatch::new(rows, reference)
    }

    fn tokens_per_sample(&self) -> usize {
        2 * self.rows.seq()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::TokenFileWriter;
    use wick_core::IGNORE_INDEX;

    #[test]
    fn a_pair_is_one_sample_its_chosen_row_first_and_the_reference_rides_along() {
        let (dir, path) = crate::data::scratch_file("pairs.safetensors");
        let mut w = TokenFileWriter::create(&path, 100, true).unwrap().paired();
        // Pair p: a prompt [p, p] and a completion of p + 1 (chosen) or p + 2 (rejected)
        // tokens, each token 10 p + its place, closed by 99.
        for p in 0..4u32 {
            for extra in [1, 2] {
                let n = 2 + p + extra;
                let ids: Vec<u32> = (0..n).map(|i| 10 * p + i).chain([99]).collect();
                let counted: Vec<bool> = (0..=n).map(|i| i >= 2).collect();
                w.push(&ids, Some(&counted)).unwrap();
            }
        }
        w.finish(0.0, "h").unwrap();
        let pairs = PreferenceDataset::open_files(&[&path], Split::Train, 8).unwrap();
        assert_eq!(pairs.len(), 4);
        let pairs = pairs
            .with_reference((0..4).map(|p| [p as f32, -(p as f32)]).collect())
            .unwrap();
        let b = pairs.batch(&[3, 1], &Device::Cpu).unwrap();
        let ids = b.rows.ids.to_vec2::<u32>().unwrap();
        // Rows: pair 3 chosen, pair 1 chosen, pair 3 rejected, pair 1 rejected.
        let first: Vec<u32> = ids.iter().map(|r| r[0]).collect();
        assert_eq!(first, [30, 10, 30, 10]);
        let counted: Vec<usize> = (b.rows.targets.to_vec2::<u32>().unwrap().iter())
            .map(|r| r.iter().filter(|&&t| t != IGNORE_INDEX).count())
            .collect();
        // A completion of k tokens and the end of text count: k + 1 targets.
        assert_eq!(counted, [5, 3, 6, 4]);
        let reference = b.reference.unwrap().to_vec1::<f32>().unwrap();
        assert_eq!(reference, [3.0, 1.0, -3.0, -1.0]);
        // A file of single examples is not pairs.
        let single = dir.path().join("single.safetensors");
        let mut w = TokenFileWriter::create(&single, 100, true).unwrap();
        w.push(&[1, 2, 3], Some(&[false, true, true])).unwrap();
        w.finish(0.0, "h").unwrap();
        let e = PreferenceDataset::open_files(&[&single], Split::Train, 8)
            .err()
            .unwrap();
        assert!(e.to_string().contains("no preference pairs"), "{e}");
        // Nor is an odd number of documents a paired file.
        let mut w = TokenFileWriter::create(&single, 100, true)
            .unwrap()
            .paired();
        w.push(&[1, 2, 3], Some(&[false, true, true])).unwrap();
        assert!(w.finish(0.0, "h").is_err());
    }
}
