//! `16-mixed` dynamic loss scaling: a step whose gradients overflow on any rank is skipped
//! on every rank, the scale backs off, training goes on, and checkpoints keep the scale.

use crate::common::{adamw, full_parameters, loader, quiet_builder, RankedMlp};
use wick::strategies::{Fsdp, FsdpSharding, Precision};
use wick::trainer::{Attached, Checkpoint, ModelCheckpoint, Trainer};

/// Batch 3 (the fourth step) is multiplied by this on rank 0 only: its gradients overflow
/// f16 at any scale.
const HUGE: f64 = 1e12;

fn sixteen_mixed(sharding: FsdpSharding) -> Box<dyn wick::core::Strategy> {
    let half = Precision::F16Mixed;
    Fsdp::new(sharding).with_precision(half).unwrap().build()
}

/// The model that overflows at batch 3 on rank 0; the loss divided by 64 elsewhere, so no
/// other step overflows (see `fsdp::mixed_precision_trains_close_to_single_f32`).
fn overflowing() -> RankedMlp {
    RankedMlp::scaled(adamw(), 1.0 / 64.0).with_spike(0, 3, HUGE)
}

fn trainer(sharding: FsdpSharding, steps: usize) -> Trainer {
    quiet_builder(2, sixteen_mixed(sharding), steps)
        .build()
        .unwrap()
}

#[test]
fn an_overflow_on_one_rank_skips_the_step_on_every_rank_and_training_goes_on() {
    for sharding in [FsdpSharding::FullShard, FsdpSharding::ShardGradOp] {
        // Three good steps.
        let mut three = trainer(sharding, 3);
        let mut m = Attached::new(overflowing());
        three.fit(&mut m, &loader(), None).unwrap();
        let after_three = full_parameters(&mut three, &mut m);

        // The fourth step overflows on rank 0: no rank steps, so every shard is as it was.
        let mut four = trainer(sharding, 4);
        let mut m = Attached::new(overflowing());
        let metrics = four.fit(&mut m, &loader(), None).unwrap();
        assert_eq!(
            full_parameters(&mut four, &mut m),
            after_three,
            "{sharding:?}: a rank stepped"
        );
        assert_eq!(metrics["loss_scale"], 32768.0, "{sharding:?}: no backoff");
        assert!(
            metrics["train_loss"] > 1e6,
            "the overflowing loss was logged"
        );

        // Training goes on from there, at the lower scale, with finite parameters.
        let mut eight = trainer(sharding, 8);
        let mut m = Attached::new(overflowing());
        let metrics = eight.fit(&mut m, &loader(), None).unwrap();
        let params = full_parameters(&mut eight, &mut m);
        assert!(params.iter().flatten().all(|p| p.is_finite()));
        assert_ne!(params, after_three, "{sharding:?}: no step after the skip");
        assert_eq!(metrics["loss_scale"], 32768.0);
        assert!(metrics["train_loss"] < 10.0, "{metrics:?}");
    }
}

#[test]
fn the_scale_is_saved_and_resumed() {
    let root = tempfile::TempDir::new().unwrap();
    let checkpoints = || ModelCheckpoint::new(root.path()).every_n_steps(4);
    let mut first = quiet_builder(2, sixteen_mixed(FsdpSharding::FullShard), 4)
        .checkpoint(checkpoints())
        .build()
        .unwrap();
    first
        .fit(&mut Attached::new(overflowing()), &loader(), None)
        .unwrap();
    let saved = Checkpoint::open(root.path().join("step-00000004")).unwrap();
    let scale = saved.manifest().optimizer.loss_scale.expect("a loss scale");
    assert_eq!((scale.scale, scale.skipped_steps), (32768.0, 1));

    // Resumed at another world size, the scale continues at 2^15, not 2^16.
    let mut resumed = quiet_builder(4, sixteen_mixed(FsdpSharding::FullShard), 6)
        .build()
        .unwrap();
    let mut model = Attached::new(RankedMlp::scaled(adamw(), 1.0 / 64.0));
    let metrics = resumed
        .fit_from(&mut model, &loader(), None, root.path().join("last"))
        .unwrap();
    assert_eq!(metrics["loss_scale"], 32768.0);
}
