use crate::common::{adamw, full_parameters, loader, max_diff, train, Mlp, Recording, Regression};
use candle_core::{DType, Device, Module, Tensor};
use candle_nn::Linear;
use std::sync::Arc;
use wick::accelerator::ThreadWorld;
use wick::core::{GradSync, OptimizerConfig, ShardedContext, StepOptions, TrainModule, Wrapped};
use wick::strategies::{Fsdp, FsdpSharding, StrategySpec};
use wick::trainer::{Attached, DataLoader, Trainer};

const STEPS: usize = 10;

fn fsdp_trainer(devices: usize, sharding: FsdpSharding) -> Trainer {
    crate::common::quiet_trainer_with(devices, Fsdp::new(sharding).build(), STEPS)
}

fn train_fsdp<M: TrainModule<Batch = (Tensor, Tensor)> + Clone + 'static>(
    devices: usize,
    sharding: FsdpSharding,
    model: M,
) -> Vec<Vec<f32>> {
    let mut trainer = fsdp_trainer(devices, sharding);
    let mut model = Attached::new(model);
    trainer.fit(&mut model, &loader(), None).unwrap();
    full_parameters(&mut trainer, &mut model)
}

#[test]
fn every_sharding_strategy_matches_single_device() {
    let reference = train(1, "single", adamw(), STEPS);
    for sharding in [
        FsdpSharding::FullShard,
        FsdpSharding::ShardGradOp,
        FsdpSharding::NoShard,
    ] {
        for w in [1, 2, 4] {
            let got = train_fsdp(w, sharding, Mlp::new(adamw()));
            let diff = max_diff(&reference, &got);
            assert!(diff <= 1e-5, "{sharding:?} w={w}: max |diff| {diff}");
        }
    }
    // Hybrid at 4 ranks: two groups of two.
    let got = train_fsdp(4, FsdpSharding::HybridShard, Mlp::new(adamw()));
    let diff = max_diff(&reference, &got);
    assert!(diff <= 1e-5, "hybrid 2x2: max |diff| {diff}");
}

/// Fits a fresh MLP with `trainer`; checks that its units' forwards ran `runs_per_step`
/// times a step over all ranks, and that training ends at single-device `reference`.
fn fit_counting_forwards(
    mut trainer: Trainer,
    runs_per_step: usize,
    reference: &[Vec<f32>],
    what: &str,
) {
    let model = Mlp::new(adamw());
    let runs = model.runs.clone();
    let mut model = Attached::new(model);
    trainer.fit(&mut model, &loader(), None).unwrap();
    assert_eq!(
        runs.load(std::sync::atomic::Ordering::Relaxed),
        STEPS * runs_per_step,
        "{what}: unit forwards"
    );
    let diff = max_diff(reference, &full_parameters(&mut trainer, &mut model));
    assert!(diff <= 1e-5, "{what}: max |diff| {diff}");
}

/// Under full_shard each unit keeps its activations: its forward runs once per step, and
/// the result is single-device training's. Activation checkpointing recomputes the units
/// it picks in backward (twice per step), with the same result.
#[test]
fn full_shard_runs_each_forward_once_unless_checkpointing_recomputes_it() {
    use wick::core::ActivationCheckpointing as Ac;
    let reference = train(1, "single", adamw(), STEPS);
    // Runs of the three units' forwards per step and rank: once each, plus once more for
    // every unit recomputed (`every:2` picks the second).
    for (ac, runs_per_step) in [(Ac::None, 3), (Ac::Full, 6), (Ac::Every(2), 4)] {
        for (sharding, w) in [
            (FsdpSharding::FullShard, 1),
            (FsdpSharding::FullShard, 2),
            (FsdpSharding::FullShard, 3),
            (FsdpSharding::HybridShard, 4),
        ] {
            let fsdp = Fsdp::new(sharding).with_activation_checkpointing(ac);
            fit_counting_forwards(
                crate::common::quiet_trainer_with(w, fsdp.build(), STEPS),
                w * runs_per_step,
                &reference,
                &format!("{sharding:?} at W={w}, activation checkpointing {ac}"),
            );
        }
    }
}

