use crate::common::{adamw, max_diff, sgd_momentum, train, Mlp};
use wick::core::OptimizerConfig;
use wick::trainer::Attached;

const STEPS: usize = 10;

/// `strategy` at W = 1..4 ends where `single` ends, with AdamW and with SGD + momentum.
fn matches_single(strategy: &str) {
    // Parameters are made in configure_sharded_model, not before.
    assert!(!Mlp::new(adamw()).is_built());
    for optimizer in [adamw(), sgd_momentum()] {
        let reference = train(1, "single", optimizer.clone(), STEPS);
        for w in 1..=4 {
            let got = train(w, strategy, optimizer.clone(), STEPS);
            let diff = max_diff(&reference, &got);
            assert!(
                diff <= 1e-5,
                "{strategy} w={w} {optimizer:?}: max |diff| {diff}"
            );
        }
    }
}

/// Every strategy at W = 1..4 matches one device (`fsdp`: its default, `full_shard`;
/// the other shardings are `tests/fsdp.rs`'s).
mod matches_single_device_at_w_1_to_4 {
    crate::per_strategy!(super::matches_single: ddp, zero1, zero2, zero3, fsdp);
}

#[test]
fn training_moves_the_parameters() {
    // Guards the test above against comparing two untrained models.
    let trained = train(1, "single", adamw(), STEPS);
    let once = train(1, "single", adamw(), 1);
    assert!(max_diff(&trained, &once) > 1e-3);
}

#[test]
fn same_seed_same_numbers() {
    assert_eq!(train(2, "ddp", adamw(), 3), train(2, "ddp", adamw(), 3));
}

/// (step, rank, parameters) as each rank saw them at the start of a step.
type Seen = std::sync::Arc<std::sync::Mutex<Vec<(usize, usize, Vec<Vec<f32>>)>>>;

/// Records rank 0..W's parameters at the start of every step, to compare replicas.
#[derive(Clone)]
struct Watched {
    inner: Mlp,
    rank: usize,
    seen: Seen,
    step: usize,
}

impl wick::core::TrainModule for Watched {
    type Batch = (candle_core::Tensor, candle_core::Tensor);
    fn configure_sharded_model(
        &mut self,
        ctx: &wick::core::ShardedContext,
    ) -> candle_core::Result<()> {
        self.rank = ctx.rank();
        self.inner.configure_sharded_model(ctx)
    }
    fn configure_optimizers(&self) -> OptimizerConfig {
        self.inner.optimizer.clone()
    }
    fn training_step(
        &mut self,
        batch: &Self::Batch,
        _: usize,
    ) -> candle_core::Result<candle_core::Tensor> {
        self.seen
            .lock()
            .unwrap()
            .push((self.step, self.rank, self.inner.parameters()));
        self.step += 1;
        self.inner.loss(batch)
    }
}

#[test]
fn ddp_replicas_stay_identical_every_step_with_many_buckets() {
    let seen = std::sync::Arc::default();
    let mut module = Attached::new(Watched {
        inner: Mlp::new(adamw()),
        rank: 0,
        seen: std::sync::Arc::clone(&seen),
        step: 0,
    });
    // 64-byte buckets: each parameter lands in a bucket of its own (6 all-reduces per step).
    let ddp = wick::strategies::Ddp::new().with_bucket_cap_bytes(64);
    let mut trainer = crate::common::quiet_trainer_with(3, Box::new(ddp), STEPS);
    trainer
        .fit(&mut module, &crate::common::loader(), None)
        .unwrap();
    let seen = seen.lock().unwrap();
    assert_eq!(seen.len(), 3 * STEPS);
    for step in 0..STEPS {
        let at: Vec<_> = seen.iter().filter(|(s, _, _)| *s == step).collect();
        for (_, rank, params) in &at[1..] {
            assert_eq!(
                params, &at[0].2,
                "rank {rank} differs from rank {} at step {step}",
                at[0].1
            );
        }
    }
    // And the bucket layout does not change the result.
    let reference = train(3, "ddp", adamw(), STEPS);
    assert!(max_diff(&reference, &module.inner.parameters()) <= 1e-6);
}

#[test]
fn zero2_reduces_in_small_buckets_and_gathers_in_small_rounds_to_the_same_result() {
    let reference = train(1, "single", adamw(), STEPS);
    // 5 elements per rank and round: rounds split parameters and cross rank boundaries;
    // buckets of one parameter, each reduce-scattered to the one or two ranks it falls in.
    let zero2 = wick::strategies::Zero::stage2()
        .with_chunk(5)
        .with_bucket_cap_bytes(1);
    let mut model = Attached::new(Mlp::new(adamw()));
    let mut trainer = crate::common::quiet_trainer_with(3, Box::new(zero2), STEPS);
    trainer
        .fit(&mut model, &crate::common::loader(), None)
        .unwrap();
    let got = crate::common::full_parameters(&mut trainer, &mut model);
    assert!(max_diff(&reference, &got) <= 1e-5);
}
