//! A one-line progress bar on standard output, drawn only when it is a terminal.

use std::io::{IsTerminal, Write};
use std::time::Instant;

/// Step, loss, throughput and ETA, redrawn in place.
pub(crate) struct Progress {
    total: usize,
    start: Instant,
}

impl Progress {
    /// A bar for `total` steps, or `None` when standard output is not a terminal.
    pub(crate) fn new_if_terminal(total: usize) -> Option<Self> {
        std::io::stdout().is_terminal().then(|| Progress {
            total,
            start: Instant::now(),
        })
    }

    /// Redraws the bar after `step` steps of `samples_per_step` samples.
    pub(crate) fn update(&self, step: usize, loss: f64, samples_per_step: usize) {
        let elapsed = self.start.elapsed().as_secs_f64().max(1e-9);
        let rate = (step * samples_per_step) as f64 / elapsed;
        let eta = elapsed / step.max(1) as f64 * self.total.saturating_sub(step) as f64;
        let width = 30;
        let filled = (width * step / self.total.max(1)).min(width);
        let mut out = std::io::stdout().lock();
        let _ = write!(
            out,
            "\r[{}{}] step {step}/{} loss {loss:.4} {rate:.0} samples/s ETA {:02}:{:02} ",
            "#".repeat(filled),
            "-".repeat(width - filled),
            self.total,
            (eta as u64) / 60,
            (eta as u64) % 60
        );
        let _ = out.flush();
    }

    /// Ends the bar's line.
    pub(crate) fn finish(&self) {
        println!();
    }
}
