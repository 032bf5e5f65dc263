//! Runs never overwrite each other: a new run gets a new version of its log directory, a
//! resumed run continues its own metrics; outputs that cannot be written, and data too small
//! for a batch, are refused before any step, in plain words.

use crate::common::{adamw, loader, quiet_builder, Mlp, Regression};
use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use tempfile::TempDir;
use wick::strategies::strategy_by_name;
use wick::trainer::{Attached, DataLoader, ModelCheckpoint, Trainer, TrainerError};

/// (step, train_loss) of each row of a metrics file.
fn rows(csv: &Path) -> Vec<(usize, String)> {
    std::fs::read_to_string(csv)
        .unwrap()
        .lines()
        .skip(1)
        .map(|l| {
            let cells: Vec<&str> = l.split(',').collect();
            (cells[0].parse().unwrap(), cells[2].to_string())
        })
        .collect()
}

fn logged(tmp: &TempDir, steps: usize) -> Trainer {
    quiet_builder(2, strategy_by_name("zero3").unwrap(), steps)
        .log_dir(tmp.path().join("runs"))
        .run_name("r")
        .checkpoint(ModelCheckpoint::new(tmp.path().join("ck")).every_n_steps(2))
        .build()
        .unwrap()
}

#[test]
fn a_new_run_gets_a_new_version_and_a_resumed_one_continues_its_metrics() {
    let tmp = TempDir::new().unwrap();
    let mut first = logged(&tmp, 6);
    first
        .fit(&mut Attached::new(Mlp::new(adamw())), &loader(), None)
        .unwrap();
    let first_csv = first.metrics_path().unwrap();
    assert_eq!(first_csv, tmp.path().join("runs/r/metrics.csv"));
    let uninterrupted = rows(&first_csv);
    assert_eq!(uninterrupted.len(), 6);

    // The same command again: its own directory, the first run's file untouched.
    let mut second = logged(&tmp, 3);
    second
        .fit(&mut Attached::new(Mlp::new(adamw())), &loader(), None)
        .unwrap();
    assert_eq!(
        second.metrics_path().unwrap(),
        tmp.path().join("runs/r-v1/metrics.csv")
    );
    assert_eq!(rows(&first_csv), uninterrupted);
    assert_eq!(second.checkpoint_dir().unwrap(), tmp.path().join("ck-v1"));

    // Resumed from the first run's step 4 and trained to 8: rows 1-4 stay, 5 and 6 are
    // replaced by the same values (a bit-identical resume), 7 and 8 follow.
    let mut resumed = logged(&tmp, 8);
    resumed
        .fit_from(
            &mut Attached::new(Mlp::new(adamw())),
            &loader(),
            None,
            tmp.path().join("ck/step-00000004"),
        )
        .unwrap();
    assert_eq!(resumed.metrics_path().unwrap(), first_csv);
    let continued = rows(&first_csv);
    assert_eq!(
        continued.iter().map(|r| r.0).collect::<Vec<_>>(),
        (1..=8).collect::<Vec<_>>()
    );
    assert_eq!(continued[..6], uninterrupted[..]);

    // Resuming the second run continues the second run's file.
    let mut resumed = logged(&tmp, 4);
    resumed
        .fit_from(
            &mut Attached::new(Mlp::new(adamw())),
            &loader(),
            None,
            tmp.path().join("ck-v1/last"),
        )
        .unwrap();
    assert_eq!(
        resumed.metrics_path().unwrap(),
        tmp.path().join("runs/r-v1/metrics.csv")
    );
    assert_eq!(rows(&resumed.metrics_path().unwrap()).len(), 4);
}

/// Counts training steps, to show an error came before any.
#[derive(Clone, Default)]
struct Steps(Arc<AtomicUsize>);

impl wick::core::Callback for Steps {
    fn on_train_batch_end(&mut self, _: &wick::core::RunState) -> candle_core::Result<()> {
        self.0.fetch_add(1, Ordering::SeqCst);
        Ok(())
    }
}

#[test]
fn outputs_that_cannot_be_written_fail_before_training_without_naming_a_rank() {
    let tmp = TempDir::new().unwrap();
    // A file where a directory must go.
    let file = tmp.path().join("a-file");
    std::fs::write(&file, "").unwrap();
    for (what, builder) in [
        (
            "log dir",
            quiet_builder(2, strategy_by_name("ddp").unwrap(), 4).log_dir(&file),
        ),
        (
            "checkpoint root",
            quiet_builder(2, strategy_by_name("ddp").unwrap(), 4)
                .checkpoint(ModelCheckpoint::new(file.join("ck"))),
        ),
    ] {
        let steps = Steps::default();
        let e = builder
            .callback(steps.clone())
            .build()
            .unwrap()
            .fit(&mut Attached::new(Mlp::new(adamw())), &loader(), None)
            .unwrap_err();
        let message = e.to_string();
        assert_eq!(steps.0.load(Ordering::SeqCst), 0, "{what}: trained first");
        assert!(message.contains("a-file"), "{what}: {message}");
        assert!(!message.contains("rank 0"), "{what}: {message}");
        // The OS error once, not again as a source.
        assert!(std::error::Error::source(&e).is_none(), "{what}: {e:?}");
        assert_eq!(message.matches("os error").count(), 1, "{what}: {message}");
    }
}

