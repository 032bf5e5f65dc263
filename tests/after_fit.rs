//! The trained module after `fit`, under every strategy at W = 1, 2 and 3: validate,
//! predict and full_parameters run any number of times in any order and agree with each
//! other and with one device; a bare forward outside the trainer either works (replicated
//! parameters, or a world of one) or says why not and what to call instead.

use crate::common::{adamw, full_parameters, loader, max_diff, quiet_builder, Mlp};
use candle_core::Tensor;
use wick::core::{OptimizerConfig, Strategy};
use wick::strategies::{strategy_by_name, Fsdp, FsdpSharding};
use wick::trainer::{Attached, DataLoader, Dataset, Trainer};

/// Every strategy with the world sizes it runs at here.
fn strategies() -> Vec<(String, usize, Box<dyn Strategy>)> {
    let mut all: Vec<(String, usize, Box<dyn Strategy>)> =
        vec![("single".into(), 1, strategy_by_name("single").unwrap())];
    for world in 1..=3 {
        for name in ["ddp", "zero1", "zero2", "zero3"] {
            all.push((name.into(), world, strategy_by_name(name).unwrap()));
        }
        for sharding in [
            FsdpSharding::FullShard,
            FsdpSharding::ShardGradOp,
            FsdpSharding::NoShard,
        ] {
            all.push((
                format!("fsdp {sharding:?}"),
                world,
                Fsdp::new(sharding).build(),
            ));
        }
    }
    // Hybrid sharding splits its world when connected, the world between stages too.
    let hybrid = FsdpSharding::HybridShard;
    all.push(("fsdp hybrid_shard".into(), 2, Fsdp::new(hybrid).build()));
    all
}

/// 12 held-out samples (one global batch at every W here).
fn eval_data() -> DataLoader<crate::common::Regression> {
    DataLoader::new(crate::common::Regression::new(12), 12).without_shuffle()
}

fn flat(predictions: &[Tensor]) -> Vec<f32> {
    predictions
        .iter()
        .flat_map(|t| t.to_vec1::<f32>().unwrap())
        .collect()
}

/// What the trained module gives, in an order that mixes the calls and repeats each.
struct Seen {
    val: f64,
    predictions: Vec<f32>,
    params: Vec<Vec<f32>>,
}

fn use_after_fit(trainer: &mut Trainer, model: &mut Attached<Mlp>, what: &str) -> Seen {
    let val = trainer.validate(model, &eval_data()).unwrap()["val_loss"];
    let predictions = flat(&trainer.predict(model, &eval_data()).unwrap());
    let params = full_parameters(trainer, model);
    // Again, in another order: nothing changed the parameters.
    assert_eq!(
        full_parameters(trainer, model),
        params,
        "{what}: full_parameters twice"
    );
    let again = trainer.validate(model, &eval_data()).unwrap()["val_loss"];
    assert_eq!(again, val, "{what}: validate after full_parameters");
    assert_eq!(
        flat(&trainer.predict(model, &eval_data()).unwrap()),
        predictions,
        "{what}: predict after validate"
    );
    let test = trainer.test(model, &eval_data()).unwrap()["test_loss"];
    assert_eq!(test, val, "{what}: test sees the validated parameters");
    Seen {
        val,
        predictions,
        params,
    }
}

#[test]
fn the_trained_module_is_usable_after_fit_under_every_strategy() {
    let mut reference: Option<Seen> = None;
    for (name, world, strategy) in strategies() {
        let what = format!("{name} at W={world}");
        let mut model = Attached::new(Mlp::new(adamw()));
        let mut trainer = quiet_builder(world, strategy, 4).build().unwrap();
        trainer.fit(&mut model, &loader(), None).unwrap();
        let seen = use_after_fit(&mut trainer, &mut model, &what);
        match &reference {
            None => reference = Some(seen),
            Some(r) => {
                assert!(
                    max_diff(&r.params, &seen.params) < 1e-5,
                    "{what}: parameters"
                );
                assert!(
                    (r.val - seen.val).abs() < 1e-5,
                    "{what}: {} vs {}",
                    seen.val,
                    r.val
                );
                let p = max_diff(
                    std::slice::from_ref(&r.predictions),
                    std::slice::from_ref(&seen.predictions),
                );
                assert!(p < 1e-5, "{what}: predictions differ by {p}");
            }
        }
        // A bare forward on the caller's module, outside the trainer.
        let (x, _) = eval_data()
            .dataset()
            .batch(&(0..12).collect::<Vec<_>>(), &candle_core::Device::Cpu)
            .unwrap();
        let sharded = trainer.sharding().params;
        match model.forward(&x) {
            Ok(out) => {
                assert!(!sharded || world == 1, "{what}: a sharded module ran alone");
                let out = out.squeeze(1).unwrap().to_vec1::<f32>().unwrap();
                let want = &reference.as_ref().unwrap().predictions;
                assert!(
                    max_diff(&[out], std::slice::from_ref(want)) < 1e-5,
                    "{what}: bare forward"
                );
            }
            Err(e) => {
                let e = e.to_string();
                assert!(sharded && world > 1, "{what}: {e}");
                assert!(!e.contains("left the world"), "{what}: {e}");
                assert!(
                    e.contains("sharded over 3 ranks") || e.contains("sharded over 2 ranks"),
                    "{what}: {e}"
                );
                assert!(
                    e.contains("Trainer::predict") && e.contains("Trainer::full_parameters"),
                    "{what}: {e}"
                );
            }
        }
        // The trainer still works after the failed bare forward.
        let val = trainer.validate(&mut model, &eval_data()).unwrap()["val_loss"];
        assert!(
            (val - reference.as_ref().unwrap().val).abs() < 1e-5,
            "{what}"
        );
    }
}

