//! A rank's callbacks and the [`RunState`] they are shown.

use crate::TrainerError;
use wick_core::{Callback, RunState};

/// A rank's callbacks, called in order, and the state they see: where the run stands (a
/// copy the loops keep current) and the metrics so far.
pub(crate) struct CallbackList {
    callbacks: Vec<Box<dyn Callback>>,
    pub(crate) state: RunState,
}

impl CallbackList {
    /// `callbacks` on rank `rank` of `world_size`, before any step.
    pub(crate) fn new(callbacks: Vec<Box<dyn Callback>>, rank: usize, world_size: usize) -> Self {
        CallbackList {
            callbacks,
            state: RunState::new(rank, world_size),
        }
    }

    /// Whether there are none (then none can ask to stop).
    pub(crate) fn is_empty(&self) -> bool {
        self.callbacks.is_empty()
    }

    /// Runs `hook` on every callback in order.
    pub(crate) fn call(
        &mut self,
        mut hook: impl FnMut(&mut dyn Callback, &RunState) -> candle_core::Result<()>,
    ) -> Result<(), TrainerError> {
        for cb in self.callbacks.iter_mut() {
            hook(cb.as_mut(), &self.state)?;
            // What a callback logs is visible to the callbacks after it.
            let logged = self.state.take_logged();
            self.state.metrics.extend(logged);
        }
        Ok(())
    }
}
