//! Checkpoints written in the background (`ModelCheckpoint::async_save`): the same files as
//! blocking saves, and training going on while they are written.

use crate::checkpoint::{fit, named, names_in, saved_state};
use crate::common::{adamw, loader, quiet_builder, Mlp};
use std::collections::HashSet;
use std::path::Path;
use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;
use tempfile::TempDir;
use wick::core::{Callback, RunState};
use wick::trainer::checkpoint::{SaveFault, SavePoint};
use wick::trainer::{Attached, ModelCheckpoint};

#[test]
fn saves_written_in_the_background_hold_what_blocking_saves_hold() {
    for (w, strategy) in [(2, "ddp"), (3, "zero2"), (2, "fsdp")] {
        let tmp = TempDir::new().unwrap();
        let run = |root: &Path, async_save: bool| {
            let mc = ModelCheckpoint::new(root)
                .every_n_steps(2)
                .async_save(async_save);
            fit(&loader(), (w, named(strategy)), adamw(), 7, None, Some(mc))
        };
        let (blocking, background) = (tmp.path().join("b"), tmp.path().join("a"));
        let params = run(&blocking, false);
        assert_eq!(params, run(&background, true), "{strategy} W={w}");
        // Steps 2, 4 and 6, then the end of fit (7).
        let names = names_in(&blocking);
        assert_eq!(names_in(&background), names, "{strategy} W={w}");
        assert_eq!(names.len(), 5, "{names:?}");
        for name in names.iter().filter(|n| n.starts_with("step-")) {
            assert_eq!(
                saved_state(&background.join(name)),
                saved_state(&blocking.join(name)),
                "{strategy} W={w}: {name}"
            );
        }
        let last = |root: &Path| std::fs::read_to_string(root.join("last")).unwrap();
        assert_eq!(last(&background), "step-00000007");
        assert_eq!(last(&blocking), last(&background));
    }
}

/// The last step rank 0 finished, for a writer to wait on.
#[derive(Clone, Default)]
struct StepsDone(Arc<(Mutex<usize>, Condvar)>);

impl Callback for StepsDone {
    fn on_train_batch_end(&mut self, state: &RunState) -> candle_core::Result<()> {
        if state.rank == 0 {
            let (step, changed) = &*self.0;
            *step.lock().unwrap() = state.global_step;
            changed.notify_all();
        }
        Ok(())
    }
}

/// Fits 6 steps of ddp at W=2 saving every 2 steps, each rank's first file (of the step-2
/// save) held back after it is written until rank 0 has finished step 3, for at most
/// `patience`; the fit's outcome and the ranks whose file was held.
fn fit_holding_the_first_save(
    root: &Path,
    async_save: bool,
    patience: Duration,
) -> (Result<(), String>, Vec<usize>) {
    let done = StepsDone::default();
    let held = Arc::new(Mutex::new(HashSet::new()));
    let fault: SaveFault = {
        let (done, held) = (done.clone(), held.clone());
        Arc::new(move |point| {
            let SavePoint::RankFile { rank } = point else {
                return Ok(());
            };
            if !held.lock().unwrap().insert(rank) {
                return Ok(());
            }
            let (step, changed) = &*done.0;
            let (reached, wait) = changed
                .wait_timeout_while(step.lock().unwrap(), patience, |s| *s < 3)
                .unwrap();
            match wait.timed_out() {
                true => Err(format!(
                    "rank {rank}'s file of the step-2 save waited {patience:?} for step 3, \
                     and training stood at step {}",
                    *reached
                )),
                false => Ok(()),
            }
        })
    };
    let mc = ModelCheckpoint::new(root)
        .every_n_steps(2)
        .keep_last(10)
        .async_save(async_save)
        .with_fault_injection(fault);
    let mut trainer = quiet_builder(2, named("ddp"), 6)
        .checkpoint(mc)
        .callback(done)
        .build()
        .unwrap();
    let outcome = trainer
        .fit(&mut Attached::new(Mlp::new(adamw())), &loader(), None)
        .map(|_| ())
        .map_err(|e| e.to_string());
    let mut held: Vec<usize> = held.lock().unwrap().iter().copied().collect();
    held.sort();
    (outcome, held)
}

#[test]
fn training_goes_on_while_a_background_save_writes() {
    // Each rank's writer holds its step-2 file until step 3 has ended: only a save that
    // writes beside the steps can finish, and it does, whole.
    let tmp = TempDir::new().unwrap();
    let (outcome, held) = fit_holding_the_first_save(tmp.path(), true, Duration::from_secs(300));
    outcome.unwrap();
    assert_eq!(held, [0, 1], "every rank's first file was held");
    assert_eq!(
        names_in(tmp.path()),
        ["last", "step-00000002", "step-00000004", "step-00000006"]
    );
    assert!(!saved_state(&tmp.path().join("step-00000002")).is_empty());
    // The same hold on a blocking save: the step cannot go on, so the save fails when
    // the wait runs out. The check above can fail.
    let tmp = TempDir::new().unwrap();
    let (outcome, _) = fit_holding_the_first_save(tmp.path(), false, Duration::from_millis(300));
    let error = outcome.unwrap_err();
    assert!(
        error.contains("waited") && error.contains("for step 3"),
        "{error}"
    );
}
