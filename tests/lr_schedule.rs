//! Learning-rate schedules: each step's rate (in the metrics CSV and, with
//! `LearningRateMonitor`, the metrics), the same curve under every strategy, and a resumed
//! run that continues the saved curve at another world size and strategy.

use crate::common::{adamw, full_parameters, loader, max_diff, quiet_builder, Mlp};
use wick::core::{LrSchedule, OptimizerConfig, Strategy};
use wick::strategies::strategy_by_name;
use wick::trainer::{Attached, LearningRateMonitor, ModelCheckpoint};

/// Warmup over 3 steps, then a cosine down to a tenth at step 10.
fn scheduled() -> OptimizerConfig {
    adamw().with_schedule(LrSchedule::warmup_cosine(3, 10, 0.1))
}

fn named(name: &str) -> Box<dyn Strategy> {
    strategy_by_name(name).unwrap()
}

/// Trains `steps` steps of the MLP with `optimizer` and returns the trainer.
/// The parameters after `steps` steps of `strategy` on `devices` ranks.
fn trained(
    devices: usize,
    strategy: &str,
    optimizer: OptimizerConfig,
    steps: usize,
) -> Vec<Vec<f32>> {
    let mut t = quiet_builder(devices, named(strategy), steps)
        .build()
        .unwrap();
    let mut m = Attached::new(Mlp::new(optimizer));
    t.fit(&mut m, &loader(), None).unwrap();
    full_parameters(&mut t, &mut m)
}

#[test]
fn the_rate_of_each_step_follows_the_schedule() {
    let dir = tempfile::TempDir::new().unwrap();
    let mut t = quiet_builder(2, named("ddp"), 12)
        .log_dir(dir.path())
        .run_name("lr")
        .callback(LearningRateMonitor::new())
        .build()
        .unwrap();
    let metrics = t
        .fit(&mut Attached::new(Mlp::new(scheduled())), &loader(), None)
        .unwrap();
    let csv = std::fs::read_to_string(dir.path().join("lr/metrics.csv")).unwrap();
    let lrs: Vec<f64> = csv
        .lines()
        .skip(1)
        .map(|l| l.split(',').nth(4).unwrap().parse().unwrap())
        .collect();
    let schedule = LrSchedule::warmup_cosine(3, 10, 0.1);
    let want: Vec<f64> = (0..12).map(|s| 0.01 * schedule.factor(s)).collect();
    assert_eq!(lrs.len(), 12);
    for (got, want) in lrs.iter().zip(&want) {
        assert!((got - want).abs() < 1e-12, "{lrs:?}\n{want:?}");
    }
    assert!(lrs[0] < lrs[2] && lrs[3] > lrs[9], "{lrs:?}");
    // The monitor puts the last step's rate (the floor) into the metrics.
    assert!((metrics["lr"] - 0.001).abs() < 1e-12, "{metrics:?}");

    // Without the monitor, `lr` is in the CSV only.
    let mut t = quiet_builder(2, named("ddp"), 2).build().unwrap();
    let metrics = t
        .fit(&mut Attached::new(Mlp::new(scheduled())), &loader(), None)
        .unwrap();
    assert!(!metrics.contains_key("lr"), "{metrics:?}");
}

#[test]
fn every_strategy_follows_the_same_schedule() {
    let reference = trained(1, "single", scheduled(), 10);
    let constant = trained(1, "single", adamw(), 10);
    assert!(
        max_diff(&reference, &constant) > 1e-3,
        "the schedule changed nothing"
    );
    for (devices, strategy) in [
        (2, "ddp"),
        (3, "zero1"),
        (2, "zero2"),
        (3, "zero3"),
        (2, "fsdp"),
    ] {
        let got = trained(devices, strategy, scheduled(), 10);
        let diff = max_diff(&reference, &got);
        assert!(diff <= 1e-5, "{strategy} at {devices}: {diff}");
    }
}

#[test]
fn a_resumed_run_continues_the_saved_curve() {
    let whole = trained(2, "ddp", scheduled(), 10);
    let root = tempfile::TempDir::new().unwrap();
    let mut first = quiet_builder(2, named("ddp"), 5)
        .checkpoint(ModelCheckpoint::new(root.path()))
        .build()
        .unwrap();
    first
        .fit(&mut Attached::new(Mlp::new(scheduled())), &loader(), None)
        .unwrap();
    // The resumed module configures a constant rate: the checkpoint's schedule wins, so the
    // curve goes on where it stopped (as Lightning restores a scheduler's state).
    let mut second = quiet_builder(3, named("zero3"), 10).build().unwrap();
    let mut m = Attached::new(Mlp::new(adamw()));
    second
        .fit_from(&mut m, &loader(), None, root.path().join("last"))
        .unwrap();
    let diff = max_diff(&whole, &full_parameters(&mut second, &mut m));
    assert!(diff <= 1e-5, "{diff}");
}

#[test]
fn a_bad_schedule_is_an_error_naming_it() {
    let bad = adamw().with_schedule(LrSchedule::warmup_cosine(10, 5, 0.1));
    let mut t = quiet_builder(1, named("single"), 2).build().unwrap();
    let e = t
        .fit(&mut Attached::new(Mlp::new(bad)), &loader(), None)
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("lr schedule") && e.contains("total_steps"),
        "{e}"
    );
}
