//! `PreferenceLm`: a causal language model tuned on preference pairs by DPO or IPO, as
//! TRL's `DPOTrainer` tunes one.

use crate::lora::Adapters;
use crate::scoring::Scoring;
use crate::CausalLm;
use candle_core::{Result, Tensor};
use wick_core::{
    no_grad, OptimizerConfig, PreferenceBatch, ShardedContext, StepMetric, TokenBatch, TrainModule,
    IGNORE_INDEX,
};

/// The loss of a pair, from the policy's and the reference's log-probability ratios of its
/// chosen (c) and rejected (r) completions.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PreferenceLoss {
    /// DPO: `-log σ(β (c - r))` (TRL's `sigmoid`).
    Sigmoid,
    /// IPO: `(c / |c| - r / |r| - 1 / 2β)²`, each ratio over its completion's tokens (TRL's
    /// `ipo`, length-normalised as its authors confirmed to TRL).
    Ipo,
}

/// How a [`PreferenceLm`] is tuned.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct PreferenceConfig {
    /// The loss.
    pub loss: PreferenceLoss,
    /// How far the policy may move from the reference (DPO's β; IPO's τ).
    pub beta: f64,
}

impl Default for PreferenceConfig {
    /// TRL's defaults: the sigmoid loss, β = 0.1.
    fn default() -> Self {
        PreferenceConfig {
            loss: PreferenceLoss::Sigmoid,
            beta: 0.1,
        }
    }
}

/// The metrics TRL's `DPOTrainer` logs, under its names, in the order
/// [`PreferenceLm::take_step_metrics`] gives them.
pub const PREFERENCE_METRICS: [&str; 6] = [
    "rewards/chosen",
    "rewards/rejected",
    "rewards/accuracies",
    "rewards/margins",
    "logps/chosen",
    "logps/rejected",
];

/// A [`CausalLm`] as a `TrainModule` over [`PreferenceBatch`]es: the loss of each pair
/// compares the policy's log-probabilities of its chosen and rejected completions (summed
/// over their counted tokens) with the reference model's.
///
/// The reference is the model as training starts. Under LoRA it is the same model with
/// its adapters off, run without a graph in each step (no second model). Otherwise the
/// batches carry its log-probabilities, computed by one pass before training (TRL's
/// `precompute_ref_log_probs`; [`PreferenceLm::predict_step`] gives them).
#[derive(Clone)]
pub struct PreferenceLm {
    lm: CausalLm,
    config: PreferenceConfig,
    /// [`PREFERENCE_METRICS`]' sums over this rank's pairs since they were last taken.
    sums: [f64; 6],
    pairs: usize,
}

impl PreferenceLm {
    /// `lm` tuned as `config` says. Errors unless β is positive and finite.
    pub fn new(lm: CausalLm, config: PreferenceConfig) -> Result<Self> {
        if !(config.beta > 0.0 && config.beta.is_finite()) {
            candle_core::bail!("--beta must be positive and finite, got {}", config.beta)
        }
        Ok(PreferenceLm {
            lm,
            config,
            sums: [0.0; 6],
            pairs: 0,
        })
    }

    /// The language model.
    pub fn lm(&self) -> &CausalLm {
        &self.lm
    }

    /// How it is tuned.
    pub fn config(&self) -> PreferenceConfig {
        self.config
    }

    /// Whether batches must carry the reference's log-probabilities: when the model is
    /// tuned whole. Under LoRA the reference is the model with its adapters off.
    pub fn needs_reference_log_probs(&self) -> bool {
        self.lm.lora().is_none()
    }

    /// The reference's log-probabilities of the batch's rows: the batch's own where it
    /// carries them, otherwise the model's with its adapters off (under LoRA).
    fn reference(&self, batch: &PreferenceBatch) -> Result<Tensor> {
        match (&batch.reference, self.lm.lora()) {
            (Some(r), _) => Ok(r.clone()),
            (None, Some(_)) => {
                // No backward goes through the reference: the strategies keep nothing for one.
                no_grad(|| {
                    self.lm
                        .score(&batch.rows, Adapters::Off, Scoring::RowLogProbs)
                })
                .map(|r| r.detach())
            }
            (None, None) => candle_core::bail!(
                "a model tuned whole by preference needs the reference model's log-probabilities \
                 with each batch (computed once before training); this batch has none"
            ),
        }
    }

