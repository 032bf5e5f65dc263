//! The TensorBoard logger: `<log dir>/<run name>/events.out.tfevents.*`, written by rank 0,
//! one event per optimizer step holding its scalars, and the run's options as text.
//!
//! A resumed run writes a new event file that opens with a `SessionLog.START` at the first
//! step it trains: TensorBoard (and anything built on its `EventAccumulator`) then drops
//! what earlier files logged from that step on, so the curves continue at the right steps as
//! `metrics.csv` does.

mod event_file;

use crate::logging::sinks::{StepRecord, StepSink};
use crate::TrainerError;
use event_file::{wall_time, Event, EventFile, SessionLog, Summary, SummaryValue};
use std::borrow::Cow;
use std::path::{Path, PathBuf};

/// An open TensorBoard log.
pub(crate) struct TensorBoardLog {
    file: EventFile,
}

impl TensorBoardLog {
    /// A new event file in `dir`, its readers told that the run continues after step
    /// `resumed_after` if it does, with `options` (name, value) as the run's text.
    pub(crate) fn open(
        dir: &Path,
        resumed_after: Option<usize>,
        options: &[(String, String)],
    ) -> Result<Self, TrainerError> {
        let (file, path) = EventFile::create(dir).map_err(|cause| TrainerError::Io {
            path: dir.join("events.out.tfevents.*"),
            cause,
        })?;
        let mut log = TensorBoardLog { file };
        let first = resumed_after.map_or(0, |s| s + 1);
        if resumed_after.is_some() {
            log.write(Event {
                wall_time: wall_time(),
                step: first as i64,
                session_log: Some(SessionLog {
                    status: event_file::SESSION_START,
                }),
                ..Event::default()
            })?;
        }
        if !options.is_empty() {
            let mut table = String::from("| option | value |\n|---|---|\n");
            for (name, value) in options {
                table.push_str(&format!("| {name} | {value} |\n"));
            }
            log.write(summary_event(
                first,
                vec![SummaryValue::text("options", &table)],
            ))?;
        }
        debug_assert_eq!(log.file.path(), path);
        Ok(log)
    }

    /// The event file.
    pub(crate) fn path(&self) -> PathBuf {
        self.file.path().to_path_buf()
    }

    fn write(&mut self, event: Event) -> Result<(), TrainerError> {
        self.file.write(&event).map_err(|cause| TrainerError::Io {
            path: self.file.path().to_path_buf(),
            cause,
        })
    }
}

/// An event at `step` holding `values`.
fn summary_event(step: usize, values: Vec<SummaryValue>) -> Event {
    Event {
        wall_time: wall_time(),
        step: step as i64,
        summary: Some(Summary { value: values }),
        ..Event::default()
    }
}

/// The scalars of one step, by tag (torchtitan's names, under `train/` and `val/`).
pub(crate) fn scalars(r: &StepRecord) -> Vec<(Cow<'static, str>, f64)> {
    let mut out: Vec<(Cow<'static, str>, f64)> = vec![
        ("train/loss".into(), r.train_loss),
        ("train/lr".into(), r.lr),
        ("train/tokens_per_s".into(), r.tokens_per_s),
        ("train/comm_wait_s".into(), r.comm_wait_s),
        ("train/skipped_steps".into(), r.skipped_steps as f64),
    ];
    if let Some(norm) = r.grad_norm {
        out.push(("train/grad_norm".into(), norm));
    }
    if let Some(bytes) = r.peak_memory_bytes {
        out.push((
            "train/peak_memory_gib".into(),
            bytes as f64 / (1u64 << 30) as f64,
        ));
    }
    if let Some(mfu) = r.mfu {
        out.push(("train/mfu".into(), mfu));
    }
    if let Some(val) = r.val_loss {
        out.push(("val/loss".into(), val));
        out.push(("val/perplexity".into(), val.exp()));
    }
    // The module's own, under `train/` as transformers' TensorBoard callback puts TRL's.
    for (name, value) in &r.module_metrics {
        out.push((format!("train/{name}").into(), *value));
    }
    out
}

