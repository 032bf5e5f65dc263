//! `LearningRateMonitor`: the learning rate of each step in the metrics.

use wick_core::{Callback, RunState};

/// Logs the learning rate of each optimizer step as the metric `lr` (so it reaches what
/// `fit` returns, checkpoints' metrics and other callbacks). The metrics CSV has an `lr`
/// column with or without it.
#[derive(Debug, Clone, Default)]
pub struct LearningRateMonitor;

impl LearningRateMonitor {
    /// A monitor of the optimizer's rate.
    pub fn new() -> Self {
        LearningRateMonitor
    }
}

impl Callback for LearningRateMonitor {
    fn on_train_batch_end(&mut self, state: &RunState) -> candle_core::Result<()> {
        state.log("lr", state.lr);
        Ok(())
    }
}
