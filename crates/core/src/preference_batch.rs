//! `PreferenceBatch`: what preference tuning (DPO, IPO) trains on.

use crate::TokenBatch;
use candle_core::{Result, Tensor};

/// A batch of preference pairs: each pair's prompt followed by its chosen completion, and
/// the same prompt followed by its rejected one.
///
/// `rows` holds `2 × pairs` rows, every pair's chosen row first, then every pair's
/// rejected row in the same order (TRL's concatenated batch, so one forward scores both);
/// the prompt's targets and the padding are not counted. A pair is one sample: both its
/// rows are always in the same batch, on the same rank.
#[derive(Clone, Debug)]
pub struct PreferenceBatch {
    /// The chosen rows, then the rejected rows.
    pub rows: TokenBatch,
    /// The reference model's log-probability of each row's counted targets, summed over
    /// the row (`[2 × pairs]`, f32, in `rows`' order), where computed before training.
    pub reference: Option<Tensor>,
}

impl PreferenceBatch {
    /// The pairs of `rows` (chosen rows, then rejected rows), with the reference's
    /// log-probabilities of them where precomputed. Errors unless the rows pair up and the
    /// reference has one value per row.
    pub fn new(rows: TokenBatch, reference: Option<Tensor>) -> Result<Self> {
        let n = rows.ids.dim(0)?;
        if !n.is_multiple_of(2) {
            candle_core::bail!(
                "a preference batch holds a chosen and a rejected row per pair, got {n} rows"
            )
        }
        if let Some(r) = &reference {
            if r.dims() != [n] {
                candle_core::bail!(
                    "the reference log-probabilities have shape {:?}, not one per row ([{n}])",
                    r.dims()
                )
            }
        }
        Ok(PreferenceBatch { rows, reference })
    }

    /// The number of pairs.
    pub fn pairs(&self) -> Result<usize> {
        Ok(self.rows.ids.dim(0)? / 2)
    }
}
