//! `<log dir>/<run name>/metrics.csv`, written by rank 0: one row per optimizer step.
//!
//! The first six columns and `grad_norm` are deterministic (the same command gives the same
//! values); the others are wall-clock and memory measurements (`mfu` empty for a module that
//! gives no FLOPs). What the module measures itself (`rewards/chosen` and the like) follows
//! in columns of its names, which the header gains with the first row. A resumed run continues its run's file: the rows
//! up to the checkpoint's step stay, later ones (from a run that went further) go. The file
//! is written under a temporary name and takes its real one with the first new row, so a
//! run that fails before its first step leaves the old file as it was.

use crate::logging::sinks::{StepRecord, StepSink};
use crate::TrainerError;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};

/// The columns, in order.
const HEADER: &str = "step,epoch,train_loss,val_loss,lr,skipped_steps,tokens_per_s,epoch_time_s,\
                      comm_wait_s,grad_norm,peak_memory_gib,mfu";

/// The header of files written before `grad_norm`, `peak_memory_gib` and `mfu`: a resumed
/// run continues such a file, its old rows given empty cells for the new columns.
const HEADER_BEFORE_GRAD_NORM: &str =
    "step,epoch,train_loss,val_loss,lr,skipped_steps,tokens_per_s,epoch_time_s,comm_wait_s";

/// Bytes in a GiB, the unit of `peak_memory_gib`.
const GIB: f64 = (1u64 << 30) as f64;

/// An open metrics file.
pub(crate) struct MetricsCsv {
    path: PathBuf,
    /// Where the file is written until its first new row: then it is renamed to `path`
    /// (the open file keeps its handle) and this is `None`.
    pending: Option<PathBuf>,
    out: BufWriter<std::fs::File>,
    /// The module's metrics' columns, known from the first row.
    module_columns: Option<Vec<&'static str>>,
}

impl MetricsCsv {
    /// Creates `dir/metrics.csv` and writes the header.
    pub(crate) fn create(dir: &Path) -> Result<Self, TrainerError> {
        Self::open(dir, |_| Ok(String::new()))
    }

    /// Continues `dir/metrics.csv` after optimizer step `step`: its rows up to that step
    /// stay, later ones are dropped (with the first new row). A missing file is created.
    pub(crate) fn resume(dir: &Path, step: usize) -> Result<Self, TrainerError> {
        Self::open(dir, |path| {
            let text = match std::fs::read_to_string(path) {
                Ok(text) => text,
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(String::new()),
                Err(e) => return Err(e),
            };
            let mut lines = text.lines();
            let padding = match lines.next() {
                // The module's columns, if any, are this run's module's too.
                Some(header) if header.starts_with(HEADER) => "",
                Some(HEADER_BEFORE_GRAD_NORM) => ",,,",
                _ => {
                    return Err(std::io::Error::other(format!(
                        "its header is not `{HEADER}`, so this run cannot continue it; give \
                         the run another name"
                    )))
                }
            };
            let kept = lines.take_while(|line| {
                let row_step = line.split(',').next().and_then(|s| s.parse::<usize>().ok());
                row_step.is_some_and(|s| s <= step)
            });
            Ok(kept.map(|l| format!("{l}{padding}\n")).collect())
        })
    }

    /// Writes the header and the rows `kept` returns (from the file's old contents) under a
    /// temporary name, now, so that a path that cannot be written fails before training;
    /// keeps it open for appending.
    fn open(
        dir: &Path,
        kept: impl FnOnce(&Path) -> std::io::Result<String>,
    ) -> Result<Self, TrainerError> {
        let path = dir.join("metrics.csv");
        let io = |cause| TrainerError::Io {
            path: path.clone(),
            cause,
        };
        std::fs::create_dir_all(dir).map_err(io)?;
        let rows = kept(&path).map_err(io)?;
        let tmp = dir.join("metrics.csv.tmp");
        std::fs::write(&tmp, format!("{HEADER}\n{rows}")).map_err(io)?;
        let file = std::fs::OpenOptions::new()
            .append(true)
            .open(&tmp)
            .map_err(io)?;
        Ok(MetricsCsv {
            path,
            pending: Some(tmp),
            out: BufWriter::new(file),
            module_columns: None,
        })
    }

