//! `<log dir>/<run name>/metrics.csv`, written by rank 0: one row per optimizer step.

use crate::TrainerError;
use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};

/// The columns, in order.
const HEADER: &str = "step,epoch,train_loss,val_loss";

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

    /// Appends one row; `val_loss` is empty on steps without validation.
    pub(crate) fn row(
        &mut self,
        step: usize,
        epoch: usize,
        train_loss: f64,
        val_loss: Option<f64>,
    ) -> Result<(), TrainerError> {
        let val = val_loss.map(|v| v.to_string()).unwrap_or_default();
        writeln!(self.out, "{step},{epoch},{train_loss},{val}").map_err(|source| TrainerError::Io {
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
