//! Each step's end time, and the quiet trainers that record it.

use candle_core::Result;
use std::sync::{Arc, Mutex};
use std::time::Instant;
use wick::accelerator::Accelerator;
use wick::core::{Callback, RunState, Strategy};
use wick::trainer::{Attached, DataLoader, Dataset, Replicate, Trainer};

use crate::data::Steps;

/// The median of the step times after the `warmup` steps (`times` are the steps' ends);
/// NaN without any (a process that is not rank 0 records none).
pub(crate) fn median_step(times: &[Instant], warmup: usize) -> f64 {
    let mut steps: Vec<f64> = times
        .windows(2)
        .skip(warmup - 1)
        .map(|w| (w[1] - w[0]).as_secs_f64())
        .collect();
    steps.sort_by(f64::total_cmp);
    steps.get(steps.len() / 2).copied().unwrap_or(f64::NAN)
}

/// The end time of every step, on rank 0, which also prints [`STEADY`] as the measured
/// steps begin if asked to.
#[derive(Clone)]
pub(crate) struct StepClock {
    ends: Arc<Mutex<Vec<Instant>>>,
    pub(crate) steps: Steps,
    announce: bool,
}

/// The line that tells `scripts/rss_peak.py` the measured steps begin (its steady-state
/// peak is taken from there on), as `scripts/torch_baseline.py` prints it too.
pub(crate) const STEADY: &str = "rss_peak steady";

impl StepClock {
    pub(crate) fn new(steps: Steps) -> Self {
        StepClock {
            ends: Arc::default(),
            steps,
            announce: false,
        }
    }

    /// A clock that prints [`STEADY`] after the warm-up steps.
    pub(crate) fn announcing(steps: Steps) -> Self {
        StepClock {
            announce: true,
            ..StepClock::new(steps)
        }
    }

    /// The median time of the measured steps.
    pub(crate) fn median_step(&self) -> f64 {
        median_step(&self.ends.lock().unwrap(), self.steps.warmup)
    }
}

impl Callback for StepClock {
    fn on_train_batch_end(&mut self, state: &RunState) -> Result<()> {
        if state.rank == 0 {
            let mut ends = self.ends.lock().unwrap();
            ends.push(Instant::now());
            if self.announce && ends.len() == self.steps.warmup {
                println!("{STEADY}");
                std::io::Write::flush(&mut std::io::stdout())?;
            }
        }
        Ok(())
    }
}

/// A quiet trainer of `steps` steps with `callback`.
pub(crate) fn quiet_trainer(
    accelerator: Accelerator,
    strategy: Box<dyn Strategy>,
    steps: usize,
    callback: impl Callback + 'static,
) -> anyhow::Result<Trainer> {
    Ok(Trainer::builder()
        .accelerator(accelerator)
        .strategy(strategy)
        .max_steps(steps)
        .seed(1)
        .no_logger()
        .progress(false)
        .model_summary(false)
        .callback(callback)
        .build()?)
}

/// Trains `model` on `data` under `strategy` on `accelerator`'s ranks for `clock`'s steps,
/// quietly, recording each step's end on `clock`; the trained model, for its parameters.
pub(crate) fn timed_fit<M: Replicate, D: Dataset<Batch = M::Batch>>(
    model: M,
    data: &DataLoader<D>,
    strategy: Box<dyn Strategy>,
    accelerator: Accelerator,
    clock: &StepClock,
) -> anyhow::Result<Attached<M>> {
    let steps = clock.steps.total();
    let mut trainer = quiet_trainer(accelerator, strategy, steps, clock.clone())?;
    let mut model = Attached::new(model);
    trainer.fit(&mut model, data, None)?;
    Ok(model)
}
