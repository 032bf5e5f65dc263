//! `EarlyStopping`: end fit when a monitored metric stops improving.

use crate::checkpoint::Mode;
use wick_core::{Callback, RunState};

/// Stops `fit` when the metric `monitor` has not improved by more than `min_delta` for
/// `patience` checks in a row, as Lightning's `EarlyStopping`.
///
/// A metric whose name starts with `val_` is checked after each validation pass; any other
/// after each optimizer step. The trainer's metrics are averaged over the ranks, so every
/// rank sees the same value and the same decision, and the trainer stops all ranks after
/// the same step in any case (any rank asking stops all). A missing metric is an error
/// naming it, as in Lightning's `strict` mode.
#[derive(Debug, Clone)]
pub struct EarlyStopping {
    monitor: String,
    mode: Mode,
    patience: usize,
    min_delta: f64,
    best: Option<f64>,
    bad_checks: usize,
}

impl EarlyStopping {
    /// Stops after 3 checks of `monitor` without an improvement in `mode`'s direction.
    pub fn new(monitor: impl Into<String>, mode: Mode) -> Self {
        EarlyStopping {
            monitor: monitor.into(),
            mode,
            patience: 3,
            min_delta: 0.0,
            best: None,
            bad_checks: 0,
        }
    }

    /// Checks without improvement before stopping (Lightning's default is 3).
    pub fn patience(mut self, checks: usize) -> Self {
        self.patience = checks;
        self
    }

    /// The least change that counts as an improvement (absolute, default 0).
    pub fn min_delta(mut self, delta: f64) -> Self {
        self.min_delta = delta.abs();
        self
    }

    fn checks_after_validation(&self) -> bool {
        self.monitor.starts_with("val_")
    }

    fn check(&mut self, state: &RunState) -> candle_core::Result<()> {
        let Some(&value) = state.metrics.get(&self.monitor) else {
            candle_core::bail!(
                "EarlyStopping monitors '{}', which is not among the metrics ({})",
                self.monitor,
                state.metrics.keys().cloned().collect::<Vec<_>>().join(", ")
            )
        };
        let improved = match (self.best, self.mode) {
            (None, _) => value.is_finite(),
            (Some(best), Mode::Min) => value < best - self.min_delta,
            (Some(best), Mode::Max) => value > best + self.min_delta,
        };
        if improved {
            self.best = Some(value);
            self.bad_checks = 0;
        } else {
            self.bad_checks += 1;
        }
        if self.bad_checks >= self.patience {
            if state.rank == 0 {
                log::info!(
                    "EarlyStopping: {} has not improved by more than {} in {} checks (best {}); \
                     stopping after step {}",
                    self.monitor,
                    self.min_delta,
                    self.bad_checks,
                    self.best.map_or("none".into(), |b| b.to_string()),
                    state.global_step
                );
            }
            state.request_stop();
        }
        Ok(())
    }
}

impl Callback for EarlyStopping {
    fn on_train_batch_end(&mut self, state: &RunState) -> candle_core::Result<()> {
        if self.checks_after_validation() {
            return Ok(());
        }
        self.check(state)
    }

    fn on_validation_end(&mut self, state: &RunState) -> candle_core::Result<()> {
        if !self.checks_after_validation() {
            return Ok(());
        }
        self.check(state)
    }
}
