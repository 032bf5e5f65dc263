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
