//! `<log dir>/<run name>/metrics.csv`, written by rank 0: one row per optimizer step.
//!
//! The first five columns are deterministic (the same command gives the same values); the
//! last two are wall-clock measurements.

use crate::TrainerError;
use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};

/// The columns, in order.
const HEADER: &str = "step,epoch,train_loss,val_loss,lr,tokens_per_s,epoch_time_s";

/// One row of the file.
pub(crate) struct Row {
    pub(crate) step: usize,
    pub(crate) epoch: usize,
    pub(crate) train_loss: f64,
    /// Empty on steps without validation.
    pub(crate) val_loss: Option<f64>,
    pub(crate) lr: f64,
    /// Tokens (samples times `Dataset::tokens_per_sample`) of the step over its time.
    pub(crate) tokens_per_s: f64,
    /// Seconds since the epoch's first step began.
    pub(crate) epoch_time_s: f64,
}

/// An open metrics file.
pub(crate) struct MetricsCsv {
    path: PathBuf,
    out: BufWriter<File>,
}

impl MetricsCsv {
    /// Creates (or truncates) `dir/metrics.csv` and writes the header.
    pub(crate) fn create(dir: &Path) -> Result<Self, TrainerError> {
        let path = dir.join("metrics.csv");
        let io = |source| TrainerError::Io {
            path: path.clone(),
            source,
        };
        std::fs::create_dir_all(dir).map_err(io)?;
        let mut out = BufWriter::new(File::create(&path).map_err(io)?);
        writeln!(out, "{HEADER}").map_err(io)?;
        Ok(MetricsCsv { path, out })
    }

    /// Appends one row.
    pub(crate) fn row(&mut self, r: &Row) -> Result<(), TrainerError> {
        let val = r.val_loss.map(|v| v.to_string()).unwrap_or_default();
        writeln!(
            self.out,
            "{},{},{},{val},{},{:.1},{:.3}",
            r.step, r.epoch, r.train_loss, r.lr, r.tokens_per_s, r.epoch_time_s
        )
        .map_err(|source| TrainerError::Io {
            path: self.path.clone(),
            source,
        })
    }

    /// Flushes buffered rows to the file.
    pub(crate) fn flush(&mut self) -> Result<(), TrainerError> {
        self.out.flush().map_err(|source| TrainerError::Io {
            path: self.path.clone(),
            source,
        })
    }
}