    /// The file.
    pub(crate) fn path(&self) -> &Path {
        &self.path
    }

    /// Appends one row (the first puts the file in place of the old one).
    pub(crate) fn row(&mut self, r: &StepRecord) -> Result<(), TrainerError> {
        let path = self.path.clone();
        let io = |cause| TrainerError::Io {
            path: path.clone(),
            cause,
        };
        let cell = |v: Option<String>| v.unwrap_or_default();
        let val = cell(r.val_loss.map(|v| v.to_string()));
        let norm = cell(r.grad_norm.map(|v| v.to_string()));
        let memory = cell(
            r.peak_memory_bytes
                .map(|b| format!("{:.3}", b as f64 / GIB)),
        );
        let mfu = cell(r.mfu.map(|u| format!("{u:.4}")));
        let module = self.module_cells(r).map_err(io)?;
        writeln!(
            self.out,
            "{},{},{},{val},{},{},{:.1},{:.3},{:.6},{norm},{memory},{mfu}{module}",
            r.step,
            r.epoch,
            r.train_loss,
            r.lr,
            r.skipped_steps,
            r.tokens_per_s,
            r.epoch_time_s,
            r.comm_wait_s
        )
        .map_err(io)?;
        // Every row reaches the file at once: a run that is watched (or killed) shows
        // every step it finished.
        self.out.flush().map_err(io)?;
        if let Some(tmp) = self.pending.take() {
            std::fs::rename(&tmp, &self.path).map_err(io)?;
        }
        Ok(())
    }

    /// The cells of the module's metrics (`,a,b`), in the columns the first row set; the
    /// header gains those columns with it (while the file is still this run's own copy).
    fn module_cells(&mut self, r: &StepRecord) -> std::io::Result<String> {
        let names: Vec<&'static str> = r.module_metrics.iter().map(|(n, _)| *n).collect();
        let columns = match &self.module_columns {
            Some(columns) => columns,
            None => {
                if let (Some(tmp), false) = (&self.pending, names.is_empty()) {
                    self.out.flush()?;
                    let text = std::fs::read_to_string(tmp)?;
                    let rows = text.split_once('\n').map_or("", |(_, rows)| rows);
                    std::fs::write(tmp, format!("{HEADER},{}\n{rows}", names.join(",")))?;
                    let file = std::fs::OpenOptions::new().append(true).open(tmp)?;
                    self.out = BufWriter::new(file);
                }
                self.module_columns.insert(names.clone())
            }
        };
        if !names.is_empty() && &names != columns {
            return Err(std::io::Error::other(format!(
                "the module's metrics changed from {columns:?} to {names:?} mid-run"
            )));
        }
        let mut cells = String::new();
        for (i, _) in columns.iter().enumerate() {
            cells.push(',');
            if let Some((_, v)) = r.module_metrics.get(i) {
                cells.push_str(&v.to_string());
            }
        }
        Ok(cells)
    }

    /// Flushes buffered rows to the file.
    pub(crate) fn flush(&mut self) -> Result<(), TrainerError> {
        self.out.flush().map_err(|cause| TrainerError::Io {
            path: self.path.clone(),
            cause,
        })
    }
}

impl StepSink for MetricsCsv {
    fn step_end(&mut self, record: &StepRecord) -> Result<(), TrainerError> {
        self.row(record)
    }

    fn finish(&mut self) -> Result<(), TrainerError> {
        self.flush()
    }
}

