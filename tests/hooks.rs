use crate::common::{loader, Mlp, Regression};
use candle_core::Tensor;
use std::sync::{Arc, Mutex};
use wick::core::CollectiveExt;
use wick::core::{
    sharding_context_active, Callback, OptimizerConfig, ReduceOp, RunState, ShardedContext, Stage,
    TrainModule,
};
use wick::trainer::{Attached, DataLoader, Trainer};

type Log = Arc<Mutex<Vec<(usize, String)>>>;

fn push(log: &Log, rank: usize, event: impl Into<String>) {
    log.lock().unwrap().push((rank, event.into()));
}

/// Records every callback hook with its rank.
#[derive(Clone)]
struct Recorder(Log);

impl Callback for Recorder {
    fn setup(&mut self, s: &RunState, stage: Stage) -> candle_core::Result<()> {
        push(&self.0, s.rank, format!("cb.setup({stage})"));
        Ok(())
    }
    fn on_configure_sharded_model(&mut self, s: &RunState) -> candle_core::Result<()> {
        let active = sharding_context_active();
        push(
            &self.0,
            s.rank,
            format!("cb.on_configure_sharded_model(active={active})"),
        );
        Ok(())
    }
    fn on_fit_start(&mut self, s: &RunState) -> candle_core::Result<()> {
        push(&self.0, s.rank, "cb.on_fit_start");
        Ok(())
    }
    fn on_train_batch_end(&mut self, s: &RunState) -> candle_core::Result<()> {
        push(
            &self.0,
            s.rank,
            format!("cb.on_train_batch_end({})", s.global_step),
        );
        Ok(())
    }
    fn on_validation_start(&mut self, s: &RunState) -> candle_core::Result<()> {
        push(&self.0, s.rank, "cb.on_validation_start");
        Ok(())
    }
    fn on_validation_end(&mut self, s: &RunState) -> candle_core::Result<()> {
        push(&self.0, s.rank, "cb.on_validation_end");
        Ok(())
    }
    fn on_test_end(&mut self, s: &RunState) -> candle_core::Result<()> {
        push(&self.0, s.rank, "cb.on_test_end");
        Ok(())
    }
    fn on_predict_end(&mut self, s: &RunState) -> candle_core::Result<()> {
        push(&self.0, s.rank, "cb.on_predict_end");
        Ok(())
    }
    fn on_fit_end(&mut self, s: &RunState) -> candle_core::Result<()> {
        push(&self.0, s.rank, "cb.on_fit_end");
        Ok(())
    }
    fn teardown(&mut self, s: &RunState, stage: Stage) -> candle_core::Result<()> {
        push(&self.0, s.rank, format!("cb.teardown({stage})"));
        Ok(())
    }
}

/// The MLP, recording its hooks and what it saw inside configure_sharded_model.
#[derive(Clone)]
struct Recorded {
    inner: Mlp,
    log: Log,
    rank: usize,
    ctx: Option<ShardedContext>,
}

impl Recorded {
    fn new(log: Log) -> Self {
        Recorded {
            inner: Mlp::new(OptimizerConfig::sgd(0.05)),
            log,
            rank: usize::MAX,
            ctx: None,
        }
    }
    fn rec(&self, event: impl Into<String>) {
        push(&self.log, self.rank, event);
    }
}

impl TrainModule for Recorded {
    type Batch = (Tensor, Tensor);

    fn setup(&mut self, stage: Stage) -> candle_core::Result<()> {
        // Rank is not known before the world is up; record under the sentinel, fixed below.
        self.rec(format!("m.setup({stage})"));
        Ok(())
    }

    fn configure_sharded_model(&mut self, ctx: &ShardedContext) -> candle_core::Result<()> {
        self.rank = ctx.rank();
        // The world is up: a collective across ranks works inside the hook.
        let sum = ctx
            .world()
            .all_reduce_scalar(ctx.rank() as f32 + 1.0, ReduceOp::Sum)
            .map_err(candle_core::Error::wrap)?;
        self.rec(format!(
            "m.configure_sharded_model(rank={}, world={}, sum={sum}, active={}, open={})",
            ctx.rank(),
            ctx.world_size(),
            sharding_context_active(),
            ctx.is_open()
        ));
        self.ctx = Some(ctx.clone());
        self.inner.configure_sharded_model(ctx)
    }

