//! `TokenBatch`: what a language model trains on, as the trainer's token files make it.

use candle_core::{Result, Tensor};

/// A batch of token windows: the ids a model reads, the ids it predicts, and, for a packed
/// batch, where each token stands in its own document.
///
/// `targets` are `ids` shifted by one; a target of [`crate::IGNORE_INDEX`] (a prompt's,
/// or padding's) is not counted. `positions`, where given, count up from 0 through each
/// document of a row, a 0 starting the next (`transformers`' `position_ids` of a packed
/// batch): attention then keeps within each document and positions restart at each.
/// Without them each row is one sequence, its positions `0..time`.
#[derive(Clone, Debug)]
pub struct TokenBatch {
    /// `[batch, time]`, u32.
    pub ids: Tensor,
    /// `[batch, time]`, u32.
    pub targets: Tensor,
    /// `[batch, time]`, u32, for rows that hold several documents.
    pub positions: Option<Tensor>,
}

impl TokenBatch {
    /// Rows of one sequence each.
    pub fn new(ids: Tensor, targets: Tensor) -> Self {
        TokenBatch {
            ids,
            targets,
            positions: None,
        }
    }

    /// Rows of several documents, `positions` restarting at each.
    pub fn packed(ids: Tensor, targets: Tensor, positions: Tensor) -> Self {
        TokenBatch {
            ids,
            targets,
            positions: Some(positions),
        }
    }

    /// How many targets count (are not [`crate::IGNORE_INDEX`]).
    pub fn counted(&self) -> Result<usize> {
        let ids = self.targets.flatten_all()?.to_vec1::<u32>()?;
        Ok(ids.iter().filter(|&&t| t != crate::IGNORE_INDEX).count())
    }
}
