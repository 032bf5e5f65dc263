//! Where a fit's step records go on rank 0: an open set of [`StepSink`]s. The metrics
//! file and the training bar are the trainer's own; a program adds its own with
//! [`TrainerBuilder::sink`](crate::TrainerBuilder::sink). The loop calls them; none of
//! them decides anything.

use crate::TrainerError;

/// What one optimizer step reports to the sinks (on rank 0). The first six fields and
/// `grad_norm` are deterministic (the same command gives the same values); the others are
/// wall-clock and memory measurements.
#[derive(Debug, Clone, PartialEq)]
pub struct StepRecord {
    /// Optimizer steps taken so far, this one included.
    pub step: usize,
    /// The epoch of the step, from 0.
    pub epoch: usize,
    /// The step's loss, averaged over the ranks.
    pub train_loss: f64,
    /// The validation loss, on steps that validated.
    pub val_loss: Option<f64>,
    /// The learning rate the step used.
    pub lr: f64,
    /// Steps skipped so far for inf or NaN gradients.
    pub skipped_steps: usize,
    /// Tokens (samples times `Dataset::tokens_per_sample`) of the step over its time.
    pub tokens_per_s: f64,
    /// Seconds since the epoch's first step began.
    pub epoch_time_s: f64,
    /// Seconds of the step rank 0 spent in collectives: blocking calls, and waits for calls
    /// started ahead (the communication that overlap did not hide).
    pub comm_wait_s: f64,
    /// The global L2 norm of the reduced gradients before clipping (`None` on a skipped
    /// step): torchtitan's `grad_norm`.
    pub grad_norm: Option<f64>,
    /// The peak memory of rank 0's device during the step, in bytes: on the CPU the
    /// process's resident memory (Linux's `VmHWM`, reset as the step starts; every rank that
    /// is a thread of it counts), on a GPU its memory pool's.
    pub peak_memory_bytes: Option<u64>,
    /// The model FLOPs utilisation of the step: `tokens_per_s` times the module's
    /// [`TrainModule::flops_per_token`](wick_core::TrainModule::flops_per_token) over the
    /// world's matmul peak, measured as the fit starts (`None` for a module that gives no
    /// FLOPs).
    pub mfu: Option<f64>,
    /// What the module measured over the step's global batch
    /// ([`TrainModule::take_step_metrics`](wick_core::TrainModule::take_step_metrics)),
    /// by name: TRL's `rewards/chosen` and the like.
    pub module_metrics: Vec<(&'static str, f64)>,
}

/// A destination for what each optimizer step reports, called on rank 0 only (under a
/// launcher, in rank 0's process).
///
/// An error ends the fit with it: a metrics file that cannot be written is the fit's error,
/// never a silent gap.
pub trait StepSink: Send {
    /// A step ended with `record`.
    fn step_end(&mut self, record: &StepRecord) -> Result<(), TrainerError>;

    /// The fit ended, or stopped on a preemption: write out what is buffered.
    fn finish(&mut self) -> Result<(), TrainerError> {
        Ok(())
    }

    /// The fit failed (an error or a panic on this rank, or a peer's): write out what is
    /// buffered and record the failure where the sink can. It runs before the rank reports
    /// its error, so also under a launcher, whose job ends at that report. The default
    /// writes out what is buffered, as [`StepSink::finish`] does.
    fn fail(&mut self) -> Result<(), TrainerError> {
        self.finish()
    }
}

/// A sink behind a pointer (`&mut S`, `Box<S>`) is the sink itself: each call goes to it.
macro_rules! forward_step_sink {
    ($($pointer:ty),+) => {$(
        impl<S: StepSink + ?Sized> StepSink for $pointer {
            fn step_end(&mut self, record: &StepRecord) -> Result<(), TrainerError> {
                (**self).step_end(record)
            }

            fn finish(&mut self) -> Result<(), TrainerError> {
                (**self).finish()
            }

            fn fail(&mut self) -> Result<(), TrainerError> {
                (**self).fail()
            }
        }
    )+};
}

forward_step_sink!(&mut S, Box<S>);

/// The sinks of one fit, in the order they are called: empty on ranks other than 0.
/// Dropped before [`StepSinks::finish`] (the fit returned an error or unwinds from a
/// panic), they fail every sink.
#[derive(Default)]
pub(crate) struct StepSinks<'a> {
    sinks: Vec<Box<dyn StepSink + 'a>>,
    finished: bool,
}

impl Drop for StepSinks<'_> {
    fn drop(&mut self) {
        if self.finished {
            return;
        }
        for sink in &mut self.sinks {
            if let Err(e) = sink.fail() {
                log::warn!("a step sink could not record the failed fit: {e}");
            }
        }
    }
}

impl<'a> StepSinks<'a> {
    /// Adds `sink` after the others.
    pub(crate) fn push(&mut self, sink: impl StepSink + 'a) {
        self.sinks.push(Box::new(sink));
    }

    /// A step ended with `record`: every sink is told.
    pub(crate) fn step_end(&mut self, record: &StepRecord) -> Result<(), TrainerError> {
        self.sinks.iter_mut().try_for_each(|s| s.step_end(record))
    }

    /// The fit ended: every sink finishes.
    pub(crate) fn finish(&mut self) -> Result<(), TrainerError> {
        self.finished = true;
        self.sinks.iter_mut().try_for_each(|s| s.finish())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Counts what it is told: (steps, finishes, failures).
    #[derive(Default)]
    struct Tally(usize, usize, usize);

    impl StepSink for Tally {
        fn step_end(&mut self, _: &StepRecord) -> Result<(), TrainerError> {
            self.0 += 1;
            Ok(())
        }
        fn finish(&mut self) -> Result<(), TrainerError> {
            self.1 += 1;
            Ok(())
        }
        fn fail(&mut self) -> Result<(), TrainerError> {
            self.2 += 1;
            Ok(())
        }
    }

    #[test]
    fn sinks_dropped_unfinished_are_failed_and_finished_ones_are_not() {
        let mut failed = Tally::default();
        let mut finished = Tally::default();
        {
            let mut sinks = StepSinks::default();
            sinks.push(&mut failed);
            // An error returned through the fit, or a panic unwinding it, drops them here.
        }
        {
            let mut sinks = StepSinks::default();
            sinks.push(&mut finished);
            sinks.finish().unwrap();
        }
        assert_eq!((failed.1, failed.2), (0, 1));
        assert_eq!((finished.1, finished.2), (1, 0));
    }
}
