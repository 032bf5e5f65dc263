use crate::common::{full_parameters, loader, Mlp};

use crate::common::Recording;
use candle_core::{DType, Device, Module, Tensor};
use wick::accelerator::ThreadWorld;
use wick::core::{GradSync, OptimizerConfig, StepOptions, Strategy};
use wick::strategies::Zero3;
use wick::trainer::{Attached, Trainer};

/// Configures the MLP (no training) and returns its assembled parameters.
fn initial_parameters(devices: usize, strategy: &str) -> Vec<Vec<f32>> {
    let mut model = Attached::new(Mlp::new(OptimizerConfig::sgd(0.1)));
    let mut trainer = Trainer::builder()
        .devices(devices)
        .strategy(strategy)
        .seed(7)
        .no_logger()
        .progress(false)
        .build()
        .unwrap();
    // 60 samples in global batches of 60: divisible by 1..=5 ranks.
    let data = wick::trainer::DataLoader::new(crate::common::Regression::new(60), 60);
    trainer.validate(&mut model, &data).unwrap();
    full_parameters(&mut trainer, &mut model)
}

#[test]
fn born_sharded_parameters_assemble_bit_identically_for_every_world_size() {
    let single = initial_parameters(1, "single");
    for w in 1..=5 {
        assert_eq!(initial_parameters(w, "zero3"), single, "zero3 at w={w}");
    }
}

#[test]
fn backward_issues_the_same_collectives_in_the_same_order_on_every_rank() {
    for w in 2..=4 {
        let logs = ThreadWorld::new(w).run(|comm| {
            let world = Recording::over(comm);
            let open = Zero3::new().open(world.clone(), Device::Cpu, 3)?;
            let ctx = open.context();
            let layers = {
                let _open = ctx.enter();
                (0..3)
                    .map(|i| {
                        ctx.wrap(&format!("l{i}"), move |vb| {
                            candle_nn::linear(5 + i, 6 + i, vb)
                        })
                    })
                    .collect::<candle_core::Result<Vec<_>>>()?
            };
            let mut zero3 = open.close()?;
            zero3.configure_optimizer(&OptimizerConfig::adamw(0.01), StepOptions::default());
            let x = Tensor::ones((4, 5), DType::F32, &Device::Cpu)?;
            for _ in 0..2 {
                let mut h = x.clone();
                for l in &layers {
                    h = l.get()?.forward(&h)?;
                }
                zero3.backward(&h.sqr()?.mean_all()?, GradSync::Reduce)?;
                zero3.optimizer_step(0.01)?;
            }
            let log = world.log.lock().unwrap().clone();
            Ok::<_, wick::core::Error>(log)
        });
        let logs: Vec<Vec<String>> = logs.into_iter().map(|l| l.unwrap()).collect();
        // Per step: three gathers in forward, then three reduce-scatters in backward.
        assert_eq!(
            logs[0]
                .iter()
                .filter(|e| e.starts_with("reduce_scatter"))
                .count(),
            6,
            "{:?}",
            logs[0]
        );
        assert_eq!(
            logs[0]
                .iter()
                .filter(|e| e.starts_with("all_gather"))
                .count(),
            6,
            "{:?}",
            logs[0]
        );
        for (rank, log) in logs.iter().enumerate() {
            assert_eq!(log, &logs[0], "w={w}: rank {rank} issued another sequence");
        }
    }
}

#[test]
fn a_parameter_outside_a_unit_is_refused_under_zero3() {
    #[derive(Clone)]
    struct Bare;
    impl wick::core::TrainModule for Bare {
        type Batch = (Tensor, Tensor);
        fn configure_sharded_model(
            &mut self,
            ctx: &wick::core::ShardedContext,
        ) -> candle_core::Result<()> {
            candle_nn::linear(5, 1, ctx.var_builder().pp("bare"))?;
            Ok(())
        }
        fn training_step(&mut self, b: &Self::Batch, _: usize) -> candle_core::Result<Tensor> {
            b.1.mean_all()
        }
    }
    let e = crate::common::quiet_trainer(2, "zero3", 1)
        .fit(&mut Attached::new(Bare), &loader(), None)
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("'bare.weight' was requested outside a unit") && e.contains("ctx.wrap"),
        "{e}"
    );
}
