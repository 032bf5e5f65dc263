use crate::common::{adamw, full_parameters, max_diff, Mlp, Recording, Regression};
use candle_core::{DType, Device, Module, Tensor};
use wick::accelerator::ThreadWorld;
use wick::core::{Collective, GradSync, StepOptions};
use wick::trainer::{Attached, DataLoader, Trainer};
use wick_core::CollectiveExt;

/// Trains the MLP with the given options and returns its full parameters.
fn run(
    devices: usize,
    strategy: &str,
    batch: usize,
    accumulate: usize,
    clip: Option<f64>,
    steps: usize,
) -> Vec<Vec<f32>> {
    let mut builder = Trainer::builder()
        .devices(devices)
        .strategy(strategy)
        .max_steps(steps)
        .seed(5)
        .accumulate_grad_batches(accumulate)
        .no_logger()
        .progress(false)
        .model_summary(false);
    if let Some(c) = clip {
        builder = builder.gradient_clip_val(c);
    }
    let mut trainer = builder.build().unwrap();
    let mut model = Attached::new(Mlp::new(adamw()));
    trainer
        .fit(
            &mut model,
            &DataLoader::new(Regression::new(96), batch),
            None,
        )
        .unwrap();
    full_parameters(&mut trainer, &mut model)
}

const STRATEGIES: [&str; 4] = ["ddp", "zero1", "zero2", "zero3"];

#[test]
fn clipping_by_global_norm_equals_single_device_clipping() {
    let clipped = run(1, "single", 12, 1, Some(0.05), 6);
    // The bound is tight enough to act: clipping changes the result.
    assert!(max_diff(&clipped, &run(1, "single", 12, 1, None, 6)) > 1e-4);
    for strategy in STRATEGIES {
        for w in [2, 4] {
            let diff = max_diff(&clipped, &run(w, strategy, 12, 1, Some(0.05), 6));
            assert!(diff <= 1e-5, "{strategy} w={w}: max |diff| {diff}");
        }
    }
}

#[test]
fn four_micro_batches_equal_one_batch_four_times_larger() {
    let large = run(1, "single", 48, 1, None, 4);
    assert!(max_diff(&large, &run(1, "single", 12, 4, None, 4)) <= 1e-5);
    for strategy in STRATEGIES {
        let diff = max_diff(&large, &run(2, strategy, 12, 4, None, 4));
        assert!(diff <= 1e-5, "{strategy}: max |diff| {diff}");
    }
}

/// Two wrapped 3x3 linear layers under `s` on `world`, and the rank's strategy holding
/// them with AdamW and `options`.
fn two_layers(
    s: &dyn wick::core::Strategy,
    world: std::sync::Arc<dyn Collective>,
    options: StepOptions,
) -> wick::core::Result<TwoLayers> {
    let open = s.open(world, Device::Cpu, 1)?;
    let ctx = open.context();
    let layers = {
        let _open = ctx.enter();
        (0..2)
            .map(|i| ctx.wrap(&format!("l{i}"), |vb| candle_nn::linear(3, 3, vb)))
            .collect::<candle_core::Result<Vec<_>>>()?
    };
    let mut s = open.close()?;
    s.configure_optimizer(&adamw(), options);
    Ok((layers, s))
}

/// Wrapped layers and the rank's strategy that holds them.
type TwoLayers = (
    Vec<wick::core::Wrapped<candle_nn::Linear>>,
    Box<dyn wick::core::RankStrategy>,
);

/// The report of one step of two linear layers under `strategy` at `w` ranks, each rank's
/// batch its own rows of one global batch of 12, clipping to `clip`.
fn step_report(w: usize, strategy: &str, clip: Option<f64>) -> Vec<wick::core::StepReport> {
    let reports = ThreadWorld::new(w).run(|comm| {
        let rank = comm.rank();
        let s = wick::strategies::strategy_by_name(strategy)?;
        let options = StepOptions {
            clip_grad_norm: clip,
            ..StepOptions::default()
        };
        let (layers, mut s) = two_layers(s.as_ref(), std::sync::Arc::new(comm), options)?;
        let rows = Tensor::arange(0f32, 36., &Device::Cpu)?.reshape((12, 3))?;
        let mut h = rows.narrow(0, rank * 12 / w, 12 / w)?;
        for l in &layers {
            h = l.get()?.forward(&h)?;
        }
        s.backward(&h.sqr()?.mean_all()?, GradSync::Reduce)?;
        s.optimizer_step(adamw().lr())
    });
    reports.into_iter().map(|r| r.unwrap()).collect()
}

#[test]
fn each_step_reports_the_gradient_norm_before_clipping_as_one_device_sees_it() {
    let single = step_report(1, "single", Some(1e9))[0];
    let norm = single.grad_norm.expect("every step computes the norm");
    assert!(norm > 1.0 && !single.skipped, "{single:?}");
    // Without clipping too: the same norm.
    assert_eq!(step_report(1, "single", None)[0].grad_norm, Some(norm));
    for strategy in ["ddp", "zero1", "zero2", "zero3", "fsdp"] {
        for (w, clip) in [(2, Some(1e9)), (3, None), (4, Some(1e9))] {
            for (rank, report) in step_report(w, strategy, clip).iter().enumerate() {
                let got = report.grad_norm.unwrap();
                assert!(
                    (got - norm).abs() <= 1e-5 * norm,
                    "{strategy} W={w} rank {rank}: {got} against {norm}"
                );
            }
        }
    }
}