    fn configure_optimizers(&self) -> OptimizerConfig {
        self.rec("m.configure_optimizers");
        self.inner.configure_optimizers()
    }

    fn on_fit_start(&mut self) -> candle_core::Result<()> {
        self.rec("m.on_fit_start");
        // After the hook, the context is closed: no parameter can be created.
        let late = self.ctx.as_ref().unwrap().var_builder().get(3, "late");
        let msg = late.err().map(|e| e.to_string()).unwrap_or_default();
        self.rec(format!(
            "late parameter refused: {}",
            msg.contains("outside configure_sharded_model")
        ));
        Ok(())
    }

    fn training_step(&mut self, batch: &Self::Batch, _: usize) -> candle_core::Result<Tensor> {
        self.rec("m.training_step");
        self.inner.loss(batch)
    }

    fn validation_step(
        &mut self,
        batch: &Self::Batch,
        i: usize,
    ) -> candle_core::Result<Option<Tensor>> {
        self.rec("m.validation_step");
        self.inner.validation_step(batch, i)
    }

    fn test_step(&mut self, batch: &Self::Batch, i: usize) -> candle_core::Result<Option<Tensor>> {
        self.rec("m.test_step");
        self.inner.test_step(batch, i)
    }

    fn predict_step(&mut self, batch: &Self::Batch, i: usize) -> candle_core::Result<Tensor> {
        self.rec("m.predict_step");
        self.inner.predict_step(batch, i)
    }

    fn on_fit_end(&mut self) -> candle_core::Result<()> {
        self.rec("m.on_fit_end");
        Ok(())
    }

    fn teardown(&mut self, stage: Stage) -> candle_core::Result<()> {
        self.rec(format!("m.teardown({stage})"));
        Ok(())
    }
}

fn trainer(log: &Log, devices: usize) -> Trainer {
    Trainer::builder()
        .devices(devices)
        .strategy("ddp")
        .max_steps(2)
        .val_check_interval(2)
        .seed(1)
        .no_logger()
        .progress(false)
        .callback(Recorder(log.clone()))
        .build()
        .unwrap()
}

/// Events of rank `rank` (the module's setup before the hook is recorded as rank usize::MAX
/// on every rank, so those lines are attributed by order instead).
fn events(log: &Log, rank: usize) -> Vec<String> {
    log.lock()
        .unwrap()
        .iter()
        .filter(|(r, _)| *r == rank || *r == usize::MAX)
        .map(|(_, e)| e.clone())
        .collect()
}

fn small_eval() -> DataLoader<Regression> {
    DataLoader::new(Regression::new(24), 12).without_shuffle()
}

fn strings(v: &[&str]) -> Vec<String> {
    v.iter().map(|s| s.to_string()).collect()
}

#[test]
fn fit_runs_the_hooks_in_order_and_the_hook_sees_the_world() {
    let log: Log = Arc::default();
    let mut module = Attached::new(Recorded::new(log.clone()));
    let val = small_eval();
    // One rank: the setup line before the hook belongs to rank 0 unambiguously.
    trainer(&log, 1)
        .fit(&mut module, &loader(), Some(&val))
        .unwrap();
    let want = strings(&[
        "cb.setup(fit)",
        "m.setup(fit)",
        "m.configure_sharded_model(rank=0, world=1, sum=1, active=true, open=true)",
        "cb.on_configure_sharded_model(active=false)",
        "m.configure_optimizers",
        "cb.on_fit_start",
        "m.on_fit_start",
        "late parameter refused: true",
        "m.training_step",
        "cb.on_train_batch_end(1)",
        "m.training_step",
        "cb.on_train_batch_end(2)",
        "cb.on_validation_start",
        "m.validation_step",
        "m.validation_step",
        "cb.on_validation_end",
        "cb.on_fit_end",
        "m.on_fit_end",
        "cb.teardown(fit)",
        "m.teardown(fit)",
    ]);
    assert_eq!(events(&log, 0), want);
}

