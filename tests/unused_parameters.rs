//! Parameters that receive no gradient are reported by name at the first step, whatever
//! the strategy: here because candle-nn's fused `LayerNorm` has no backward, so nothing
//! before it trains. `error_on_unused_parameters` turns the report into an error.

use crate::common::{loader, quiet_builder, FEATURES};
use candle_core::{Module, Tensor};
use candle_nn::{LayerNorm, Linear};
use wick::core::{OptimizerConfig, ShardedContext, Strategy, TrainModule, Wrapped};
use wick::strategies::{strategy_by_name, Fsdp, FsdpSharding};
use wick::trainer::{Attached, TrainerError};

/// linear -> candle-nn LayerNorm -> linear, each a unit of its own.
#[derive(Clone, Default)]
struct CutByLayerNorm {
    units: Option<(Wrapped<Linear>, Wrapped<LayerNorm>, Wrapped<Linear>)>,
}

impl TrainModule for CutByLayerNorm {
    type Batch = (Tensor, Tensor);

    fn configure_sharded_model(&mut self, ctx: &ShardedContext) -> candle_core::Result<()> {
        self.units = Some((
            ctx.wrap("first", |vb| candle_nn::linear(FEATURES, 8, vb))?,
            ctx.wrap("norm", |vb| candle_nn::layer_norm(8, 1e-5, vb))?,
            ctx.wrap("last", |vb| candle_nn::linear(8, 1, vb))?,
        ));
        Ok(())
    }

    fn configure_optimizers(&self) -> OptimizerConfig {
        OptimizerConfig::sgd(0.1)
    }

    fn training_step(&mut self, (x, y): &Self::Batch, _: usize) -> candle_core::Result<Tensor> {
        let (first, norm, last) = self.units.as_ref().expect("configured");
        let h = first.apply(x, |l, x| l.forward(x))?;
        let h = norm.apply(&h, |l, x| l.forward(x))?;
        let out = last.apply(&h, |l, x| l.forward(x))?;
        (out - y)?.sqr()?.mean_all()
    }
}

/// Makes a strategy afresh, for each trainer of a test.
type MakeStrategy = Box<dyn Fn() -> Box<dyn Strategy>>;

/// Every strategy, at 1 and 2 ranks.
fn strategies() -> Vec<(String, usize, MakeStrategy)> {
    let mut all: Vec<(String, usize, MakeStrategy)> = Vec::new();
    let by_name =
        |name: &'static str| -> MakeStrategy { Box::new(move || strategy_by_name(name).unwrap()) };
    all.push(("single".into(), 1, by_name("single")));
    for world in [1, 2] {
        for name in ["ddp", "zero1", "zero2", "zero3"] {
            all.push((name.into(), world, by_name(name)));
        }
        for sharding in [FsdpSharding::FullShard, FsdpSharding::ShardGradOp] {
            let name = format!("fsdp {sharding:?}");
            all.push((name, world, Box::new(move || Fsdp::new(sharding).build())));
        }
    }
    all
}

const CUT: [&str; 4] = ["first.weight", "first.bias", "norm.weight", "norm.bias"];

#[test]
fn every_strategy_names_the_parameters_without_gradient() {
    for (name, world, strategy) in strategies() {
        let mut model = Attached::new(CutByLayerNorm::default());
        let mut probe = quiet_builder(world, strategy(), 2).build().unwrap();
        // Warned, not failed: training goes on.
        probe.fit(&mut model, &loader(), None).unwrap();
        let e = quiet_builder(world, strategy(), 2)
            .error_on_unused_parameters(true)
            .build()
            .unwrap()
            .fit(
                &mut Attached::new(CutByLayerNorm::default()),
                &loader(),
                None,
            )
            .expect_err(&format!("{name} at {world} did not refuse"));
        let names = match &e {
            TrainerError::UnusedParameters { names } => names.clone(),
            TrainerError::RankFailed { message, .. } => {
                assert!(
                    message.contains("received no gradient"),
                    "{name}: {message}"
                );
                CUT.iter()
                    .filter(|n| message.contains(*n))
                    .map(|n| n.to_string())
                    .collect()
            }
            other => panic!("{name} at {world}: {other}"),
        };
        let mut sorted = names.clone();
        sorted.sort();
        let mut expected: Vec<String> = CUT.iter().map(|n| n.to_string()).collect();
        expected.sort();
        assert_eq!(sorted, expected, "{name} at {world}: {e}");
        assert!(!e.to_string().contains("last."), "{name} at {world}: {e}");
    }
}