#[test]
fn an_optimizer_step_before_configure_optimizer_is_a_step_order_error_on_every_rank() {
    // The rank's strategy exists from `finish` on; its optimizer only once a fit (or a
    // hand-written loop) configures one. Stepping before that is the caller's mistake,
    // said on every rank before any collective, whatever the strategy.
    for strategy in ["single", "ddp", "zero1", "zero2", "zero3", "fsdp"] {
        let w = if strategy == "single" { 1 } else { 2 };
        let errors = ThreadWorld::new(w).run(|comm| {
            let s = wick::strategies::strategy_by_name(strategy)?;
            let open = s.open(std::sync::Arc::new(comm), Device::Cpu, 1)?;
            let layer = {
                let ctx = open.context();
                let _inside = ctx.enter();
                ctx.wrap("l", |vb| candle_nn::linear(3, 3, vb))?
            };
            let mut rank = open.close()?;
            let x = Tensor::ones((2, 3), DType::F32, &Device::Cpu)?;
            let y = layer.apply(&x, |l, x| l.forward(x))?;
            rank.backward(&y.sqr()?.mean_all()?, GradSync::Reduce)?;
            Ok::<_, wick::core::Error>(rank.optimizer_step(0.1).map(drop))
        });
        for e in errors {
            let e = e
                .unwrap()
                .expect_err("a step without an optimizer must fail");
            assert!(
                matches!(&e, wick::core::Error::StepOrder { message, .. }
                    if message.contains("configure_optimizer")),
                "{strategy}: {e}"
            );
        }
    }
}

#[test]
fn no_gradient_collective_runs_before_the_last_micro_batch() {
    for strategy in STRATEGIES {
        let logs = ThreadWorld::new(2).run(|comm| {
            let world = Recording::over(comm);
            let s = wick::strategies::strategy_by_name(strategy)?;
            let (layers, mut s) = two_layers(s.as_ref(), world.clone(), StepOptions::default())?;
            let x = Tensor::ones((2, 3), DType::F32, &Device::Cpu)?;
            let mut marks = Vec::new();
            for micro in 0..4 {
                let mut h = x.clone();
                for l in &layers {
                    h = l.get()?.forward(&h)?;
                }
                s.backward(&h.sqr()?.mean_all()?, GradSync::for_micro_batch(micro, 4))?;
                marks.push(world.log.lock().unwrap().len());
            }
            s.optimizer_step(adamw().lr())?;
            let log = world.log.lock().unwrap().clone();
            Ok::<_, wick::core::Error>((log, marks))
        });
        let (log, marks) = logs.into_iter().next().unwrap().unwrap();
        let reducing = |e: &String| e.starts_with("reduce_scatter") || e.starts_with("all_reduce");
        assert!(
            !log[..marks[2]].iter().any(reducing),
            "{strategy}: a gradient collective before the last micro-batch: {log:?}"
        );
        assert!(
            log.iter().any(reducing),
            "{strategy}: the step reduced nothing: {log:?}"
        );
    }
}

#[test]
fn the_metrics_csv_logs_lr_throughput_and_epoch_time() {
    let dir = tempfile::TempDir::new().unwrap();
    let mut trainer =
        crate::common::quiet_builder(2, wick::strategies::strategy_by_name("ddp").unwrap(), 10)
            .log_dir(dir.path())
            .run_name("run")
            .build()
            .unwrap();
    let mut model = Attached::new(crate::common::Mlp::new(wick::core::OptimizerConfig::adamw(
        0.02,
    )));
    trainer
        .fit(&mut model, &crate::common::loader(), None)
        .unwrap();
    let text = std::fs::read_to_string(trainer.metrics_path().unwrap()).unwrap();
    let mut lines = text.lines();
    assert_eq!(
        lines.next(),
        Some(
            "step,epoch,train_loss,val_loss,lr,skipped_steps,tokens_per_s,epoch_time_s,comm_wait_s,\
             grad_norm,peak_memory_gib,mfu"
        )
    );
    let rows: Vec<Vec<String>> = lines
        .map(|l| l.split(',').map(String::from).collect())
        .collect();
    assert_eq!(rows.len(), 10);
    let mut last_epoch_time = (usize::MAX, 0.0);
    let mut waited = 0.0;
    for r in &rows {
        assert_eq!(r[4].parse::<f64>().unwrap(), 0.02, "lr in {r:?}");
        assert_eq!(r[5], "0", "skipped_steps in {r:?}");
        assert!(r[6].parse::<f64>().unwrap() > 0.0, "tokens_per_s in {r:?}");
        assert!(r[9].parse::<f64>().unwrap() > 0.0, "grad_norm in {r:?}");
        let wait = r[8].parse::<f64>().unwrap();
        // Within an epoch the epoch time only grows; it restarts with the next epoch.
        let (epoch, t) = (r[1].parse::<usize>().unwrap(), r[7].parse::<f64>().unwrap());
        // The step's exposed communication is part of the time its epoch has taken (the
        // CSV rounds the epoch time to the millisecond, the wait to the microsecond).
        assert!(
            (0.0..=t + 0.0005).contains(&wait),
            "comm_wait_s {wait} outside [0, epoch_time_s {t}] in {r:?}"
        );
        waited += wait;
        if epoch == last_epoch_time.0 {
            assert!(t >= last_epoch_time.1, "epoch_time_s went back in {r:?}");
        }
        last_epoch_time = (epoch, t);
    }
    // ddp waits for every step's all-reduce: some of it is always measured.
    assert!(waited > 0.0, "no comm_wait_s in ten ddp steps: {rows:?}");
}
