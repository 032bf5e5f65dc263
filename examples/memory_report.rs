//! Model-state bytes and peak heap per strategy, on a parameter-heavy deep MLP (8 wrapped
//! units of 1600 x 1600, 20.5M parameters) with ranks as threads: 3 AdamW steps each
//! (full_shard three times: keeping activations without and with prefetch, and
//! recomputing every unit).
//!
//! `cargo run --release --example memory_report -- --world 4`
//!
//! `state_bytes_per_rank` is counted from the tensors rank 0's strategy holds after the
//! steps; `formula_bytes_per_rank` is docs/design.md's table; `peak_heap_bytes` is the highest
//! heap of the whole process (all ranks) during the run, minus the heap before it, measured
//! by the counting allocator below.
//!
//! With `--accelerator cuda` (a build with `--features cuda`) the ranks compute on GPUs: one
//! each when there are enough, otherwise all on GPU 0 (collectives staged through the host).
//! `peak_heap_bytes` is then the peak of the GPUs' memory pools during the run, summed over
//! the GPUs used, measured by the CUDA allocator; the same bound is checked.

use candle_core::{Device, Module, Tensor};
use candle_nn::Linear;
use wick::accelerator::{cuda_device_count, Accelerator, DeviceKind};
use wick::core::{
    ActivationCheckpointing, OptimizerConfig, ShardedContext, Strategy, TrainModule, Wrapped,
};
use wick::strategies::{Fsdp, FsdpSharding};
use wick::trainer::{Attached, DataLoader, Dataset, Trainer};

#[path = "../tests/counting_allocator.rs"]
mod counting_allocator;

use counting_allocator as heap;

const WIDTH: usize = 1600;
const UNITS: usize = 8;

/// Random-free inputs: the report is about bytes, not learning.
struct Inputs;

impl Dataset for Inputs {
    type Batch = Tensor;
    fn len(&self) -> usize {
        64
    }
    fn batch(&self, indices: &[usize], device: &Device) -> candle_core::Result<Tensor> {
        let values: Vec<f32> = indices
            .iter()
            .flat_map(|&i| (0..WIDTH).map(move |j| ((i * 31 + j) % 17) as f32 / 17.0))
            .collect();
        Tensor::from_vec(values, (indices.len(), WIDTH), device)
    }
}

#[derive(Clone, Default)]
struct DeepMlp {
    units: Vec<Wrapped<Linear>>,
}

impl TrainModule for DeepMlp {
    type Batch = Tensor;

    fn configure_sharded_model(&mut self, ctx: &ShardedContext) -> candle_core::Result<()> {
        self.units = (0..UNITS)
            .map(|i| {
                ctx.wrap(&format!("layers.{i}"), |vb| {
                    candle_nn::linear(WIDTH, WIDTH, vb)
                })
            })
            .collect::<candle_core::Result<_>>()?;
        Ok(())
    }

    fn configure_optimizers(&self) -> OptimizerConfig {
        OptimizerConfig::adamw(1e-4)
    }

    fn training_step(&mut self, x: &Tensor, _: usize) -> candle_core::Result<Tensor> {
        let mut h = x.clone();
        for unit in &self.units {
            h = unit.apply(&h, |layer, x| layer.forward(x)?.tanh())?;
        }
        h.sqr()?.mean_all()
    }
}

/// `--world N` (default 4) and `--accelerator cpu|cuda` (default cpu).
fn args() -> anyhow::Result<(usize, DeviceKind)> {
    let (mut world, mut kind) = (4, DeviceKind::Cpu);
    let args: Vec<String> = std::env::args().skip(1).collect();
    for pair in args.chunks(2) {
        match pair {
            [flag, w] if flag == "--world" => match w.parse::<usize>() {
                Ok(n) if n > 0 => world = n,
                _ => anyhow::bail!("invalid value '{w}' for --world: expected a positive integer"),
            },
            [flag, a] if flag == "--accelerator" => kind = DeviceKind::parse(a)?,
            _ => anyhow::bail!("usage: memory_report [--world N] [--accelerator cpu|cuda]"),
        }
    }
    Ok((world, kind))
}

/// The ranks, and the GPUs whose memory they use (none on the CPU).
fn accelerator(devices: usize, kind: DeviceKind) -> anyhow::Result<(Accelerator, Vec<usize>)> {
    Ok(match kind {
        DeviceKind::Cpu => (Accelerator::cpu(devices)?, vec![]),
        DeviceKind::Cuda if cuda_device_count()? >= devices => {
            (Accelerator::cuda(devices)?, (0..devices).collect())
        }
        DeviceKind::Cuda => (Accelerator::cuda_one_gpu(devices)?, vec![0]),
    })
}

/// The bytes a run uses beyond `before`: the heap's peak, or the GPUs' pool peaks.
#[cfg(feature = "cuda")]
fn peak_since(before: usize, gpus: &[usize]) -> anyhow::Result<usize> {
    match gpus {
        [] => Ok(heap::peak() - before),
        _ => Ok(gpus
            .iter()
            .map(|&g| wick::accelerator::cuda_memory_peak(g))
            .sum::<Result<usize, _>>()?),
    }
}

