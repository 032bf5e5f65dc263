//! CUDA: every strategy on the GPU against the same run on the CPU, and NCCL worlds.
//!
//! Built with `--features cuda` (`cuda,nccl` for the NCCL tests); every test needs a GPU,
//! so each is ignored with that reason and `scripts/gpu-check.sh` runs them with
//! `--ignored`. They print the differences they check.

#[allow(dead_code)] // the fixtures other test binaries use too
mod common;

use common::{adamw, full_parameters, loader, max_diff, quiet_builder, Mlp};
use wick::accelerator::{cuda_device_count, Accelerator};
use wick::core::Strategy;
use wick::strategies::{strategy_by_name, Fsdp, FsdpSharding, Precision};
use wick::trainer::Attached;

const STEPS: usize = 6;
/// f32 on the GPU against f32 on the CPU: different kernels and summation orders.
const F32_TOLERANCE: f32 = 1e-4;
/// bf16-mixed on the GPU against bf16-mixed on the CPU: the mixed-precision tests' bound
/// for bf16 against f32 (tests/fsdp.rs).
const BF16_TOLERANCE: f32 = 1e-2;

/// The strategies that run at `world` ranks, by name, freshly made.
fn strategies(world: usize) -> Vec<(String, Box<dyn Strategy>)> {
    let mut all: Vec<(String, Box<dyn Strategy>)> = Vec::new();
    let names: &[&str] = match world {
        1 => &["single", "ddp", "zero1", "zero2", "zero3"],
        _ => &["ddp", "zero1", "zero2", "zero3"],
    };
    for name in names {
        all.push((name.to_string(), strategy_by_name(name).unwrap()));
    }
    let mut shardings = vec![
        FsdpSharding::FullShard,
        FsdpSharding::ShardGradOp,
        FsdpSharding::NoShard,
    ];
    if world == 4 {
        shardings.push(FsdpSharding::HybridShard);
    }
    for sharding in shardings {
        all.push((format!("fsdp {sharding:?}"), Fsdp::new(sharding).build()));
        if sharding == FsdpSharding::FullShard {
            let prefetch = Fsdp::new(sharding).with_prefetch(true);
            all.push(("fsdp FullShard prefetch".into(), prefetch.build()));
        }
    }
    all
}

/// Trains the test MLP with `strategy` on `accelerator`'s ranks; its parameters in full.
fn train_on(accelerator: Accelerator, strategy: Box<dyn Strategy>) -> Vec<Vec<f32>> {
    let world = accelerator.world_size();
    let mut trainer = quiet_builder(world, strategy, STEPS)
        .accelerator(accelerator)
        .build()
        .unwrap();
    let mut model = Attached::new(Mlp::new(adamw()));
    trainer.fit(&mut model, &loader(), None).unwrap();
    full_parameters(&mut trainer, &mut model)
}

/// Each strategy at `world` ranks on the GPU(s) `cuda` gives, against the CPU.
fn strategies_match_cpu(world: usize, cuda: impl Fn() -> Accelerator) {
    let cpu = strategies(world);
    for ((name, on_cpu), (_, on_gpu)) in cpu.into_iter().zip(strategies(world)) {
        let reference = train_on(Accelerator::cpu(world).unwrap(), on_cpu);
        let diff = max_diff(&reference, &train_on(cuda(), on_gpu));
        println!("cuda world={world} {name}: max |diff| vs cpu = {diff:e}");
        assert!(
            diff <= F32_TOLERANCE,
            "{name} at {world}: {diff} > {F32_TOLERANCE}"
        );
    }
}

#[test]
#[ignore = "needs a CUDA GPU: scripts/gpu-check.sh runs it"]
fn every_strategy_on_one_gpu_matches_the_cpu() {
    strategies_match_cpu(1, || Accelerator::cuda(1).unwrap());
}

#[test]
#[ignore = "needs a CUDA GPU: scripts/gpu-check.sh runs it"]
fn every_strategy_at_two_and_four_ranks_on_one_gpu_matches_the_cpu() {
    for world in [2, 4] {
        strategies_match_cpu(world, || Accelerator::cuda_one_gpu(world).unwrap());
    }
}

#[test]
#[ignore = "needs a CUDA GPU: scripts/gpu-check.sh runs it"]
fn bf16_mixed_on_the_gpu_matches_the_cpu() {
    for world in [1, 2] {
        for sharding in [FsdpSharding::FullShard, FsdpSharding::ShardGradOp] {
            let fsdp = || {
                let bf16 = Precision::Bf16Mixed;
                Fsdp::new(sharding).with_precision(bf16).unwrap().build()
            };
            let reference = train_on(Accelerator::cpu(world).unwrap(), fsdp());
            let diff = max_diff(
                &reference,
                &train_on(Accelerator::cuda_one_gpu(world).unwrap(), fsdp()),
            );
            println!("cuda world={world} bf16-mixed {sharding:?}: max |diff| vs cpu = {diff:e}");
            assert!(
                diff <= BF16_TOLERANCE,
                "{sharding:?}: {diff} > {BF16_TOLERANCE}"
            );
        }
    }
}