/// Activation checkpointing under every strategy: the units it picks run their forward
/// again in backward, and training ends where single-device training without it does, at
/// world sizes the layer sizes do not divide.
#[test]
fn activation_checkpointing_under_every_strategy_matches_single_device() {
    use wick::core::ActivationCheckpointing as Ac;
    let reference = train(1, "single", adamw(), STEPS);
    // The choice made in the strategy's spec, as `wick fit` makes it.
    let make = |name: &str, ac: Ac| -> Box<dyn wick::core::Strategy> {
        let spec = match name.strip_prefix("fsdp ") {
            Some(sharding) => StrategySpec::from(Fsdp::new(sharding.parse().unwrap())),
            None => StrategySpec::new(name.parse().unwrap()),
        };
        spec.with_activation_checkpointing(ac).build()
    };
    let strategies = [
        ("single", 1),
        ("ddp", 3),
        ("zero1", 2),
        ("zero2", 3),
        ("zero3", 3),
        ("fsdp shard_grad_op", 2),
        ("fsdp no_shard", 2),
        ("fsdp full_shard", 3),
    ];
    for (name, w) in strategies {
        for (ac, runs_per_step) in [(Ac::Full, 6), (Ac::Every(3), 4)] {
            let trainer = crate::common::quiet_builder(w, make(name, ac), STEPS)
                .error_on_unused_parameters(true)
                .build()
                .unwrap();
            fit_counting_forwards(
                trainer,
                w * runs_per_step,
                &reference,
                &format!("{name} at W={w}, activation checkpointing {ac}"),
            );
        }
    }
    // The same choice made on an instance.
    let fsdp = Fsdp::new(FsdpSharding::FullShard).with_activation_checkpointing(Ac::Full);
    let trainer = crate::common::quiet_builder(3, fsdp.build(), STEPS)
        .error_on_unused_parameters(true)
        .build()
        .unwrap();
    fit_counting_forwards(trainer, 3 * 6, &reference, "an fsdp instance");
}

#[test]
fn hybrid_groups_must_divide_the_world() {
    let e = Trainer::builder()
        .devices(4)
        .strategy(
            Fsdp::new(FsdpSharding::HybridShard)
                .with_group_size(3)
                .unwrap()
                .build(),
        )
        .build()
        .err()
        .unwrap()
        .to_string();
    assert!(e.contains("groups of 3"), "{e}");
}

/// All-gathers one training step issues under `sharding` at W = 2 for a 3-unit model.
fn gathers_per_step(sharding: FsdpSharding) -> usize {
    let (waited, started) = gathers_per_step_of(|| Fsdp::new(sharding));
    assert_eq!(started, 0, "no prefetch, no gather started ahead");
    waited
}

/// All-gathers one training step issues under the strategy `make` builds, at W = 2: those
/// made when a unit needs its parameters, and those started ahead (prefetch).
fn gathers_per_step_of(make: impl Fn() -> Fsdp + Sync) -> (usize, usize) {
    let logs = ThreadWorld::new(2).run(|comm| {
        let world = Recording::over(comm);
        let open = make().build().open(world.clone(), Device::Cpu, 1)?;
        let ctx = open.context();
        let units = {
            let _open = ctx.enter();
            (0..3)
                .map(|i| ctx.wrap(&format!("l{i}"), |vb| candle_nn::linear(4, 4, vb)))
                .collect::<candle_core::Result<Vec<_>>>()?
        };
        let mut s = open.close()?;
        s.configure_optimizer(&adamw(), StepOptions::default());
        let mut h = Tensor::ones((2, 4), DType::F32, &Device::Cpu)?;
        for u in &units {
            h = u.apply(&h, |l, x| l.forward(x))?;
        }
        s.backward(&h.sqr()?.mean_all()?, GradSync::Reduce)?;
        s.optimizer_step(adamw().lr())?;
        let log = world.log.lock().unwrap().clone();
        Ok::<_, wick::core::Error>(log)
    });
    let log = logs.into_iter().next().unwrap().unwrap();
    let count = |call: &str| log.iter().filter(|e| e.starts_with(call)).count();
    (count("all_gather("), count("all_gather_start("))
}

