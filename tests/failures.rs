use crate::common::{loader, quiet_trainer, Mlp};
use candle_core::Tensor;
use std::time::{Duration, Instant};
use wick::core::{OptimizerConfig, ShardedContext, TrainModule};
use wick::trainer::{Attached, DataLoader, Trainer, TrainerError};

/// The MLP, but rank `bad_rank` fails at step `at_step`, by error or by panic.
#[derive(Clone)]
struct Failing {
    inner: Mlp,
    rank: usize,
    bad_rank: usize,
    at_step: usize,
    steps: usize,
    panic: bool,
}

impl TrainModule for Failing {
    type Batch = (Tensor, Tensor);
    fn configure_sharded_model(&mut self, ctx: &ShardedContext) -> candle_core::Result<()> {
        self.rank = ctx.rank();
        self.inner.configure_sharded_model(ctx)
    }
    fn training_step(&mut self, batch: &Self::Batch, _: usize) -> candle_core::Result<Tensor> {
        self.steps += 1;
        if self.rank == self.bad_rank && self.steps == self.at_step {
            if self.panic {
                panic!("injected panic");
            }
            candle_core::bail!("injected error");
        }
        self.inner.loss(batch)
    }
}

fn fit_with_failure(panic: bool) {
    // zero3's and fsdp's collectives run inside Candle ops: the peer's failure reaches the
    // others wrapped in the op's error, and must still be recognised as the peer's.
    for strategy in ["ddp", "zero1", "zero2", "zero3", "fsdp"] {
        fit_with_failure_under(strategy, panic);
    }
}

fn fit_with_failure_under(strategy: &str, panic: bool) {
    let world = 3;
    let mut module = Attached::new(Failing {
        inner: Mlp::new(OptimizerConfig::sgd(0.1)),
        rank: 0,
        bad_rank: 1,
        at_step: 3,
        steps: 0,
        panic,
    });
    let start = Instant::now();
    let err = quiet_trainer(world, strategy, 8)
        .fit(&mut module, &loader(), None)
        .unwrap_err();
    // The others learn of the failure from the failing rank, not from the collective
    // timeout (600 s): the bound is far below it, and generous for a loaded machine.
    assert!(
        start.elapsed() < Duration::from_secs(120),
        "took {:?}",
        start.elapsed()
    );
    let injected = if panic {
        "injected panic"
    } else {
        "injected error"
    };
    match &err {
        TrainerError::RankFailed {
            rank,
            message,
            ranks,
        } => {
            assert_eq!(*rank, 1, "{strategy}: {err}");
            assert!(message.contains(injected), "{message}");
            assert_eq!(ranks.len(), world, "every rank's fit failed: {ranks:?}");
            for (r, m) in ranks {
                assert!(m.starts_with(&format!("rank {r}: ")), "{m}");
                assert!(
                    m.contains(injected),
                    "rank {r}'s error should carry rank 1's cause: {m}"
                );
                if *r != 1 {
                    assert!(
                        m.contains("rank 1 failed"),
                        "rank {r}'s error should name rank 1: {m}"
                    );
                }
            }
        }
        other => panic!("expected RankFailed, got {other}"),
    }
    assert!(err.to_string().starts_with("rank 1 failed"), "{err}");
}

#[test]
fn a_rank_that_errors_mid_fit_fails_every_rank_naming_it() {
    fit_with_failure(false);
}

#[test]
fn a_rank_that_panics_mid_fit_fails_every_rank_naming_it() {
    fit_with_failure(true);
}

#[test]
fn zero_devices_is_an_error() {
    let e = Trainer::builder()
        .devices(0)
        .build()
        .err()
        .unwrap()
        .to_string();
    assert!(e.contains("devices") && e.contains("at least 1"), "{e}");
}