#[test]
fn inside_the_hook_every_rank_sees_the_world_up_and_the_context_open() {
    let log: Log = Arc::default();
    let mut module = Attached::new(Recorded::new(log.clone()));
    trainer(&log, 3).fit(&mut module, &loader(), None).unwrap();
    for rank in 0..3 {
        let e = events(&log, rank);
        let hook = e
            .iter()
            .position(|e| e.starts_with("m.configure_sharded_model"))
            .unwrap();
        // sum over ranks of (rank + 1) = 6: the all-reduce crossed all three ranks.
        assert_eq!(
            e[hook],
            format!(
                "m.configure_sharded_model(rank={rank}, world=3, sum=6, active=true, open=true)"
            )
        );
        assert_eq!(
            e[hook + 1],
            "cb.on_configure_sharded_model(active=false)",
            "rank {rank}: {e:?}"
        );
    }
}

#[test]
fn validate_test_and_predict_each_run_their_own_order() {
    let log: Log = Arc::default();
    let mut module = Attached::new(Recorded::new(log.clone()));
    let data = small_eval();
    let mut t = trainer(&log, 1);

    t.validate(&mut module, &data).unwrap();
    let want = strings(&[
        "cb.setup(validate)",
        "m.setup(validate)",
        "m.configure_sharded_model(rank=0, world=1, sum=1, active=true, open=true)",
        "cb.on_configure_sharded_model(active=false)",
        "cb.on_validation_start",
        "m.validation_step",
        "m.validation_step",
        "cb.on_validation_end",
        "cb.teardown(validate)",
        "m.teardown(validate)",
    ]);
    assert_eq!(events(&log, 0), want);

    log.lock().unwrap().clear();
    t.test(&mut module, &data).unwrap();
    let want = strings(&[
        "cb.setup(test)",
        "m.setup(test)",
        "m.test_step",
        "m.test_step",
        "cb.on_test_end",
        "cb.teardown(test)",
        "m.teardown(test)",
    ]);
    assert_eq!(
        events(&log, 0),
        want,
        "test reuses the configured module: no second hook"
    );

    log.lock().unwrap().clear();
    let predictions = t.predict(&mut module, &data).unwrap();
    let want = strings(&[
        "cb.setup(predict)",
        "m.setup(predict)",
        "m.predict_step",
        "m.predict_step",
        "cb.on_predict_end",
        "cb.teardown(predict)",
        "m.teardown(predict)",
    ]);
    assert_eq!(events(&log, 0), want);
    assert_eq!(predictions.len(), 2);
    assert_eq!(predictions[0].dims(), &[12]);
}

#[test]
fn fit_then_validate_then_test_reuses_the_trained_parameters() {
    let log: Log = Arc::default();
    let data = small_eval();
    let untrained = {
        let mut fresh = Attached::new(Recorded::new(log.clone()));
        trainer(&log, 2).test(&mut fresh, &data).unwrap()["test_loss"]
    };
    log.lock().unwrap().clear();

    let mut module = Attached::new(Recorded::new(log.clone()));
    let mut t = Trainer::builder()
        .devices(2)
        .strategy("ddp")
        .max_steps(20)
        .seed(1)
        .no_logger()
        .progress(false)
        .build()
        .unwrap();
    t.fit(&mut module, &loader(), None).unwrap();
    let val = t.validate(&mut module, &data).unwrap()["val_loss"];
    let test = t.test(&mut module, &data).unwrap()["test_loss"];

    let hooks = log
        .lock()
        .unwrap()
        .iter()
        .filter(|(_, e)| e.starts_with("m.configure_sharded_model"))
        .count();
    assert_eq!(
        hooks, 2,
        "configure_sharded_model runs once per rank, not once per stage"
    );
    assert_eq!(
        val, test,
        "validate and test see the same parameters on the same data"
    );
    assert!(
        test < untrained * 0.9,
        "trained {test} vs untrained {untrained}"
    );
}

#[test]
fn predictions_join_the_ranks_slices_in_batch_order() {
    let data = small_eval();
    let predict = |devices| {
        let mut m = Attached::new(Mlp::new(OptimizerConfig::sgd(0.1)));
        crate::common::quiet_trainer(devices, "ddp", 1)
            .predict(&mut m, &data)
            .unwrap()
    };
    let one: Vec<Vec<f32>> = predict(1).iter().map(|t| t.to_vec1().unwrap()).collect();
    let three: Vec<Vec<f32>> = predict(3).iter().map(|t| t.to_vec1().unwrap()).collect();
    assert_eq!(one, three);
}