#[test]
fn prefetch_starts_gathers_ahead_and_changes_nothing() {
    // With prefetch only the first unit of forward and the first of backward are gathered
    // when needed; the other four were started ahead, while the unit before them ran.
    assert_eq!(
        gathers_per_step_of(|| Fsdp::new(FsdpSharding::FullShard).with_prefetch(true)),
        (2, 4)
    );
    let reference = train(1, "single", adamw(), STEPS);
    for (sharding, w) in [
        (FsdpSharding::FullShard, 2),
        (FsdpSharding::FullShard, 4),
        (FsdpSharding::HybridShard, 4),
    ] {
        let fsdp = Fsdp::new(sharding).with_prefetch(true);
        let mut t = crate::common::quiet_trainer_with(w, fsdp.build(), STEPS);
        let mut m = Attached::new(Mlp::new(adamw()));
        t.fit(&mut m, &loader(), None).unwrap();
        let diff = max_diff(&reference, &full_parameters(&mut t, &mut m));
        assert!(
            diff <= 1e-5,
            "{sharding:?} w={w} with prefetch: max |diff| {diff}"
        );
    }
}

#[test]
fn full_shard_gathers_each_unit_again_in_backward() {
    // Forward and backward each gather every unit once: the forward's gather was freed.
    assert_eq!(gathers_per_step(FsdpSharding::FullShard), 6);
    // shard_grad_op keeps the forward's gather alive until backward.
    assert_eq!(gathers_per_step(FsdpSharding::ShardGradOp), 3);
}

/// One unit used twice per forward (its weights tied to themselves), plus an output layer.
#[derive(Clone)]
struct Tied {
    shared: Option<Wrapped<Linear>>,
    out: Option<Wrapped<Linear>>,
}

impl TrainModule for Tied {
    type Batch = (Tensor, Tensor);
    fn configure_sharded_model(&mut self, ctx: &ShardedContext) -> candle_core::Result<()> {
        self.shared = Some(ctx.wrap("shared", |vb| candle_nn::linear(5, 5, vb))?);
        self.out = Some(ctx.wrap("out", |vb| candle_nn::linear(5, 1, vb))?);
        Ok(())
    }
    fn configure_optimizers(&self) -> OptimizerConfig {
        adamw()
    }
    fn training_step(&mut self, (x, y): &Self::Batch, _: usize) -> candle_core::Result<Tensor> {
        let shared = self.shared.as_ref().unwrap();
        let h = shared.apply(x, |l, x| l.forward(x)?.tanh())?;
        let h = shared.apply(&h, |l, x| l.forward(x)?.tanh())?;
        let pred = self.out.as_ref().unwrap().apply(&h, |l, x| l.forward(x))?;
        (pred - y)?.sqr()?.mean_all()
    }
}

#[test]
fn a_unit_used_twice_in_one_forward_trains_like_single() {
    let tied = || Tied {
        shared: None,
        out: None,
    };
    let params = |strategy: &str, devices| {
        let mut t = Trainer::builder()
            .devices(devices)
            .strategy(strategy)
            .max_steps(STEPS)
            .seed(3)
            .no_logger()
            .progress(false)
            .model_summary(false)
            .build()
            .unwrap();
        let mut m = Attached::new(tied());
        t.fit(&mut m, &DataLoader::new(Regression::new(96), 12), None)
            .unwrap();
        t.full_parameters(&mut m)
            .unwrap()
            .into_iter()
            .map(|(_, p)| p.flatten_all().unwrap().to_vec1::<f32>().unwrap())
            .collect::<Vec<_>>()
    };
    let reference = params("single", 1);
    for (strategy, devices) in [("fsdp", 2), ("fsdp", 4), ("zero3", 2), ("ddp", 2)] {
        let diff = max_diff(&reference, &params(strategy, devices));
        assert!(diff <= 1e-5, "{strategy} w={devices}: max |diff| {diff}");
    }
}

#[test]
fn wrapping_the_same_name_twice_is_refused() {
    #[derive(Clone)]
    struct Twice;
    impl TrainModule for Twice {
        type Batch = (Tensor, Tensor);
        fn configure_sharded_model(&mut self, ctx: &ShardedContext) -> candle_core::Result<()> {
            ctx.wrap("emb", |vb| candle_nn::linear(5, 5, vb))?;
            ctx.wrap("emb", |vb| candle_nn::linear(5, 5, vb))?;
            Ok(())
        }
        fn training_step(&mut self, b: &Self::Batch, _: usize) -> candle_core::Result<Tensor> {
            b.1.mean_all()
        }
    }
    let e = crate::common::quiet_trainer(2, "fsdp", 1)
        .fit(&mut Attached::new(Twice), &loader(), None)
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("unit 'emb' wrapped twice") && e.contains("reuse its handle"),
        "{e}"
    );
}