#[test]
fn cuda_that_is_not_there_is_an_error_not_a_cpu_run() {
    let e = Trainer::builder()
        .devices(2)
        .device_kind(wick::accelerator::DeviceKind::Cuda)
        .build()
        .err()
        .unwrap()
        .to_string();
    if cfg!(feature = "cuda") {
        // A CUDA build here finds no driver or too few GPUs (scripts/gpu-check.sh --dry-run).
        assert!(e.contains("GPU") || e.contains("CUDA device"), "{e}");
    } else {
        assert!(e.contains("built without the `cuda` feature"), "{e}");
    }
    let e = wick::accelerator::Accelerator::cuda_one_gpu(2)
        .unwrap_err()
        .to_string();
    assert!(e.contains("cuda"), "{e}");
}

#[test]
fn a_batch_that_does_not_divide_by_the_ranks_is_an_error() {
    let mut m = Attached::new(Mlp::new(OptimizerConfig::sgd(0.1)));
    let data = DataLoader::new(crate::common::Regression::new(96), 10);
    let e = quiet_trainer(4, "ddp", 1)
        .fit(&mut m, &data, None)
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("global batch size 10 does not divide by 4 ranks"),
        "{e}"
    );
    assert!(!m.is_built(), "nothing ran");
}

#[test]
fn an_unknown_strategy_lists_the_valid_ones() {
    let e = Trainer::builder()
        .strategy("zero9")
        .build()
        .err()
        .unwrap()
        .to_string();
    assert!(
        e.contains("unknown strategy 'zero9'") && e.contains("single, ddp"),
        "{e}"
    );
}

#[test]
fn single_on_several_devices_is_an_error() {
    let e = Trainer::builder()
        .devices(2)
        .strategy("single")
        .build()
        .err()
        .unwrap()
        .to_string();
    assert!(e.contains("exactly 1 device"), "{e}");
}

#[derive(Clone)]
struct Empty;

impl TrainModule for Empty {
    type Batch = (Tensor, Tensor);
    fn configure_sharded_model(&mut self, _: &ShardedContext) -> candle_core::Result<()> {
        Ok(())
    }
    fn training_step(&mut self, batch: &Self::Batch, _: usize) -> candle_core::Result<Tensor> {
        batch.1.mean_all()
    }
}

#[test]
fn a_module_without_parameters_is_refused_at_fit() {
    let e = quiet_trainer(2, "ddp", 1)
        .fit(&mut Attached::new(Empty), &loader(), None)
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("created no parameters in configure_sharded_model"),
        "{e}"
    );
}

#[test]
fn a_non_scalar_loss_names_the_hook() {
    #[derive(Clone)]
    struct Vector(Mlp);
    impl TrainModule for Vector {
        type Batch = (Tensor, Tensor);
        fn configure_sharded_model(&mut self, ctx: &ShardedContext) -> candle_core::Result<()> {
            self.0.configure_sharded_model(ctx)
        }
        fn training_step(&mut self, batch: &Self::Batch, _: usize) -> candle_core::Result<Tensor> {
            self.0.forward(&batch.0)
        }
    }
    let e = quiet_trainer(1, "single", 1)
        .fit(
            &mut Attached::new(Vector(Mlp::new(OptimizerConfig::sgd(0.1)))),
            &loader(),
            None,
        )
        .unwrap_err()
        .to_string();
    assert!(e.contains("training_step") && e.contains("scalar"), "{e}");
}

/// A module that cannot be cloned trains on one rank; as two rank threads it gets an error
/// saying why and what to do, before anything runs.
#[test]
fn a_module_without_replicas_trains_alone_and_is_refused_as_threads() {
    use crate::common::{adamw, SoloMlp};
    let mut one = quiet_trainer(1, "single", 3);
    let metrics = one
        .fit(&mut Attached::new(SoloMlp::new(adamw())), &loader(), None)
        .unwrap();
    assert!(metrics["train_loss"].is_finite());
    let mut model = Attached::new(SoloMlp::new(adamw()));
    let e = quiet_trainer(2, "ddp", 3)
        .fit(&mut model, &loader(), None)
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("ranks as threads need one module per rank") && e.contains("derive Clone"),
        "{e}"
    );
    assert!(!model.mlp.is_built(), "nothing ran before the error");
}
