use crate::common::{
    adamw, full_parameters, loader, max_diff, quiet_builder, quiet_trainer_with, train, Mlp,
    Recording,
};
use candle_core::{CpuStorage, CustomOp1, DType, Device, Layout, Shape, Tensor};
use std::sync::{Arc, Mutex};
use wick::accelerator::ThreadWorld;
use wick::core::{GradSync, StepOptions, Strategy};
use wick::strategies::{Ddp, Fsdp, FsdpSharding, Zero, Zero3};
use wick::trainer::Attached;

/// An identity whose backward writes `backward:<layer>` into a log: where backward is when
/// the collectives around it were issued.
struct Mark {
    layer: usize,
    log: Arc<Mutex<Vec<String>>>,
}

impl CustomOp1 for Mark {
    fn name(&self) -> &'static str {
        "mark"
    }
    fn cpu_fwd(&self, s: &CpuStorage, l: &Layout) -> candle_core::Result<(CpuStorage, Shape)> {
        let (start, end) = l.contiguous_offsets().expect("contiguous");
        let v = s.as_slice::<f32>()?[start..end].to_vec();
        Ok((CpuStorage::F32(v), l.shape().clone()))
    }
    fn bwd(&self, _: &Tensor, _: &Tensor, grad: &Tensor) -> candle_core::Result<Option<Tensor>> {
        self.log
            .lock()
            .unwrap()
            .push(format!("backward:{}", self.layer));
        Ok(Some(grad.clone()))
    }
}

/// Each rank's log of two steps of a 3-unit model under `make()` at `w` ranks: collectives
/// issued, waited, and where backward was between them.
fn logs(w: usize, make: &(dyn Fn() -> Box<dyn Strategy> + Sync)) -> Vec<Vec<String>> {
    let logs = ThreadWorld::new(w).run(|comm| {
        let world = Recording::over(comm);
        let open = make().open(world.clone(), Device::Cpu, 1)?;
        let ctx = open.context();
        let units = {
            let _open = ctx.enter();
            (0..3)
                .map(|i| ctx.wrap(&format!("l{i}"), |vb| candle_nn::linear(6, 6, vb)))
                .collect::<candle_core::Result<Vec<_>>>()?
        };
        let mut s = open.close()?;
        s.configure_optimizer(&adamw(), StepOptions::default());
        for _ in 0..2 {
            let mut h = Tensor::ones((2, 6), DType::F32, &Device::Cpu)?;
            for (i, u) in units.iter().enumerate() {
                h = u.apply(&h, candle_nn::Module::forward)?;
                let log = world.log.clone();
                h = h.apply_op1(Mark { layer: i, log })?;
            }
            world.log.lock().unwrap().push("backward".into());
            s.backward(&h.sqr()?.mean_all()?, GradSync::Reduce)?;
            world.log.lock().unwrap().push("step".into());
            s.optimizer_step(adamw().lr())?;
        }
        let log = world.log.lock().unwrap().clone();
        Ok::<_, wick::core::Error>(log)
    });
    logs.into_iter().map(|l| l.unwrap()).collect()
}

/// Builds one rank's strategy.
type MakeStrategy = Box<dyn Fn() -> Box<dyn Strategy> + Sync>;

/// The strategies whose gradient collectives are issued during backward, each with its
/// gradient collective: buckets of one parameter under ddp, zero1 and zero2, so every
/// layer's bucket is its own.
fn overlapped() -> Vec<(&'static str, &'static str, MakeStrategy)> {
    vec![
        (
            "ddp",
            "all_reduce_start",
            Box::new(|| Box::new(Ddp::new().with_bucket_cap_bytes(1))),
        ),
        (
            "zero1",
            "all_reduce_start",
            Box::new(|| Box::new(Zero::stage1().with_bucket_cap_bytes(1))),
        ),
        (
            "zero2",
            "reduce_scatter_parts_start",
            Box::new(|| Box::new(Zero::stage2().with_bucket_cap_bytes(1))),
        ),
        (
            "zero3",
            "reduce_scatter_start",
            Box::new(|| Box::new(Zero3::new())),
        ),
        (
            "fsdp full_shard",
            "reduce_scatter_start",
            Box::new(|| Fsdp::new(FsdpSharding::FullShard).build()),
        ),
        (
            "fsdp full_shard, prefetch",
            "reduce_scatter_start",
            Box::new(|| {
                Fsdp::new(FsdpSharding::FullShard)
                    .with_prefetch(true)
                    .build()
            }),
        ),
        (
            "fsdp shard_grad_op",
            "reduce_scatter_start",
            Box::new(|| Fsdp::new(FsdpSharding::ShardGradOp).build()),
        ),
    ]
}