#[test]
fn bad_input_is_named_plainly() {
    let tmp = TempDir::new().unwrap();
    let fit = |data: DataLoader<Regression>| {
        quiet_builder(2, strategy_by_name("ddp").unwrap(), 4)
            .build()
            .unwrap()
            .fit(&mut Attached::new(Mlp::new(adamw())), &data, None)
            .unwrap_err()
            .to_string()
    };
    let e = fit(DataLoader::new(Regression::new(10), 12));
    assert!(
        e.contains("10 samples") && e.contains("global batch of 12") && !e.contains("accumulate"),
        "{e}"
    );
    let e = quiet_builder(2, strategy_by_name("ddp").unwrap(), 4)
        .accumulate_grad_batches(3)
        .build()
        .unwrap()
        .fit(
            &mut Attached::new(Mlp::new(adamw())),
            &DataLoader::new(Regression::new(24), 12),
            None,
        )
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("accumulate_grad_batches") && e.contains("24 samples"),
        "{e}"
    );
    // A resume path that is not there is the call's error, not a rank's.
    let e = quiet_builder(2, strategy_by_name("ddp").unwrap(), 4)
        .build()
        .unwrap()
        .fit_from(
            &mut Attached::new(Mlp::new(adamw())),
            &loader(),
            None,
            tmp.path().join("nothing"),
        )
        .unwrap_err();
    assert!(matches!(e, TrainerError::Checkpoint(_)), "{e:?}");
    assert!(e.to_string().contains("no such file or directory"), "{e}");
}

#[test]
fn validate_and_test_need_no_training_options() {
    let mut trainer = Trainer::builder()
        .devices(2)
        .strategy("zero3")
        .no_logger()
        .progress(false)
        .build()
        .unwrap();
    let data = DataLoader::new(Regression::new(9), 4).without_shuffle();
    let mut model = Attached::new(Mlp::new(adamw()));
    let val = trainer.validate(&mut model, &data).unwrap()["val_loss"];
    let test = trainer.test(&mut model, &data).unwrap()["test_loss"];
    assert_eq!(val, test);
    // Every sample counts, the short last batch too: the same loss as one device's.
    let mut one = Trainer::builder()
        .no_logger()
        .progress(false)
        .build()
        .unwrap();
    let whole = DataLoader::new(Regression::new(9), 9).without_shuffle();
    let reference = one
        .validate(&mut Attached::new(Mlp::new(adamw())), &whole)
        .unwrap()["val_loss"];
    assert!((val - reference).abs() < 1e-6, "{val} vs {reference}");
    let predictions = trainer.predict(&mut model, &data).unwrap();
    let rows: Vec<usize> = predictions.iter().map(|p| p.dims()[0]).collect();
    assert_eq!(rows, [4, 4, 1]);
}

/// A sink of the program's own, beside the metrics file: it keeps the steps it was told.
#[derive(Clone, Default)]
struct Kept(Arc<std::sync::Mutex<Vec<(usize, String)>>>);

impl wick::trainer::StepSink for Kept {
    fn step_end(&mut self, r: &wick::trainer::StepRecord) -> Result<(), TrainerError> {
        self.0
            .lock()
            .unwrap()
            .push((r.step, r.train_loss.to_string()));
        Ok(())
    }
}

/// A sink that fails at its third step.
struct Failing;

impl wick::trainer::StepSink for Failing {
    fn step_end(&mut self, r: &wick::trainer::StepRecord) -> Result<(), TrainerError> {
        match r.step {
            3 => Err(TrainerError::config(
                "sink",
                "the third step's record was refused",
            )),
            _ => Ok(()),
        }
    }
}

#[test]
fn a_programs_sink_gets_every_step_the_metrics_file_gets_and_its_error_ends_the_fit() {
    let tmp = TempDir::new().unwrap();
    let kept = Kept::default();
    let mut trainer = quiet_builder(3, strategy_by_name("fsdp").unwrap(), 5)
        .log_dir(tmp.path().join("runs"))
        .sink(kept.clone())
        .build()
        .unwrap();
    for _ in 0..2 {
        let mut model = Attached::new(Mlp::new(adamw()));
        trainer.fit(&mut model, &loader(), None).unwrap();
    }
    let csv = trainer.metrics_path().unwrap();
    let seen = kept.0.lock().unwrap().clone();
    // Both fits reached the sink, the second into its own metrics file.
    assert_eq!(seen.len(), 10, "{seen:?}");
    assert_eq!(seen[5..], rows(&csv)[..], "the second fit's rows");
    let e = quiet_builder(2, strategy_by_name("ddp").unwrap(), 5)
        .no_logger()
        .sink(Failing)
        .build()
        .unwrap()
        .fit(&mut Attached::new(Mlp::new(adamw())), &loader(), None)
        .unwrap_err()
        .to_string();
    assert!(e.contains("third step's record was refused"), "{e}");
}