    /// The mean loss over the batch's pairs, the policy's log-probabilities run with
    /// `adapters`, and (detached) those log-probabilities and the log-ratios to the
    /// reference's.
    fn loss_of(
        &self,
        batch: &PreferenceBatch,
        adapters: Adapters,
    ) -> Result<(Tensor, Tensor, Tensor)> {
        let pairs = batch.pairs()?;
        let policy = self.lm.score(&batch.rows, adapters, Scoring::RowLogProbs)?;
        let ratios = (&policy - self.reference(batch)?)?;
        let losses = match self.config.loss {
            PreferenceLoss::Sigmoid => {
                let delta = (ratios.narrow(0, 0, pairs)? - ratios.narrow(0, pairs, pairs)?)?;
                softplus(&delta.affine(-self.config.beta, 0.0)?)?
            }
            PreferenceLoss::Ipo => {
                let average = (&ratios / completion_tokens(&batch.rows)?)?;
                let delta = (average.narrow(0, 0, pairs)? - average.narrow(0, pairs, pairs)?)?;
                delta.affine(1.0, -0.5 / self.config.beta)?.sqr()?
            }
        };
        Ok((losses.mean(0)?, policy.detach(), ratios.detach()))
    }

    /// Adds the pairs' rewards (β times the log-ratios), accuracies, margins and
    /// log-probabilities to the sums.
    fn measure(&mut self, policy: &Tensor, ratios: &Tensor, pairs: usize) -> Result<()> {
        let beta = self.config.beta;
        let ratios = ratios.to_vec1::<f32>()?;
        let policy = policy.to_vec1::<f32>()?;
        for i in 0..pairs {
            let chosen = beta * ratios[i] as f64;
            let rejected = beta * ratios[pairs + i] as f64;
            let values = [
                chosen,
                rejected,
                f64::from(u8::from(chosen > rejected)),
                chosen - rejected,
                policy[i] as f64,
                policy[pairs + i] as f64,
            ];
            for (sum, v) in self.sums.iter_mut().zip(values) {
                *sum += v;
            }
        }
        self.pairs += pairs;
        Ok(())
    }
}

/// `log(1 + exp(x))`, stable for any x, as `x/2 + |x|/2 + log(1 + exp(-|x|))`: its gradient
/// is exactly 1/2 at 0 whichever subgradient `abs` takes there (the first step of a full
/// fine-tune, where the policy is the reference, sits at 0).
fn softplus(x: &Tensor) -> Result<Tensor> {
    let abs = x.abs()?;
    let tail = (abs.neg()?.exp()? + 1.0)?.log()?;
    (x + &abs)?.affine(0.5, 0.0)? + tail
}

/// The counted targets of each row (its completion's tokens), at least 1: `[rows]`, f32.
fn completion_tokens(rows: &TokenBatch) -> Result<Tensor> {
    let counted = rows
        .targets
        .ne(IGNORE_INDEX)?
        .to_dtype(candle_core::DType::F32)?;
    counted.sum(1)?.maximum(1.0)
}

impl TrainModule for PreferenceLm {
    type Batch = PreferenceBatch;

    fn configure_sharded_model(&mut self, ctx: &ShardedContext) -> Result<()> {
        self.lm.configure_sharded_model(ctx)
    }

    fn configure_optimizers(&self) -> OptimizerConfig {
        self.lm.configure_optimizers()
    }

    fn flops_per_token(&self, seq: usize) -> Option<f64> {
        self.lm.flops_per_token(seq)
    }

    /// The mean loss over the batch's pairs (LoRA's dropout masks drawn as a `CausalLm`'s
    /// training step draws them).
    fn training_step(&mut self, batch: &Self::Batch, batch_idx: usize) -> Result<Tensor> {
        let adapters = self.lm.training_adapters(batch_idx);
        let (loss, policy, ratios) = self.loss_of(batch, adapters)?;
        self.measure(&policy, &ratios, batch.pairs()?)?;
        Ok(loss)
    }

    /// The pairs: each counts alike, so the step's loss is the mean over the global batch.
    fn loss_terms(&self, batch: &Self::Batch) -> Option<usize> {
        batch.pairs().ok()
    }

    /// [`PREFERENCE_METRICS`] over this rank's pairs since the last call.
    fn take_step_metrics(&mut self) -> Vec<StepMetric> {
        let count = std::mem::take(&mut self.pairs) as f64;
        let sums = std::mem::take(&mut self.sums);
        PREFERENCE_METRICS
            .iter()
            .zip(sums)
            .map(|(&name, sum)| StepMetric { name, sum, count })
            .collect()
    }

    fn validation_step(&mut self, batch: &Self::Batch, _: usize) -> Result<Option<Tensor>> {
        Ok(Some(self.loss_of(batch, Adapters::On(None))?.0))
    }

    fn test_step(&mut self, batch: &Self::Batch, b: usize) -> Result<Option<Tensor>> {
        self.validation_step(batch, b)
    }

    /// The model's log-probabilities of each pair's completions, `[pairs, 2]` (chosen,
    /// rejected): before training, the reference's.
    fn predict_step(&mut self, batch: &Self::Batch, _: usize) -> Result<Tensor> {
        let pairs = batch.pairs()?;
        let rows = self.lm.row_log_probs(&batch.rows)?.detach();
        rows.reshape((2, pairs))?.t()?.contiguous()
    }
}