impl Drop for MetricsCsv {
    /// A file that never got a new row was never this run's: its temporary copy goes.
    fn drop(&mut self) {
        if let Some(tmp) = self.pending.take() {
            let _ = std::fs::remove_file(tmp);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(step: usize) -> StepRecord {
        StepRecord {
            step,
            epoch: 0,
            train_loss: step as f64,
            val_loss: None,
            lr: 0.1,
            skipped_steps: 0,
            tokens_per_s: 1.0,
            epoch_time_s: 1.0,
            comm_wait_s: 0.0,
            grad_norm: Some(0.5),
            peak_memory_bytes: Some(3 << 29),
            mfu: Some(0.125),
            module_metrics: vec![],
        }
    }

    fn steps(dir: &Path) -> Vec<String> {
        std::fs::read_to_string(dir.join("metrics.csv"))
            .unwrap()
            .lines()
            .skip(1)
            .map(|l| l.split(',').next().unwrap().to_string())
            .collect()
    }

    #[test]
    fn a_modules_metrics_get_columns_of_their_names_kept_through_a_resume() {
        let dir = tempfile::tempdir().unwrap();
        let measured = |step: usize| StepRecord {
            module_metrics: vec![("rewards/chosen", step as f64), ("logps/chosen", -2.5)],
            ..row(step)
        };
        let mut csv = MetricsCsv::create(dir.path()).unwrap();
        (1..=3).for_each(|s| csv.row(&measured(s)).unwrap());
        drop(csv);
        let mut csv = MetricsCsv::resume(dir.path(), 2).unwrap();
        csv.row(&measured(3)).unwrap();
        let e = csv.row(&StepRecord {
            module_metrics: vec![("other", 1.0)],
            ..row(4)
        });
        assert!(e.unwrap_err().to_string().contains("changed"));
        drop(csv);
        let text = std::fs::read_to_string(dir.path().join("metrics.csv")).unwrap();
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines[0], format!("{HEADER},rewards/chosen,logps/chosen"));
        assert_eq!(lines.len(), 4, "{text}");
        for (i, line) in lines[1..].iter().enumerate() {
            assert!(line.ends_with(&format!(",{},-2.5", i + 1)), "{text}");
        }
    }

    #[test]
    fn a_resumed_run_keeps_the_rows_up_to_its_step_and_replaces_the_rest() {
        let dir = tempfile::tempdir().unwrap();
        let mut csv = MetricsCsv::create(dir.path()).unwrap();
        (1..=6).for_each(|s| csv.row(&row(s)).unwrap());
        csv.flush().unwrap();
        drop(csv);
        // A resumed run that fails before its first step changes nothing.
        drop(MetricsCsv::resume(dir.path(), 4).unwrap());
        assert_eq!(steps(dir.path()), ["1", "2", "3", "4", "5", "6"]);
        assert!(!dir.path().join("metrics.csv.tmp").exists());
        let mut csv = MetricsCsv::resume(dir.path(), 4).unwrap();
        csv.row(&row(5)).unwrap();
        assert_eq!(steps(dir.path()), ["1", "2", "3", "4", "5"]);
        (6..=8).for_each(|s| csv.row(&row(s)).unwrap());
        csv.flush().unwrap();
        assert_eq!(steps(dir.path()), ["1", "2", "3", "4", "5", "6", "7", "8"]);
        let text = std::fs::read_to_string(dir.path().join("metrics.csv")).unwrap();
        assert!(
            text.lines().nth(1).unwrap().ends_with(",0.5,1.500,0.1250"),
            "{text}"
        );
        // A file of the columns before grad_norm continues, its rows padded.
        std::fs::write(
            dir.path().join("metrics.csv"),
            format!("{HEADER_BEFORE_GRAD_NORM}\n1,0,2.5,,0.01,0,10.0,0.100,0.000000\n"),
        )
        .unwrap();
        let mut csv = MetricsCsv::resume(dir.path(), 1).unwrap();
        csv.row(&row(2)).unwrap();
        let text = std::fs::read_to_string(dir.path().join("metrics.csv")).unwrap();
        let lines: Vec<_> = text.lines().collect();
        assert_eq!(lines[0], HEADER);
        assert!(lines[1].ends_with("0.000000,,,"), "{text}");
        assert_eq!(lines[1].split(',').count(), lines[2].split(',').count());
        drop(csv);
        // Another file is never continued.
        std::fs::write(dir.path().join("metrics.csv"), "a,b\n1,2\n").unwrap();
        let e = MetricsCsv::resume(dir.path(), 4).err().unwrap().to_string();
        assert!(e.contains("metrics.csv") && e.contains("header"), "{e}");
        assert_eq!(
            std::fs::read_to_string(dir.path().join("metrics.csv")).unwrap(),
            "a,b\n1,2\n",
            "left as it was"
        );
    }
}