#[cfg(not(feature = "cuda"))]
fn peak_since(before: usize, _: &[usize]) -> anyhow::Result<usize> {
    Ok(heap::peak() - before)
}

/// Starts measuring: returns the heap now, after resetting the GPUs' pool peaks.
fn start_measuring(gpus: &[usize]) -> anyhow::Result<usize> {
    #[cfg(feature = "cuda")]
    for &g in gpus {
        wick::accelerator::reset_cuda_memory_peak(g)?;
    }
    let _ = gpus;
    Ok(heap::reset_peak())
}

fn main() -> anyhow::Result<()> {
    // As the `wick` program runs (its process-wide settings for CPU training).
    // SAFETY: first in main, before any thread, so no one else touches the environment.
    unsafe { wick::accelerator::tune_host_process() };
    let (world, kind) = args()?;
    let data = DataLoader::new(Inputs, 4 * world);
    let by_name = wick::strategies::strategy_by_name;
    let runs: Vec<(&str, Box<dyn Strategy>)> = vec![
        ("single", by_name("single")?),
        ("ddp", by_name("ddp")?),
        ("zero1", by_name("zero1")?),
        ("zero2", by_name("zero2")?),
        ("zero3", by_name("zero3")?),
        (
            "fsdp_shard_grad_op",
            Fsdp::new(FsdpSharding::ShardGradOp).build(),
        ),
        (
            "fsdp_full_shard",
            Fsdp::new(FsdpSharding::FullShard).build(),
        ),
        (
            "fsdp_full_shard_prefetch",
            Fsdp::new(FsdpSharding::FullShard)
                .with_prefetch(true)
                .build(),
        ),
        (
            "fsdp_full_shard_recompute",
            Fsdp::new(FsdpSharding::FullShard)
                .with_activation_checkpointing(ActivationCheckpointing::Full)
                .build(),
        ),
    ];
    let mut peaks = std::collections::HashMap::new();
    for (strategy, instance) in runs {
        let devices = if strategy == "single" { 1 } else { world };
        let (accelerator, gpus) = accelerator(devices, kind)?;
        let mut trainer = Trainer::builder()
            .accelerator(accelerator)
            .strategy(instance)
            .max_steps(3)
            .no_logger()
            .progress(false)
            .model_summary(false)
            .build()?;
        let mut model = Attached::new(DeepMlp::default());
        let before = start_measuring(&gpus)?;
        trainer.fit(&mut model, &data, None)?;
        let peak = peak_since(before, &gpus)?;
        let params = model.num_parameters().unwrap_or(0);
        let state = model.state_bytes().unwrap_or_default().total();
        let formula = trainer.sharding().adamw_formula_bytes(params, devices);
        println!(
            "accelerator={} strategy={strategy} world={devices} params={params} state_bytes_per_rank={state} formula_bytes_per_rank={formula} peak_heap_bytes={peak}",
            kind.name()
        );
        peaks.insert(strategy, (peak, state));
    }
    // full_shard's bound: per rank its sharded state, three units' full parameters, and the
    // activations: five of batch x width per unit kept from forward (the unit's input as its
    // graph's variable, the matmul's and the bias's outputs, tanh's, the copy that leaves
    // the unit), and sixteen for one unit's backward, counted generously.
    let (full_shard_peak, full_shard_state) = peaks["fsdp_full_shard"];
    let (prefetch_peak, _) = peaks["fsdp_full_shard_prefetch"];
    let (recompute_peak, _) = peaks["fsdp_full_shard_recompute"];
    let unit_bytes = (WIDTH * WIDTH + WIDTH) * 4;
    let activations = (5 * UNITS + 16) * data.batch_size() / world * WIDTH * 4;
    let bound = world * (full_shard_state + 3 * unit_bytes + activations);
    let order = ["ddp", "fsdp_shard_grad_op", "fsdp_full_shard"].map(|s| peaks[s].0);
    let zero_order = ["ddp", "zero1", "zero2", "zero3"].map(|s| peaks[s].0);
    // zero3 gathers each unit per use as full_shard does: within 10% of its peak.
    let zero3_peak = peaks["zero3"].0;
    println!(
        "check: full_shard peak {full_shard_peak} (with prefetch {prefetch_peak}, recomputing {recompute_peak}) <= bound {bound} ({}); full_shard < shard_grad_op < ddp ({}); ddp > zero1 > zero2 > zero3 ({}); zero3 peak {zero3_peak} within 10% of full_shard's ({:.3}x: {})",
        full_shard_peak.max(prefetch_peak).max(recompute_peak) <= bound,
        order.windows(2).all(|w| w[1] < w[0]),
        zero_order.windows(2).all(|w| w[1] < w[0]),
        zero3_peak as f64 / full_shard_peak as f64,
        zero3_peak as f64 <= 1.1 * full_shard_peak as f64,
    );
    Ok(())
}