#[test]
fn a_model_whose_parameters_all_train_passes_the_strict_check() {
    for (name, world, strategy) in strategies() {
        let mut trainer = quiet_builder(world, strategy(), 2)
            .error_on_unused_parameters(true)
            .build()
            .unwrap();
        let outcome = trainer.fit(
            &mut Attached::new(crate::common::Mlp::new(OptimizerConfig::sgd(0.1))),
            &loader(),
            None,
        );
        assert!(
            outcome.is_ok(),
            "{name} at {world}: {}",
            outcome.unwrap_err()
        );
    }
}

/// The MLP with a fourth unit that is created but never applied.
#[derive(Clone)]
struct WithIdleUnit {
    mlp: crate::common::Mlp,
    idle: Option<Wrapped<Linear>>,
}

impl TrainModule for WithIdleUnit {
    type Batch = (Tensor, Tensor);

    fn configure_sharded_model(&mut self, ctx: &ShardedContext) -> candle_core::Result<()> {
        self.mlp.configure_sharded_model(ctx)?;
        self.idle = Some(ctx.wrap("idle", |vb| candle_nn::linear(3, 2, vb))?);
        Ok(())
    }

    fn configure_optimizers(&self) -> OptimizerConfig {
        OptimizerConfig::sgd(0.1)
    }

    fn training_step(&mut self, batch: &Self::Batch, _: usize) -> candle_core::Result<Tensor> {
        self.mlp.loss(batch)
    }
}

#[test]
fn a_unit_that_is_never_applied_is_reported_by_every_strategy() {
    for (name, world, strategy) in strategies() {
        let idle = || WithIdleUnit {
            mlp: crate::common::Mlp::new(OptimizerConfig::sgd(0.1)),
            idle: None,
        };
        // Warned, not failed.
        quiet_builder(world, strategy(), 2)
            .build()
            .unwrap()
            .fit(&mut Attached::new(idle()), &loader(), None)
            .unwrap_or_else(|e| panic!("{name} at {world}: {e}"));
        let e = quiet_builder(world, strategy(), 2)
            .error_on_unused_parameters(true)
            .build()
            .unwrap()
            .fit(&mut Attached::new(idle()), &loader(), None)
            .expect_err(&format!("{name} at {world} did not refuse"));
        let message = e.to_string();
        assert!(
            message.contains("received no gradient")
                && message.contains("idle.weight")
                && message.contains("idle.bias"),
            "{name} at {world}: {message}"
        );
        assert!(!message.contains("l0."), "{name} at {world}: {message}");
    }
}

/// The MLP whose step first runs the same forward without a graph (as preference tuning's
/// reference pass runs the model with its adapters off) and then the one it trains on.
#[derive(Clone)]
struct WithNoGradPass {
    mlp: crate::common::Mlp,
}

impl TrainModule for WithNoGradPass {
    type Batch = (Tensor, Tensor);

    fn configure_sharded_model(&mut self, ctx: &ShardedContext) -> candle_core::Result<()> {
        self.mlp.configure_sharded_model(ctx)
    }

    fn configure_optimizers(&self) -> OptimizerConfig {
        OptimizerConfig::sgd(0.1)
    }

    fn training_step(&mut self, batch: &Self::Batch, _: usize) -> candle_core::Result<Tensor> {
        wick::core::no_grad(|| self.mlp.loss(batch))?;
        self.mlp.loss(batch)
    }
}

#[test]
fn a_forward_without_a_graph_beside_the_trained_one_is_no_unused_parameter() {
    for (name, world, strategy) in strategies() {
        let model = WithNoGradPass {
            mlp: crate::common::Mlp::new(OptimizerConfig::sgd(0.1)),
        };
        quiet_builder(world, strategy(), 2)
            .error_on_unused_parameters(true)
            .build()
            .unwrap()
            .fit(&mut Attached::new(model), &loader(), None)
            .unwrap_or_else(|e| panic!("{name} at {world}: {e}"));
    }
}