#[test]
#[ignore = "needs a CUDA GPU: scripts/gpu-check.sh runs it"]
fn too_many_ranks_for_the_gpus_is_an_error() {
    let gpus = cuda_device_count().unwrap();
    let e = Accelerator::cuda(gpus + 1).unwrap_err().to_string();
    assert!(
        e.contains(&format!("need GPU {gpus}")) && e.contains(&format!("has {gpus} GPU")),
        "{e}"
    );
}

#[cfg(feature = "nccl")]
mod nccl {
    use super::*;
    use candle_core::{DType, Device, Tensor};
    use wick::core::{Collective, CollectiveExt, ReduceOp};

    /// Every collective of `world` (a rank of an NCCL world on `device`) in `dtype`,
    /// checked against what it must give.
    fn exercise(world: &dyn Collective, device: &Device, dtype: DType) {
        let (r, w) = (world.rank(), world.world_size());
        let t = |v: Vec<f32>| Tensor::new(v, device).unwrap().to_dtype(dtype).unwrap();
        let read = |t: &Tensor| t.to_dtype(DType::F32).unwrap().to_vec1::<f32>().unwrap();
        // Shards of 3: rank r holds r*10 + 0, 1, 2.
        let shard = t((0..3).map(|i| (r * 10 + i) as f32).collect());
        let full = Tensor::zeros(3 * w, dtype, device).unwrap();
        world.all_gather_into(&shard, &full).unwrap();
        let expected: Vec<f32> = (0..w)
            .flat_map(|s| (0..3).map(move |i| (s * 10 + i) as f32))
            .collect();
        assert_eq!(read(&full), expected, "all_gather {dtype:?}");
        let prefetched = Tensor::zeros(3 * w, dtype, device).unwrap();
        world
            .all_gather_start(&shard, &prefetched)
            .unwrap()
            .wait()
            .unwrap();
        assert_eq!(read(&prefetched), expected, "all_gather_start {dtype:?}");
        // Every rank contributes (rank + 1) to each element; the mean is (w + 1) / 2.
        let contribution = t(vec![(r + 1) as f32; 3 * w]);
        let mine = Tensor::zeros(3, dtype, device).unwrap();
        world
            .reduce_scatter_into(&contribution, &mine, ReduceOp::Mean)
            .unwrap();
        assert_eq!(
            read(&mine),
            vec![(w + 1) as f32 / 2.0; 3],
            "reduce_scatter {dtype:?}"
        );
        let summed = t(vec![(r + 1) as f32; 4]);
        world.all_reduce_in_place(&summed, ReduceOp::Sum).unwrap();
        assert_eq!(
            read(&summed),
            vec![(w * (w + 1) / 2) as f32; 4],
            "all_reduce {dtype:?}"
        );
        let root = w - 1;
        let b = t(vec![r as f32; 2]);
        world.broadcast_in_place(&b, root).unwrap();
        assert_eq!(read(&b), vec![root as f32; 2], "broadcast {dtype:?}");
        let mean = world.all_reduce_scalar(r as f32, ReduceOp::Mean).unwrap();
        assert_eq!(mean, (w - 1) as f32 / 2.0);
        // Unequal chunks are refused before NCCL sees them.
        let short = Tensor::zeros(3 * w + 1, dtype, device).unwrap();
        let e = world
            .all_gather_into(&shard, &short)
            .unwrap_err()
            .to_string();
        assert!(e.contains("equal chunks"), "{e}");
    }

    fn exercise_every_dtype(accelerator: Accelerator) {
        let outcomes = accelerator.launch(|env| {
            for dtype in [DType::F32, DType::BF16, DType::F16] {
                exercise(env.world.as_ref(), &env.device, dtype);
            }
            // A split world of one rank each is an NCCL world too.
            let alone = env.world.split(env.rank).unwrap();
            exercise(alone.as_ref(), &env.device, DType::F32);
            Ok::<_, wick::core::Error>(())
        });
        for outcome in outcomes {
            outcome.unwrap();
        }
    }

    #[test]
    #[ignore = "needs a CUDA GPU: scripts/gpu-check.sh runs it"]
    fn nccl_world_of_one_moves_device_memory() {
        exercise_every_dtype(Accelerator::cuda(1).unwrap());
    }

    #[test]
    #[ignore = "needs two or more CUDA GPUs: scripts/gpu-check.sh runs it where there are"]
    fn nccl_worlds_across_gpus_collect_and_train_like_the_cpu() {
        let gpus = cuda_device_count().unwrap();
        assert!(gpus >= 2, "this test needs 2 GPUs or more, found {gpus}");
        for world in 2..=gpus.min(4) {
            exercise_every_dtype(Accelerator::cuda(world).unwrap());
            strategies_match_cpu(world, || Accelerator::cuda(world).unwrap());
        }
    }
}
