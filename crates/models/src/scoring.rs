//! `Scoring`: what a model's output head makes of the last hidden states and the targets,
//! the training loss or each row's log-probability, always fused with the output
//! projection so that on the CPU the logits never exist whole.

use candle_core::{Result, Tensor};
use wick_nn::{head_score, HeadScore, LayerWeight};

/// What the output head computes against the targets.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Scoring {
    /// The mean cross-entropy over the counted targets ([`wick_nn::head_score`]).
    MeanLoss,
    /// Each row's counted targets' log-probabilities, summed over the row: `[batch]`, f32
    /// ([`wick_nn::head_score`]), what preference tuning compares.
    RowLogProbs,
}

/// The fused op a family's head applies to its output weight and the hidden rows.
pub(crate) struct HeadOp {
    scoring: Scoring,
    targets: Tensor,
    softcap: Option<f64>,
}

impl Scoring {
    /// The last hidden states `hidden` (`[batch, time, width]`) as rows
    /// (`[batch * time, width]`), and the op that scores them against `targets`
    /// (`[batch, time]`, u32) once given the output weight, logits soft-capped at `softcap`
    /// (Gemma 2) where given. The head's result goes to [`Scoring::finish`].
    pub(crate) fn head_op(
        self,
        hidden: &Tensor,
        targets: &Tensor,
        softcap: Option<f64>,
    ) -> Result<(Tensor, HeadOp)> {
        let (b, t, c) = hidden.dims3()?;
        let op = HeadOp {
            scoring: self,
            targets: targets.reshape(b * t)?,
            softcap,
        };
        Ok((hidden.reshape((b * t, c))?, op))
    }

    /// The score of `targets` (`[batch, time]`) from what the head's op gave.
    pub(crate) fn finish(self, out: Tensor, targets: &Tensor) -> Result<Tensor> {
        match self {
            Scoring::MeanLoss => Ok(out),
            Scoring::RowLogProbs => out.reshape(targets.dims2()?)?.sum(1),
        }
    }
}

impl HeadOp {
    /// The op on the output `weight` (`[vocab, width]`, dense or quantized) and the rows `x`.
    pub(crate) fn apply(&self, weight: &LayerWeight, x: &Tensor) -> Result<Tensor> {
        let score = match self.scoring {
            Scoring::MeanLoss => HeadScore::MeanLoss,
            Scoring::RowLogProbs => HeadScore::LogProbs,
        };
        head_score(score, x, weight, &self.targets, self.softcap)
    }
}
