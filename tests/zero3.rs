use crate::common::{full_parameters, loader, Mlp};

use candle_core::{DType, Device, Module, Tensor};
use std::sync::{Arc, Mutex};
use wick::accelerator::ThreadWorld;
use wick::core::{Collective, CollectiveError, OptimizerConfig, ReduceOp, Strategy, Work};
use wick::strategies::Zero3;
use wick::trainer::Trainer;

/// Configures the MLP (no training) and returns its assembled parameters.
fn initial_parameters(devices: usize, strategy: &str) -> Vec<Vec<f32>> {
    let mut model = Mlp::new(OptimizerConfig::sgd(0.1));
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
    full_parameters(&mut trainer)
}

#[test]
fn born_sharded_parameters_assemble_bit_identically_for_every_world_size() {
    let single = initial_parameters(1, "single");
    for w in 1..=5 {
        assert_eq!(initial_parameters(w, "zero3"), single, "zero3 at w={w}");
    }
}

/// A world that records every call (name and length) before passing it on.
struct Recording {
    inner: Arc<dyn Collective>,
    log: Mutex<Vec<String>>,
}

impl Recording {
    fn note(&self, op: &str, t: &Tensor) {
        self.log
            .lock()
            .unwrap()
            .push(format!("{op}({})", t.elem_count()));
    }
}

impl Collective for Recording {
    fn rank(&self) -> usize {
        self.inner.rank()
    }
    fn world_size(&self) -> usize {
        self.inner.world_size()
    }
    fn all_gather_into(&self, shard: &Tensor, full: &Tensor) -> Result<(), CollectiveError> {
        self.note("all_gather", full);
        self.inner.all_gather_into(shard, full)
    }
    fn all_gather_host(&self, shard: &Tensor, full: &mut [f32]) -> Result<(), CollectiveError> {
        self.log
            .lock()
            .unwrap()
            .push(format!("all_gather({})", full.len()));
        self.inner.all_gather_host(shard, full)
    }
    fn reduce_scatter_into(
        &self,
        full: &Tensor,
        shard: &Tensor,
        op: ReduceOp,
    ) -> Result<(), CollectiveError> {
        self.note("reduce_scatter", full);
        self.inner.reduce_scatter_into(full, shard, op)
    }
    fn all_reduce_in_place(&self, t: &Tensor, op: ReduceOp) -> Result<(), CollectiveError> {
        self.note("all_reduce", t);
        self.inner.all_reduce_in_place(t, op)
    }
    fn broadcast_in_place(&self, t: &Tensor, root: usize) -> Result<(), CollectiveError> {
        self.note("broadcast", t);
        self.inner.broadcast_in_place(t, root)
    }
    fn barrier(&self) -> Result<(), CollectiveError> {
        self.inner.barrier()
    }
    fn all_gather_start(&self, shard: &Tensor, full: &Tensor) -> Result<Work, CollectiveError> {
        self.inner.all_gather_start(shard, full)
    }
}

#[test]
fn backward_issues_the_same_collectives_in_the_same_order_on_every_rank() {
    for w in 2..=4 {
        let logs = ThreadWorld::new(w).run(|comm| {
            let world = Arc::new(Recording {
                inner: Arc::new(comm),
                log: Mutex::default(),
            });
            let mut zero3 = Zero3::new();
            zero3.connect(world.clone(), Device::Cpu);
            let ctx = zero3.sharded_context(3)?;
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
            zero3.finish_sharding()?;
            zero3.configure_optimizer(&OptimizerConfig::adamw(0.01))?;
            let x = Tensor::ones((4, 5), DType::F32, &Device::Cpu)?;
            for _ in 0..2 {
                let mut h = x.clone();
                for l in &layers {
                    h = l.get()?.forward(&h)?;
                }
                zero3.backward(&h.sqr()?.mean_all()?)?;
                zero3.optimizer_step()?;
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
        .fit(&mut Bare, &loader(), None)
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("'bare.weight' was requested outside a unit") && e.contains("ctx.wrap"),
        "{e}"
    );
}