#[test]
fn gradient_collectives_are_issued_during_backward_and_waited_for_in_order_before_the_step() {
    for w in [2, 4] {
        for (name, call, make) in overlapped() {
            let logs = logs(w, make.as_ref());
            for (r, log) in logs.iter().enumerate() {
                assert_eq!(log, &logs[0], "{name} W={w}: rank {r} issued another order");
            }
            let log = &logs[0];
            // The first step, from its backward to the next one's.
            let start = log.iter().position(|e| e == "backward").unwrap();
            let len = log[start + 1..]
                .iter()
                .position(|e| e == "backward")
                .unwrap();
            let step = &log[start..=start + len];
            let issued: Vec<&String> = step.iter().filter(|e| e.starts_with(call)).collect();
            let waited: Vec<String> = step
                .iter()
                .filter_map(|e| e.strip_prefix("wait:").map(str::to_string))
                .filter(|e| e.starts_with(call))
                .collect();
            assert!(
                issued.len() >= 3,
                "{name} W={w}: one per layer at least: {step:?}"
            );
            // Every call issued is waited for, in the order issued, before the step.
            assert_eq!(
                issued.iter().map(|e| e.as_str()).collect::<Vec<_>>(),
                waited.iter().map(String::as_str).collect::<Vec<_>>(),
                "{name} W={w}: {step:?}"
            );
            // The last layer's gradient was issued while backward had the first layer
            // still to run.
            let positions = |prefix: &str| -> Vec<usize> {
                (0..step.len())
                    .filter(|&i| step[i].starts_with(prefix))
                    .collect()
            };
            let issues = positions(call);
            let waits = positions(&format!("wait:{call}"));
            let first_layer = step.iter().position(|e| e == "backward:0").unwrap();
            assert!(
                issues[0] < first_layer,
                "{name} W={w}: issued after backward: {step:?}"
            );
            if call == "reduce_scatter_start" {
                // At most one unit's reduction in flight, as FSDP2 keeps it: each is waited
                // for once the next unit's is issued (so it overlapped that unit's
                // backward), never before, and the last once backward is done.
                for (k, wait) in waits[..waits.len() - 1].iter().enumerate() {
                    assert!(
                        issues[k + 1] < *wait && *wait < issues.get(k + 2).map_or(usize::MAX, |&i| i),
                        "{name} W={w}: call {k} not waited for right after the next issue: {step:?}"
                    );
                }
                assert!(
                    first_layer < *waits.last().unwrap(),
                    "{name} W={w}: the last reduction waited for inside backward: {step:?}"
                );
            } else {
                // Buckets are waited for only once backward is done.
                assert!(
                    first_layer < waits[0],
                    "{name} W={w}: waited inside backward: {step:?}"
                );
            }
        }
    }
}

#[test]
fn reduction_during_backward_trains_to_the_same_bits_whatever_the_buckets() {
    // One bucket per parameter (each issued as soon as backward completes it) against the
    // default (one bucket for everything, issued when backward is done).
    let fit = |w: usize, strategy: Box<dyn Strategy>| {
        let mut model = Attached::new(Mlp::new(adamw()));
        let mut trainer = quiet_trainer_with(w, strategy, 4);
        trainer.fit(&mut model, &loader(), None).unwrap();
        full_parameters(&mut trainer, &mut model)
    };
    for w in [2, 3] {
        // Every call completing where it is issued (`--no-overlap-comm`): the same bits.
        let mut model = Attached::new(Mlp::new(adamw()));
        let fsdp = wick::strategies::strategy_by_name("fsdp").unwrap();
        let mut blocking = quiet_builder(w, fsdp, 4)
            .overlap_comm(false)
            .build()
            .unwrap();
        blocking.fit(&mut model, &loader(), None).unwrap();
        let blocking = full_parameters(&mut blocking, &mut model);
        assert_eq!(
            max_diff(&train(w, "fsdp", adamw(), 4), &blocking),
            0.0,
            "fsdp W={w}"
        );
        let one = fit(w, Box::new(Ddp::new().with_bucket_cap_bytes(1)));
        assert_eq!(
            max_diff(&train(w, "ddp", adamw(), 4), &one),
            0.0,
            "ddp W={w}"
        );
        let one = fit(w, Box::new(Zero::stage1().with_bucket_cap_bytes(1)));
        assert_eq!(
            max_diff(&train(w, "zero1", adamw(), 4), &one),
            0.0,
            "zero1 W={w}"
        );
        // zero2's buckets of one parameter fall across the ranks' ranges unevenly.
        let one = fit(w, Box::new(Zero::stage2().with_bucket_cap_bytes(1)));
        assert_eq!(
            max_diff(&train(w, "zero2", adamw(), 4), &one),
            0.0,
            "zero2 W={w}"
        );
    }
}