/// Mixed precision against single-device f32. The loss is divided by 64 in every run: at
/// `16-mixed`'s initial loss scale of 2^16 this model's first gradients overflow f16, and
/// the skipped step (as torch's GradScaler would skip it) leaves the parameters 0.09 from
/// f32 after 10 steps; at 2^10 no step is skipped. AdamW's update does not depend on the
/// loss's scale, so the f32 reference is the same training.
#[test]
fn mixed_precision_trains_close_to_single_f32() {
    use crate::common::RankedMlp;
    use wick::strategies::Precision;
    let model = || RankedMlp::scaled(adamw(), 1.0 / 64.0);
    let mut single = crate::common::quiet_trainer(1, "single", STEPS);
    let mut m = Attached::new(model());
    single.fit(&mut m, &loader(), None).unwrap();
    let reference = full_parameters(&mut single, &mut m);
    for (name, tolerance) in [("bf16-mixed", 1e-2), ("16-mixed", 2e-3)] {
        let precision = name.parse::<Precision>().unwrap();
        for sharding in [FsdpSharding::FullShard, FsdpSharding::ShardGradOp] {
            let fsdp = Fsdp::new(sharding).with_precision(precision).unwrap();
            let mut trainer = crate::common::quiet_trainer_with(2, fsdp.build(), STEPS);
            let mut m = Attached::new(model());
            let metrics = trainer.fit(&mut m, &loader(), None).unwrap();
            let diff = max_diff(&reference, &full_parameters(&mut trainer, &mut m));
            println!("{name} {sharding:?}: max |diff| vs single f32 = {diff}");
            assert!(
                diff <= tolerance,
                "{name} {sharding:?}: max |diff| {diff} > {tolerance}"
            );
            // The half-precision compute is real: results differ from f32.
            assert!(diff > 1e-6, "{name} {sharding:?} matched f32 exactly");
            // Only 16-mixed scales the loss, and no step was skipped.
            let scale = metrics.get("loss_scale").copied();
            let want = (name == "16-mixed").then_some(65536.0);
            assert_eq!(scale, want, "{name} {sharding:?}");
        }
    }
    let bf16 = Precision::Bf16Mixed;
    assert!(Fsdp::new(FsdpSharding::NoShard)
        .with_precision(bf16)
        .is_err());
}

#[test]
fn mixed_precision_units_take_integer_inputs_and_return_f32() {
    use wick::strategies::Precision;
    let embed = |precision: &str| {
        let outcomes = ThreadWorld::new(1).run(|comm| {
            let open = Fsdp::new(FsdpSharding::FullShard)
                .with_precision(precision.parse::<Precision>()?)?
                .build()
                .open(Arc::new(comm), Device::Cpu, 9)?;
            let ctx = open.context();
            let unit = {
                let _open = ctx.enter();
                ctx.wrap("emb", |vb| candle_nn::embedding(5, 3, vb))?
            };
            let _s = open.close()?;
            let ids = Tensor::new(&[[0u32, 3, 4]], &Device::Cpu)?;
            let out = unit.apply(&ids, |e, ids| e.forward(ids))?;
            assert_eq!(out.dtype(), DType::F32);
            Ok::<_, wick::core::Error>(out.flatten_all()?.to_vec1::<f32>()?)
        });
        outcomes.into_iter().next().unwrap().unwrap()
    };
    let full = embed("32");
    let half = embed("bf16-mixed");
    assert!(full.iter().any(|v| v.fract() != 0.0));
    for (a, b) in full.iter().zip(&half) {
        assert!(
            (a - b).abs() <= 1e-2 * a.abs().max(1.0),
            "{full:?} vs {half:?}"
        );
    }
}

