//! Where a fit's step reports go on rank 0: the metrics file and the training bar, and the
//! model summary after the first step. The loop calls them; none of them decides anything.

use crate::metrics_csv::{MetricsCsv, Row};
use crate::progress::train_message;
use crate::rank_run::RankRun;
use crate::TrainerError;
use indicatif::ProgressBar;
use wick_core::TrainModule;

/// The outputs of one fit's steps: each is absent on ranks other than 0, and the bar also
/// when standard output is not a terminal.
pub(crate) struct StepSinks {
    csv: Option<MetricsCsv>,
    bar: Option<ProgressBar>,
}

impl StepSinks {
    pub(crate) fn new(csv: Option<MetricsCsv>, bar: Option<ProgressBar>) -> Self {
        StepSinks { csv, bar }
    }

    /// A step ended with `row`: one line of the metrics file, the bar moved on.
    pub(crate) fn step_end(&mut self, row: &Row) -> Result<(), TrainerError> {
        if let Some(csv) = self.csv.as_mut() {
            csv.row(row)?;
        }
        if let Some(bar) = &self.bar {
            bar.set_message(train_message(row.train_loss, row.tokens_per_s));
            bar.set_position(row.step as u64);
        }
        Ok(())
    }

    /// The fit ended: the bar finished, the metrics file written out.
    pub(crate) fn finish(&mut self) -> Result<(), TrainerError> {
        if let Some(bar) = &self.bar {
            bar.finish();
        }
        if let Some(csv) = self.csv.as_mut() {
            csv.flush()?;
        }
        Ok(())
    }
}

impl<M: TrainModule> RankRun<'_, M> {
    /// The model summary, on rank 0 if asked for, printed above the bars.
    pub(crate) fn print_model_summary(&self) {
        if self.env.rank != 0 || !self.config.model_summary {
            return;
        }
        let summary = crate::summary::model_summary(&*self.strategy, self.env.world_size);
        match &self.progress {
            Some(p) => p.suspend(|| print!("{summary}")),
            None => print!("{summary}"),
        }
    }
}