impl StepSink for TensorBoardLog {
    fn step_end(&mut self, record: &StepRecord) -> Result<(), TrainerError> {
        let values = scalars(record)
            .into_iter()
            .map(|(tag, v)| SummaryValue::scalar(&tag, v))
            .collect();
        self.write(summary_event(record.step, values))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The events of the file at `path`, decoded.
    fn events(path: &Path) -> Vec<Event> {
        let bytes = std::fs::read(path).unwrap();
        let mut out = Vec::new();
        let mut at = 0;
        while at < bytes.len() {
            let len = u64::from_le_bytes(bytes[at..at + 8].try_into().unwrap()) as usize;
            out.push(<Event as prost::Message>::decode(&bytes[at + 12..at + 12 + len]).unwrap());
            at += 16 + len;
        }
        out
    }

    fn record(step: usize) -> StepRecord {
        StepRecord {
            step,
            epoch: 0,
            train_loss: 3.0 - step as f64 / 10.0,
            val_loss: step.is_multiple_of(2).then_some(2.0),
            lr: 0.01,
            skipped_steps: 0,
            tokens_per_s: 100.0,
            epoch_time_s: 1.0,
            comm_wait_s: 0.0,
            grad_norm: Some(1.5),
            peak_memory_bytes: Some(1 << 30),
            mfu: Some(0.25),
            module_metrics: vec![("rewards/chosen", 0.5)],
        }
    }

    #[test]
    fn a_run_logs_its_options_and_steps_and_a_resumed_one_restarts_after_its_step() {
        let dir = tempfile::tempdir().unwrap();
        let options = [("strategy".to_string(), "fsdp".to_string())];
        let mut log = TensorBoardLog::open(dir.path(), None, &options).unwrap();
        (1..=3).for_each(|s| log.step_end(&record(s)).unwrap());
        let first = events(&log.path());
        assert_eq!(first.len(), 1 + 1 + 3, "version, options, three steps");
        let text = &first[1].summary.as_ref().unwrap().value[0];
        assert_eq!(text.tag, "options");
        let table = String::from_utf8(text.tensor.as_ref().unwrap().string_val[0].clone()).unwrap();
        assert!(table.contains("| strategy | fsdp |"), "{table}");
        let step2 = first[3].summary.as_ref().unwrap();
        let value = |tag: &str| {
            step2
                .value
                .iter()
                .find(|v| v.tag == tag)
                .map(|v| v.simple_value)
        };
        assert_eq!(first[3].step, 2);
        assert_eq!(value("train/loss"), Some(Some(2.8)));
        assert_eq!(value("val/perplexity"), Some(Some(2f32.exp())));
        assert_eq!(value("train/peak_memory_gib"), Some(Some(1.0)));
        assert_eq!(value("train/mfu"), Some(Some(0.25)));
        assert_eq!(
            value("train/rewards/chosen"),
            Some(Some(0.5)),
            "a module's own metric"
        );
        assert!(value("val/loss").is_some());
        let step1 = &first[2].summary.as_ref().unwrap().value;
        assert!(
            !step1.iter().any(|v| v.tag == "val/loss"),
            "no validation at step 1"
        );

        // Resumed after step 1: a new file that first tells readers to drop step 2 on.
        let resumed = TensorBoardLog::open(dir.path(), Some(1), &[]).unwrap();
        assert_ne!(resumed.path(), log.path());
        let second = events(&resumed.path());
        assert_eq!(second[1].step, 2);
        assert_eq!(
            second[1].session_log.as_ref().unwrap().status,
            event_file::SESSION_START
        );
    }

    #[test]
    fn a_directory_that_cannot_be_written_is_named() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("a-file");
        std::fs::write(&file, "").unwrap();
        let e = TensorBoardLog::open(&file.join("run"), None, &[])
            .err()
            .unwrap()
            .to_string();
        assert!(e.contains("a-file") && e.contains("tfevents"), "{e}");
    }
}
