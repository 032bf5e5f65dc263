//! Where a fit stands.

use wick_core::RunState;

/// The metric under which the skipped steps are reported (to callbacks, in what fit
/// returns, and in a checkpoint's metrics).
pub(crate) const SKIPPED_STEPS_METRIC: &str = "skipped_steps";

/// Where a fit stands, owned by its [`FitLoop`](super::FitLoop): saved in each checkpoint's
/// manifest as typed fields, restored on resume, and copied into the [`RunState`] that
/// callbacks see.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct FitProgress {
    /// Optimizer steps taken.
    pub(crate) step: usize,
    /// The epoch the last step belonged to (the one the fit is in).
    pub(crate) epoch: usize,
    /// Steps skipped for inf or NaN gradients over the run, all ranks alike.
    pub(crate) skipped_steps: usize,
}

impl FitProgress {
    /// Shows the callbacks where the fit stands: the step and epoch, and the skipped steps
    /// among the metrics once a step was taken or resumed.
    pub(crate) fn show(&self, state: &mut RunState) {
        state.global_step = self.step;
        state.epoch = self.epoch;
        if self.step > 0 {
            state
                .metrics
                .insert(SKIPPED_STEPS_METRIC.into(), self.skipped_steps as f64);
        }
    }
}
