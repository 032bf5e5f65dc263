//! EarlyStopping: fit ends on every rank after the same step, decided from the
//! rank-averaged metric.

use crate::common::{adamw, loader, quiet_builder, Mlp, RankedMlp};
use std::sync::{Arc, Mutex};
use wick::core::{Callback, RunState};
use wick::strategies::strategy_by_name;
use wick::trainer::{Attached, EarlyStopping, Mode};

/// The global steps each rank finished, in order.
#[derive(Clone, Default)]
struct Steps(Arc<Mutex<Vec<(usize, usize)>>>);

impl Steps {
    /// The last step each of ranks 0..devices finished (a rank that finished none fails).
    fn last_per_rank(&self, devices: usize) -> Vec<usize> {
        let seen = self.0.lock().unwrap();
        (0..devices)
            .map(|r| {
                let steps = seen.iter().filter(|(rank, _)| *rank == r);
                steps
                    .map(|(_, s)| *s)
                    .max()
                    .expect("the rank finished a step")
            })
            .collect()
    }
}

impl Callback for Steps {
    fn on_train_batch_end(&mut self, state: &RunState) -> candle_core::Result<()> {
        self.0.lock().unwrap().push((state.rank, state.global_step));
        Ok(())
    }
}

/// Fits `script` on `devices` ranks under ddp for at most 40 steps, validating every step,
/// with `stopping`; returns the last step each rank finished.
fn last_steps(
    devices: usize,
    script: fn(usize, usize) -> f64,
    stopping: EarlyStopping,
) -> Vec<usize> {
    let steps = Steps::default();
    let mut t = quiet_builder(devices, strategy_by_name("ddp").unwrap(), 40)
        .val_check_interval(1)
        .callback(stopping)
        .callback(steps.clone())
        .build()
        .unwrap();
    // Rank r's validation loss is script(pass, r); the trainer logs the mean over ranks.
    let mut model = Attached::new(RankedMlp::scaled(adamw(), 1.0).with_val_script(script));
    t.fit(&mut model, &loader(), Some(&loader())).unwrap();
    steps.last_per_rank(devices)
}

#[test]
fn a_metric_that_stops_improving_stops_every_rank_at_the_same_step() {
    // 8, 7, 6, 5, then 5 for ever: passes 5 and 6 do not improve; patience 2 stops at 6.
    let plateau = |pass: usize, _| 9.0 - pass.min(4) as f64;
    let stop = EarlyStopping::new("val_loss", Mode::Min).patience(2);
    assert_eq!(last_steps(2, plateau, stop), [6, 6]);

    // min_delta: improving by 0.5 per pass counts as no improvement at min_delta 1, and as
    // one at 0.25.
    let slow = |pass: usize, _| 10.0 - 0.5 * pass as f64;
    let stop = |delta| {
        EarlyStopping::new("val_loss", Mode::Min)
            .patience(2)
            .min_delta(delta)
    };
    assert_eq!(last_steps(3, slow, stop(1.0)), [3, 3, 3]);
    assert_eq!(last_steps(3, slow, stop(0.25)), [40, 40, 40]);

    // Max mode: a falling metric stops after patience 1, a rising one never.
    let stop = EarlyStopping::new("val_loss", Mode::Max).patience(1);
    assert_eq!(last_steps(2, slow, stop), [2, 2]);
    let rising = |pass: usize, _| pass as f64;
    let stop = EarlyStopping::new("val_loss", Mode::Max).patience(1);
    assert_eq!(last_steps(2, rising, stop), [40, 40]);
}

#[test]
fn the_decision_uses_the_mean_over_ranks() {
    // Rank 0 improves at every pass, rank 1 gets worse faster: the mean rises, so the run
    // stops after patience 2, though rank 0 alone would never stop.
    let split = |pass: usize, rank| match rank {
        0 => 100.0 - pass as f64,
        _ => 3.0 * pass as f64,
    };
    let stop = EarlyStopping::new("val_loss", Mode::Min).patience(2);
    assert_eq!(last_steps(2, split, stop), [3, 3]);
}

#[test]
fn a_missing_metric_is_an_error_naming_it() {
    let mut t = quiet_builder(1, strategy_by_name("single").unwrap(), 3)
        .val_check_interval(1)
        .callback(EarlyStopping::new("val_acc", Mode::Max))
        .build()
        .unwrap();
    let e = t
        .fit(
            &mut Attached::new(Mlp::new(adamw())),
            &loader(),
            Some(&loader()),
        )
        .unwrap_err()
        .to_string();
    assert!(e.contains("val_acc") && e.contains("val_loss"), "{e}");
}

/// Asks to stop on rank 1 only, after step `.0`.
#[derive(Clone)]
struct StopOnRankOne(usize);

impl Callback for StopOnRankOne {
    fn on_train_batch_end(&mut self, state: &RunState) -> candle_core::Result<()> {
        if state.rank == 1 && state.global_step == self.0 {
            state.request_stop();
        }
        Ok(())
    }
}

#[test]
fn a_stop_asked_on_one_rank_stops_every_rank() {
    let steps = Steps::default();
    let mut t = quiet_builder(3, strategy_by_name("zero3").unwrap(), 40)
        .callback(StopOnRankOne(5))
        .callback(steps.clone())
        .build()
        .unwrap();
    t.fit(&mut Attached::new(Mlp::new(adamw())), &loader(), None)
        .unwrap();
    assert_eq!(steps.last_per_rank(3), [5, 5, 5]);
}
