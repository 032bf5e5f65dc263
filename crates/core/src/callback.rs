//! Callbacks: code that observes a run without being part of the model.

use crate::Stage;
use candle_core::Result;
use std::cell::{Cell, RefCell};
use std::collections::BTreeMap;

/// Where a run is, as seen by callback hooks.
#[derive(Debug, Clone, Default)]
pub struct RunState {
    /// This rank.
    pub rank: usize,
    /// The number of ranks.
    pub world_size: usize,
    /// Optimizer steps taken so far.
    pub global_step: usize,
    /// The current epoch, from 0.
    pub epoch: usize,
    /// The last value of each logged metric (`train_loss`, `val_loss`, `test_loss`), averaged over ranks.
    pub metrics: BTreeMap<String, f64>,
    /// The learning rate of the last optimizer step (the schedule's rate).
    pub lr: f64,
    /// Values hooks logged with [`RunState::log`], not yet in `metrics`.
    logged: RefCell<BTreeMap<String, f64>>,
    /// Whether a hook asked with [`RunState::request_stop`].
    stop: Cell<bool>,
}

impl RunState {
    /// The state of rank `rank` of `world_size` before any step.
    pub fn new(rank: usize, world_size: usize) -> Self {
        RunState {
            rank,
            world_size,
            ..RunState::default()
        }
    }

    /// Logs `value` as the metric `name`: the trainer adds it to `metrics` (and to what fit
    /// returns) when the hook returns. A hook that logs the same value on every rank keeps
    /// the metrics the same on every rank.
    pub fn log(&self, name: &str, value: f64) {
        self.logged.borrow_mut().insert(name.to_string(), value);
    }

    /// Asks the trainer to end `fit` after this step. The ranks decide together: if any
    /// rank asks, every rank stops at the same step.
    pub fn request_stop(&self) {
        self.stop.set(true);
    }

    /// The values logged since the last call (for the trainer).
    pub fn take_logged(&self) -> BTreeMap<String, f64> {
        std::mem::take(&mut *self.logged.borrow_mut())
    }

    /// Whether a stop was asked since the last call (for the trainer).
    pub fn take_stop_request(&self) -> bool {
        self.stop.replace(false)
    }
}

/// Hooks into a run; every one has an empty default, so a callback implements only what it
/// needs. Callbacks run on every rank; each rank gets its own clone, made before the stage.
pub trait Callback: CallbackClone + Send {
    /// Start of a stage, before the module's `setup`.
    fn setup(&mut self, _state: &RunState, _stage: Stage) -> Result<()> {
        Ok(())
    }
    /// After the module's `configure_sharded_model`, outside the sharding context.
    fn on_configure_sharded_model(&mut self, _state: &RunState) -> Result<()> {
        Ok(())
    }
    /// Before the first training batch (before the module's `on_fit_start`).
    fn on_fit_start(&mut self, _state: &RunState) -> Result<()> {
        Ok(())
    }
    /// After each optimizer step.
    fn on_train_batch_end(&mut self, _state: &RunState) -> Result<()> {
        Ok(())
    }
    /// Before a validation pass.
    fn on_validation_start(&mut self, _state: &RunState) -> Result<()> {
        Ok(())
    }
    /// After a validation pass; `state.metrics["val_loss"]` holds its result.
    fn on_validation_end(&mut self, _state: &RunState) -> Result<()> {
        Ok(())
    }
    /// After a test pass; `state.metrics["test_loss"]` holds its result.
    fn on_test_end(&mut self, _state: &RunState) -> Result<()> {
        Ok(())
    }
    /// After a predict pass.
    fn on_predict_end(&mut self, _state: &RunState) -> Result<()> {
        Ok(())
    }
    /// After the last training batch (before the module's `on_fit_end`).
    fn on_fit_end(&mut self, _state: &RunState) -> Result<()> {
        Ok(())
    }
    /// End of a stage.
    fn teardown(&mut self, _state: &RunState, _stage: Stage) -> Result<()> {
        Ok(())
    }
}

/// Clones a boxed callback; implemented for every `Callback + Clone`.
pub trait CallbackClone {
    /// A new box holding a clone of this callback.
    fn clone_box(&self) -> Box<dyn Callback>;
}

impl<T: Callback + Clone + 'static> CallbackClone for T {
    fn clone_box(&self) -> Box<dyn Callback> {
        Box::new(self.clone())
    }
}