/// A trainer's state belongs to the `Attached` it configured. A module made after the
/// trained one was dropped (in the same stack slot, so at the same address wherever the
/// compiler reuses it) is new: configured afresh, it validates as an untrained module does,
/// not with the dropped module's trained shards.
#[test]
fn a_module_made_where_a_dropped_one_lay_is_configured_afresh() {
    let quiet = || {
        quiet_builder(2, strategy_by_name("zero3").unwrap(), 6)
            .build()
            .unwrap()
    };
    let untrained = quiet()
        .validate(&mut Attached::new(Mlp::new(adamw())), &eval_data())
        .unwrap()["val_loss"];
    let mut trainer = quiet();
    let mut addresses = Vec::new();
    for round in 0..2 {
        let mut model = Attached::new(Mlp::new(adamw()));
        addresses.push(&*model as *const Mlp as usize);
        let val = match round {
            0 => {
                trainer.fit(&mut model, &loader(), None).unwrap();
                trainer.validate(&mut model, &eval_data()).unwrap()["val_loss"]
            }
            _ => trainer.validate(&mut model, &eval_data()).unwrap()["val_loss"],
        };
        let trained = round == 0;
        assert_eq!(
            val == untrained,
            !trained,
            "round {round}: val_loss {val}, untrained {untrained} (addresses {addresses:x?})"
        );
    }
}

/// Counts the configurations of modules (the `on_configure_sharded_model` hook) on rank 0.
#[derive(Clone, Default)]
struct Configurations(std::sync::Arc<std::sync::atomic::AtomicUsize>);

impl wick::core::Callback for Configurations {
    fn on_configure_sharded_model(&mut self, s: &wick::core::RunState) -> candle_core::Result<()> {
        if s.rank == 0 {
            self.0.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        }
        Ok(())
    }
}

/// Each module keeps what the trainer set up for it: `fit(a)`, `fit(b)`, `validate(a)`
/// finds `a` as its fit left it, without configuring it again, and `b` is its own.
#[test]
fn a_trainer_keeps_each_modules_state_in_the_module() {
    for strategy in ["ddp", "zero3", "fsdp"] {
        let configured = Configurations::default();
        let mut trainer = quiet_builder(2, strategy_by_name(strategy).unwrap(), 4)
            .callback(configured.clone())
            .build()
            .unwrap();
        let count = || configured.0.load(std::sync::atomic::Ordering::Relaxed);
        let mut a = Attached::new(Mlp::new(adamw()));
        let mut b = Attached::new(Mlp::new(OptimizerConfig::sgd(0.5)));
        trainer.fit(&mut a, &loader(), None).unwrap();
        let a_after_fit = trainer.validate(&mut a, &eval_data()).unwrap()["val_loss"];
        let a_params = full_parameters(&mut trainer, &mut a);
        trainer.fit(&mut b, &loader(), None).unwrap();
        assert_eq!(count(), 2, "{strategy}: a and b configured once each");
        let a_again = trainer.validate(&mut a, &eval_data()).unwrap()["val_loss"];
        assert_eq!(a_again, a_after_fit, "{strategy}: a's trained state");
        assert_eq!(
            full_parameters(&mut trainer, &mut a),
            a_params,
            "{strategy}"
        );
        assert_ne!(
            full_parameters(&mut trainer, &mut b),
            a_params,
            "{strategy}: b's own"
        );
        assert_eq!(count(), 2, "{strategy}: nothing configured again");
        assert_eq!(a.num_parameters(), b.num_parameters(), "{strategy}");
    }
}