#[test]
fn an_auto_wrap_policy_picks_the_units_without_model_changes() {
    let by_name = |mut params: Vec<(String, Tensor)>| {
        params.sort_by(|a, b| a.0.cmp(&b.0));
        params
            .into_iter()
            .map(|(_, t)| t.flatten_all().unwrap().to_vec1::<f32>().unwrap())
            .collect::<Vec<_>>()
    };
    let mut single = crate::common::quiet_trainer(1, "single", STEPS);
    let mut m = Attached::new(Mlp::new(adamw()));
    single.fit(&mut m, &loader(), None).unwrap();
    let reference = by_name(single.full_parameters(&mut m).unwrap());
    for sharding in [FsdpSharding::FullShard, FsdpSharding::ShardGradOp] {
        for w in [2, 4] {
            let fsdp = Fsdp::new(sharding).with_auto_wrap(vec!["l1".into()]);
            let mut t = crate::common::quiet_trainer_with(w, fsdp.build(), STEPS);
            let mut m = Attached::new(Mlp::new(adamw()));
            t.fit(&mut m, &loader(), None).unwrap();
            let diff = max_diff(&reference, &by_name(t.full_parameters(&mut m).unwrap()));
            assert!(diff <= 1e-5, "{sharding:?} w={w}: max |diff| {diff}");
        }
    }
    // l0 and l2 share the root unit: two gathers per step instead of three.
    let policy = || Fsdp::new(FsdpSharding::ShardGradOp).with_auto_wrap(vec!["l1".into()]);
    assert_eq!(gathers_per_step_of(policy), (2, 0));
}

/// A unit whose closure keeps a clone of its layer's weight and uses it after the unit's
/// forward, when full_shard has released the gathered weight (its activations are kept):
/// every use reads an error naming the release, never the memory behind it.
#[derive(Clone)]
struct KeepsAClone {
    layer: Option<Wrapped<Linear>>,
    out: Option<Wrapped<Linear>>,
    kept: Arc<std::sync::Mutex<Option<Tensor>>>,
    errors: Arc<std::sync::Mutex<Vec<String>>>,
}

impl TrainModule for KeepsAClone {
    type Batch = (Tensor, Tensor);
    fn configure_sharded_model(&mut self, ctx: &ShardedContext) -> candle_core::Result<()> {
        self.layer = Some(ctx.wrap("layer", |vb| candle_nn::linear(5, 5, vb))?);
        self.out = Some(ctx.wrap("out", |vb| candle_nn::linear(5, 1, vb))?);
        Ok(())
    }
    fn configure_optimizers(&self) -> OptimizerConfig {
        adamw()
    }
    fn training_step(&mut self, (x, y): &Self::Batch, _: usize) -> candle_core::Result<Tensor> {
        let kept = self.kept.clone();
        let h = self.layer.as_ref().unwrap().apply(x, move |l, x| {
            *kept.lock().unwrap() = Some(l.weight().clone());
            l.forward(x)
        })?;
        let pred = self.out.as_ref().unwrap().apply(&h, |l, x| l.forward(x))?;
        let weight = self.kept.lock().unwrap().clone().unwrap();
        for outcome in [
            x.matmul(&weight.t()?).map(|_| ()),
            weight.sum_all().map(|_| ()),
            weight.to_vec2::<f32>().map(|_| ()),
        ] {
            let e = match outcome {
                Ok(()) => panic!("a released weight was read: {weight}"),
                Err(e) => e,
            };
            self.errors.lock().unwrap().push(e.to_string());
        }
        (pred - y)?.sqr()?.mean_all()
    }
}

#[test]
fn a_clone_of_a_released_parameter_reads_an_error_not_freed_memory() {
    for w in [1, 2] {
        let errors = Arc::new(std::sync::Mutex::new(Vec::new()));
        let module = KeepsAClone {
            layer: None,
            out: None,
            kept: Arc::default(),
            errors: errors.clone(),
        };
        let mut trainer = fsdp_trainer(w, FsdpSharding::FullShard);
        let mut model = Attached::new(module);
        trainer.fit(&mut model, &loader(), None).unwrap();
        let errors = errors.lock().unwrap();
        // Three reads per step on every rank, each refused.
        assert_eq!(errors.len(), 3 * STEPS * w, "W={w}");
        assert!(errors.iter().all(|e| e.contains("released")), "{errors:?}");
    }
}
