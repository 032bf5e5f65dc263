//! Preemption and automatic resume: a fit asked to stop saves the step every rank agreed on
//! and returns `Interrupted`; `fit_or_resume` continues from `last` to the same bits as a
//! run never stopped, starts fresh where there is no `last`, and refuses a damaged one.

use crate::common::{adamw, full_parameters, loader, max_diff, quiet_builder, Mlp};
use std::path::Path;
use wick::core::{Callback, RunState};
use wick::strategies::strategy_by_name;
use wick::trainer::{Attached, ModelCheckpoint, Preemption, TrainerError};

const STEPS: usize = 8;
const SIGTERM: i32 = 15;

/// Asks for a preemption at the end of step `at`, from rank `rank`'s callback only.
#[derive(Clone)]
struct PreemptAt {
    at: usize,
    rank: usize,
    preemption: Preemption,
}

impl Callback for PreemptAt {
    fn on_train_batch_end(&mut self, state: &RunState) -> candle_core::Result<()> {
        if state.global_step == self.at && state.rank == self.rank {
            self.preemption.request(SIGTERM);
        }
        Ok(())
    }
}

/// Fits under `strategy` at `w` ranks saving under `root` (every 5 steps), stopped at step
/// `preempt_at` by rank `w - 1` if given, resuming from `last` when `auto`. Returns the
/// final parameters, or the error.
fn fit(
    w: usize,
    strategy: &str,
    root: &Path,
    preempt_at: Option<usize>,
    auto: bool,
) -> Result<Vec<Vec<f32>>, TrainerError> {
    let preemption = Preemption::manual();
    let mut builder = quiet_builder(w, strategy_by_name(strategy).unwrap(), STEPS)
        .checkpoint(ModelCheckpoint::new(root).every_n_steps(5))
        .preemption(preemption.clone());
    if let Some(at) = preempt_at {
        builder = builder.callback(PreemptAt {
            at,
            rank: w - 1,
            preemption,
        });
    }
    let mut trainer = builder.build().unwrap();
    let mut model = Attached::new(Mlp::new(adamw()));
    match auto {
        true => trainer.fit_or_resume(&mut model, &loader(), None),
        false => trainer.fit(&mut model, &loader(), None),
    }?;
    Ok(full_parameters(&mut trainer, &mut model))
}

#[test]
fn a_preempted_fit_saves_its_step_and_resumes_to_the_same_bits() {
    for (w, strategy) in [(2, "ddp"), (3, "zero2"), (2, "fsdp"), (3, "zero3")] {
        let tmp = tempfile::tempdir().unwrap();
        let uninterrupted = fit(w, strategy, &tmp.path().join("straight"), None, false).unwrap();

        let root = tmp.path().join("ck");
        // Stopped after step 3, and again after step 5 (where a save was due anyway: the
        // preemption saves nothing more), then run to the end.
        for (at, expected) in [(3, "step-00000003"), (5, "step-00000005")] {
            match fit(w, strategy, &root, Some(at), true) {
                Err(TrainerError::Interrupted {
                    signal,
                    step,
                    checkpoint,
                }) => {
                    assert_eq!((signal, step), (Some(SIGTERM), at), "{strategy} W={w}");
                    assert_eq!(checkpoint, Some(root.join(expected)), "{strategy} W={w}");
                }
                other => panic!("{strategy} W={w}: {other:?}"),
            }
            let last = std::fs::read_to_string(root.join("last")).unwrap();
            assert_eq!(last.trim(), expected, "{strategy} W={w}");
        }
        let resumed = fit(w, strategy, &root, None, true).unwrap();
        assert_eq!(
            max_diff(&uninterrupted, &resumed),
            0.0,
            "{strategy} W={w}: resumed twice after preemption"
        );
    }
}

#[test]
fn the_interruption_says_what_stopped_the_run_and_what_was_saved() {
    let tmp = tempfile::tempdir().unwrap();
    let message = fit(2, "ddp", &tmp.path().join("ck"), Some(2), false)
        .unwrap_err()
        .to_string();
    assert!(
        message.starts_with("interrupted by SIGTERM after step 2; saved ")
            && message.ends_with("step-00000002"),
        "{message}"
    );
}

#[test]
fn resuming_automatically_starts_fresh_without_last_and_refuses_a_damaged_one() {
    let tmp = tempfile::tempdir().unwrap();
    let straight = fit(2, "zero1", &tmp.path().join("straight"), None, false).unwrap();
    // No root yet: a fresh start, equal to a plain fit.
    let root = tmp.path().join("ck");
    let fresh = fit(2, "zero1", &root, None, true).unwrap();
    assert_eq!(max_diff(&straight, &fresh), 0.0);

    // `last` naming a checkpoint that is not there, then one whose rank file is cut short.
    std::fs::write(root.join("last"), "step-00000099").unwrap();
    let e = fit(2, "zero1", &root, None, true).unwrap_err().to_string();
    assert!(e.contains("step-00000099") && e.contains("last"), "{e}");

    std::fs::write(root.join("last"), "step-00000008").unwrap();
    let file = root.join("step-00000008/rank-1.safetensors");
    let bytes = std::fs::read(&file).unwrap();
    std::fs::write(&file, &bytes[..bytes.len() / 2]).unwrap();
    let e = fit(2, "zero1", &root, None, true).unwrap_err().to_string();
    assert!(e.contains("rank-1.safetensors"), "{e}");
}
