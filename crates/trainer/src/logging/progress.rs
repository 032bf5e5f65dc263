//! Live progress on standard output (indicatif): a training bar and, below it while a pass
//! runs, a validation or test bar. Drawn by rank 0 only, and only when standard output is a
//! terminal, so logs and pipes get no control characters.

use crate::logging::sinks::{StepRecord, StepSink};
use crate::TrainerError;
use indicatif::{MultiProgress, ProgressBar, ProgressDrawTarget, ProgressStyle};
use std::io::IsTerminal;

/// The bars of one rank-0 run.
pub(crate) struct Progress {
    bars: MultiProgress,
}

impl Progress {
    /// The bars, or `None` when `on` is false or standard output is not a terminal.
    pub(crate) fn new_if_terminal(on: bool) -> Option<Self> {
        (on && std::io::stdout().is_terminal()).then(|| Progress {
            bars: MultiProgress::with_draw_target(ProgressDrawTarget::stdout()),
        })
    }

    /// The training bar over `total` optimizer steps, starting at `done` (a resumed run).
    pub(crate) fn train(&self, total: usize, done: usize) -> TrainBar {
        let bar = self.bars.add(ProgressBar::new(total as u64));
        bar.set_style(style(
            "train {bar:30.cyan/blue} step {pos}/{len} {msg} ETA {eta}",
        ));
        bar.set_position(done as u64);
        // ETA from this run's steps only, not from the resumed ones.
        bar.reset_eta();
        TrainBar(bar)
    }

    /// Runs `print` (text for standard output) with the bars hidden, so they redraw below it.
    pub(crate) fn suspend(&self, print: impl FnOnce()) {
        self.bars.suspend(print)
    }

    /// A bar over `batches` of an evaluation pass named `name`, removed when it finishes.
    pub(crate) fn eval(&self, name: &str, batches: usize) -> ProgressBar {
        let bar = self.bars.add(ProgressBar::new(batches as u64));
        bar.set_style(style(&format!(
            "{name:<5} {{bar:30.green/blue}} batch {{pos}}/{{len}}"
        )));
        bar
    }
}

/// A bar style from `template`; the templates are constants, so a bad one is a bug.
fn style(template: &str) -> ProgressStyle {
    ProgressStyle::with_template(template)
        .expect("progress templates are valid")
        .progress_chars("=> ")
}

/// The training bar, a sink of the fit's steps: each moves it on, with the step's loss and
/// throughput.
pub(crate) struct TrainBar(ProgressBar);

impl StepSink for TrainBar {
    fn step_end(&mut self, record: &StepRecord) -> Result<(), TrainerError> {
        let (loss, tokens_per_s) = (record.train_loss, record.tokens_per_s);
        self.0
            .set_message(format!("loss {loss:.4} {tokens_per_s:.0} tokens/s"));
        self.0.set_position(record.step as u64);
        Ok(())
    }

    fn finish(&mut self) -> Result<(), TrainerError> {
        self.0.finish();
        Ok(())
    }
}
