//! Training throughput: wick's strategies against a plain Candle training loop of the same
//! GPT, in one run.
//!
//! `cargo run --release --example throughput` (add `--table` for step time against width
//! and ranks).
//!
//! The model is the main job's GPT scaled up: 4 layers, d_model 128, 4 heads, context 64,
//! vocabulary 96, global batch 16 (1024 tokens a step), AdamW, on token ids drawn from a
//! fixed generator. One line per row:
//! `impl=<wick|candle> strategy=<name> world=<W> tokens_per_s=<n>`, where `impl=candle` is
//! a plain Candle loop (`VarMap`, candle-nn's `AdamW`) over the same model built from
//! composite ops, run in a child process with Candle's default settings, and `impl=wick` runs the main job's model (wick-nn's fused layers) under
//! the `Trainer`. Each row is the median step time of the measured steps after the warm-up
//! ones. Lines starting with `#` give ratios of rows of this run, and ddp at W=2 without
//! the thread budget (both ranks on Candle's one global pool). `fsdp_full_shard` keeps each
//! unit's activations from forward to backward; `fsdp_full_shard_recompute` is the same
//! with activation checkpointing on every unit (each unit's forward runs again in backward).
//! These two and `fsdp_shard_grad_op` run interleaved, three rounds, each row the median.
//!
//! `--table` adds `table strategy=fsdp_full_shard d_model=<d> world=<W> step_ms=<t>` for
//! d_model 128, 256 and 512 at W = 1, 2 and 4.
//!
//! `--compare` prints the rows `scripts/torch_baseline.py` prints for PyTorch, for the GPT
//! at d_model 128 and 512 and a Llama of 20.2M parameters (wick-models' `CausalLm`: hidden
//! 512, 4 layers, 8 query and 4 key/value heads, SiLU MLP of 1408, vocabulary 8192, untied)
//! at sequence 256 and global batch 8, each under `single`, ddp at W=2 and fsdp full_shard
//! at W=2 with the ranks as threads (`--models gpt-d512,llama` picks): `impl=wick model=<m>
//! strategy=<name> world=<W> transport=<none|threads> parameters=<p> flops_per_token=<f>
//! tokens_per_s=<n> gflops=<g> mfu=<u>`. Ranks as threads have no GPU counterpart: they are
//! wick's own advantage on one CPU host. `--compare --processes`, started by `mpirun -np 2`
//! in a build with `--features mpi`, prints ddp and full_shard with this process as one of
//! the ranks (`transport=mpi`, `MpiWorld`, each process in a pool of `cores / W` threads,
//! as PyTorch's processes get), to set beside PyTorch's processes over gloo.
//! `--llama` is `--compare --models llama`. The model FLOPs per token are 6 x the
//! parameters that multiply (all but the embeddings' lookup tables) plus attention's 12 x
//! layers x heads x head_dim x sequence (PaLM's accounting, which counts the masked half of
//! causal attention too); the utilisation is those FLOPs per second over the peak measured
//! in the same run: the best f32 rate of Candle's GEMM kernel (the `gemm` crate, called as
//! Candle's matmul calls it, on buffers made once) on all cores, square 1024 and 2048, best
//! of 8 each, before the rows (`peak_gflops=<g>`).
//!
//! Like the `wick` program, it makes wick's process-wide settings for CPU training first
//! (`tune_host_process`); the plain Candle loop's child process runs without them.
//!
//! `--hf DIR [--lora-rank R] [--checkpoint-activations] [--processes]` is the real-size row
//! (`hf.rs`): a Hugging Face directory's model under fsdp full_shard at W=2, fully
//! fine-tuned or with LoRA, keeping or recomputing activations, its ranks as threads or
//! (`--processes`, under `mpirun -np 2`) as processes.
//!
//! `--profile` prints where a step's time goes (`profile.rs`): for the GPT at d_model 512
//! (single, fsdp full_shard and ddp at W=2) and the Llama (single, full_shard at W=2),
//! milliseconds per step and rank in matmul forward, matmul backward, copies, element-wise
//! ops, norms and attention, the optimizer, collectives and the rest, and the process's
//! page faults per step; and each of their linear layers' matmuls alone against the same
//! peak. `--models` and `--strategies` pick among those rows.

use char_gpt::{CharGpt, GptConfig};
use wick::accelerator::{Accelerator, ThreadBudget};
use wick::core::{ActivationCheckpointing, Strategy, TrainModule};
use wick::strategies::{strategy_by_name, Fsdp, FsdpSharding};
use wick::trainer::DataLoader;

mod candle_gpt;
mod compare;
mod data;
mod hf;
mod peak;
mod profile;
mod step_clock;

use compare::{compare_rows, process_accelerator, RowOptions};
use data::{config, data, llama_data, llama_model, random_windows, Steps, LLAMA_BATCH, LLAMA_SEQ};
use peak::peak_gflops;
use step_clock::{median_step, quiet_trainer, timed_fit, StepClock};

// The main job's model and windows, from the `wick` program's own modules.
#[path = "../../src/char_corpus.rs"]
#[allow(dead_code)]
mod char_corpus;
#[path = "../../src/char_gpt.rs"]
#[allow(dead_code)]
mod char_gpt;

const BATCH: usize = 16;
/// The GPT's and Llama's rows: 3 untimed steps, then 10 timed.
const STEPS: Steps = Steps {
    warmup: 3,
    measured: 10,
};
const LR: f64 = 1e-3;
/// What Candle's CPU matmul runs on in this build: the `gemm` crate, or Intel MKL with the
/// `mkl` feature (`matmul=` in the `--compare` rows).
const MATMUL: &str = if cfg!(feature = "mkl") { "mkl" } else { "gemm" };
/// Rounds of the full_shard rows (see [`FSDP_ROWS`]).
const ROUNDS: usize = 3;

/// Builds a fresh strategy for one run of a row.
type MakeStrategy = fn() -> wick::core::Result<Box<dyn Strategy>>;

/// The full_shard rows: activations kept (the default), every unit recomputed, and
/// shard_grad_op (parameters kept from forward to backward).
const FSDP_ROWS: [(&str, MakeStrategy); 3] = [
    ("fsdp_full_shard", || {
        Ok(Fsdp::new(FsdpSharding::FullShard).build())
    }),
    ("fsdp_full_shard_recompute", || {
        Ok(Fsdp::new(FsdpSharding::FullShard)
            .with_activation_checkpointing(ActivationCheckpointing::Full)
            .build())
    }),
    ("fsdp_shard_grad_op", || {
        Ok(Fsdp::new(FsdpSharding::ShardGradOp).build())
    }),
];

/// wick's seconds per step for `strategy` at `world` ranks as threads with `budget`.
fn wick_step(
    c: GptConfig,
    strategy: Box<dyn Strategy>,
    world: usize,
    budget: ThreadBudget,
) -> anyhow::Result<f64> {
    let accelerator = Accelerator::cpu(world)?.with_thread_budget(budget);
    Ok(gpt_step(c, strategy, accelerator, STEPS)?.0)
}

/// The GPT's seconds per step (the median of `steps`) and parameters under `strategy` on
/// `accelerator`'s ranks.
fn gpt_step(
    c: GptConfig,
    strategy: Box<dyn Strategy>,
    accelerator: Accelerator,
    steps: Steps,
) -> anyhow::Result<(f64, usize)> {
    let clock = StepClock::new(steps);
    let data = DataLoader::new(data(&c, steps), BATCH);
    let model = timed_fit(CharGpt::new(c, LR), &data, strategy, accelerator, &clock)?;
    Ok((clock.median_step(), model.num_parameters().unwrap_or(0)))
}

/// The Llama's seconds per step (the median of `steps`) and parameters under `strategy` on
/// `accelerator`'s ranks.
fn llama_step(
    strategy: Box<dyn Strategy>,
    accelerator: Accelerator,
    steps: Steps,
) -> anyhow::Result<(f64, usize)> {
    let clock = StepClock::new(steps);
    let model = timed_fit(
        llama_model()?,
        &llama_data(steps),
        strategy,
        accelerator,
        &clock,
    )?;
    Ok((clock.median_step(), model.num_parameters().unwrap_or(0)))
}

/// The model FLOPs of one token of `model`, the model's own
/// ([`TrainModule::flops_per_token`], what the loggers' `mfu` uses): PaLM's 6 x the
/// parameters that multiply (every one but the lookup tables of token and position
/// embeddings, which a gather reads), plus attention's 12 x layers x heads x head_dim x
/// sequence (the masked half of causal attention counted too).
fn flops_per_token(model: &str) -> anyhow::Result<f64> {
    let flops = match model {
        "llama" => llama_model()?.flops_per_token(LLAMA_SEQ),
        gpt => {
            let c = config(gpt_width(gpt)?);
            CharGpt::new(c, LR).flops_per_token(c.block)
        }
    };
    flops.ok_or_else(|| anyhow::anyhow!("{model} gives no FLOPs"))
}

/// The width of a `gpt-d<D>` model name.
fn gpt_width(model: &str) -> anyhow::Result<usize> {
    model
        .strip_prefix("gpt-d")
        .and_then(|d| d.parse().ok())
        .ok_or_else(|| anyhow::anyhow!("unknown model '{model}': gpt-d<width> or llama"))
}

/// A fresh strategy of `name` (a registry name, or `fsdp_full_shard`).
fn strategy(name: &str) -> anyhow::Result<Box<dyn Strategy>> {
    Ok(match name {
        "fsdp_full_shard" => Fsdp::new(FsdpSharding::FullShard).build(),
        n => strategy_by_name(n)?,
    })
}

/// The example's flags (its module text says what each run measures).
#[derive(clap::Parser)]
#[command(about = "tokens per second of wick's strategies, beside Candle and PyTorch")]
struct Args {
    /// The plain Candle loop alone, with Candle's defaults (the default run starts it as a
    /// child process).
    #[arg(long, hide = true)]
    candle_baseline: bool,
    /// Where a step's time goes, by class of op (of `--models`' GPT d512 and Llama, under
    /// `--strategies`).
    #[arg(long)]
    profile: bool,
    /// The strategies of `--profile`.
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "single,fsdp_full_shard,ddp"
    )]
    strategies: Vec<String>,
    /// `--compare --models llama`.
    #[arg(long)]
    llama: bool,
    /// The rows `scripts/torch_baseline.py` prints for PyTorch.
    #[arg(long)]
    compare: bool,
    /// The models of `--compare`.
    #[arg(long, value_delimiter = ',', default_value = "gpt-d128,gpt-d512,llama")]
    models: Vec<String>,
    /// This process is one rank of `mpirun -np 2` (`--compare`, `--hf`).
    #[arg(long)]
    processes: bool,
    /// The real-size row of a Hugging Face directory's model.
    #[arg(long, value_name = "DIR")]
    hf: Option<std::path::PathBuf>,
    /// `--hf`'s model with LoRA of this rank.
    #[arg(long, value_name = "R", requires = "hf")]
    lora_rank: Option<usize>,
    /// `--hf`'s blocks recomputed in backward.
    #[arg(long, requires = "hf")]
    checkpoint_activations: bool,
    /// Also step time against width and W.
    #[arg(long)]
    table: bool,
    /// The timed steps of each `--compare` row, after 3 untimed ones (a row is their
    /// median).
    #[arg(long, value_name = "N", default_value_t = 10, value_parser = clap::value_parser!(u16).range(1..))]
    steps: u16,
    /// How long, in milliseconds, the idle threads of each `--compare` rank's pool look for
    /// work before they nap (`Accelerator::with_worker_spin`; 0: rayon's own sleep).
    #[arg(long, value_name = "MS")]
    worker_spin_ms: Option<u64>,
}

fn main() -> anyhow::Result<()> {
    let args = <Args as clap::Parser>::parse();
    let c = config(128);
    if args.candle_baseline {
        // Candle's own defaults: no process settings of wick's.
        println!("{}", candle_gpt::candle_step(c)?);
        return Ok(());
    }
    // The settings the `wick` program makes for CPU training, made here the same way.
    // SAFETY: first in main, before any thread, so no one else touches the environment.
    let tuning = unsafe { wick::accelerator::tune_host_process() };
    if args.profile {
        return profile::profile_rows(peak_gflops()?, &args.models, &args.strategies);
    }
    let options = RowOptions {
        steps: Steps {
            measured: args.steps.into(),
            ..STEPS
        },
        worker_spin: args.worker_spin_ms.map(std::time::Duration::from_millis),
    };
    if args.llama {
        return compare_rows(&["llama".to_string()], args.processes, options);
    }
    if let Some(dir) = &args.hf {
        // The GEMM peak is measured on all cores: where the ranks are processes, both
        // would measure at once, so the row has no utilisation (as `--compare --processes`).
        let (accelerator, transport, peak) = match args.processes {
            true => (process_accelerator()?, "mpi", None),
            false => {
                let peak = peak_gflops()?;
                println!("peak_gflops={peak:.1}");
                (Accelerator::cpu(2)?, "threads", Some(peak))
            }
        };
        let ranks = (accelerator, transport);
        return hf::hf_row(
            dir,
            args.lora_rank,
            args.checkpoint_activations,
            ranks,
            peak,
        );
    }
    if args.compare {
        return compare_rows(&args.models, args.processes, options);
    }
    let table = args.table;
    let tokens = (BATCH * c.block) as f64;
    let row = |imp: &str, strategy: &str, world: usize, step: f64| {
        let tps = tokens / step;
        println!("impl={imp} strategy={strategy} world={world} tokens_per_s={tps:.0}");
        tps
    };
    // The plain Candle loop runs in a child process, with Candle's defaults: this one's
    // tuning set CANDLE_NUM_THREADS=1, which the child must not inherit.
    let mut child = std::process::Command::new(std::env::current_exe()?);
    if tuning.candle_pool_quieted {
        child.env_remove("CANDLE_NUM_THREADS");
    }
    let baseline = child.arg("--candle-baseline").output()?;
    anyhow::ensure!(
        baseline.status.success(),
        "the candle baseline failed: {baseline:?}"
    );
    let candle_step = String::from_utf8(baseline.stdout)?.trim().parse::<f64>()?;
    let candle = row("candle", "single", 1, candle_step);
    let mut wick = std::collections::HashMap::new();
    let fsdp = |s| -> Box<dyn Strategy> { Fsdp::new(s).build() };
    for world in [1, 2] {
        let mut runs: Vec<(&str, Box<dyn Strategy>)> = Vec::new();
        if world == 1 {
            runs.push(("single", strategy_by_name("single")?));
        }
        for name in ["ddp", "zero1", "zero2", "zero3"] {
            runs.push((name, strategy_by_name(name)?));
        }
        for (name, strategy) in runs {
            let step = wick_step(c, strategy, world, ThreadBudget::Auto)?;
            let tps = row("wick", name, world, step);
            wick.insert((name, world), tps);
        }
        // The rows compared for keeping activations, interleaved over ROUNDS so that the
        // machine's drift falls on all three alike; each is the median of its rounds.
        let mut steps = vec![Vec::new(); FSDP_ROWS.len()];
        for _ in 0..ROUNDS {
            for (times, (_, strategy)) in steps.iter_mut().zip(FSDP_ROWS) {
                times.push(wick_step(c, strategy()?, world, ThreadBudget::Auto)?);
            }
        }
        for (mut times, (name, _)) in steps.into_iter().zip(FSDP_ROWS) {
            times.sort_by(f64::total_cmp);
            let tps = row("wick", name, world, times[ROUNDS / 2]);
            wick.insert((name, world), tps);
        }
    }
    let single = wick[&("single", 1)];
    println!("# wick single / candle: {:.2}", single / candle);
    for name in ["ddp", "fsdp_full_shard"] {
        println!(
            "# wick {name} W=2 / wick single: {:.2}",
            wick[&(name, 2)] / single
        );
    }
    for world in [1, 2] {
        let kept = wick[&("fsdp_full_shard", world)];
        println!(
            "# wick fsdp_full_shard W={world} (activations kept) / recompute: {:.2}, / shard_grad_op: {:.2}",
            kept / wick[&("fsdp_full_shard_recompute", world)],
            kept / wick[&("fsdp_shard_grad_op", world)],
        );
    }
    // The same ddp at W=2 with both ranks on Candle's one global rayon pool (no budget).
    let shared = tokens / wick_step(c, strategy_by_name("ddp")?, 2, ThreadBudget::Shared)?;
    println!(
        "# wick ddp W=2 with both ranks on Candle's shared pool: tokens_per_s={shared:.0}, {:.2} of the budgeted ddp",
        shared / wick[&("ddp", 2)]
    );
    if table {
        for d_model in [128, 256, 512] {
            for world in [1, 2, 4] {
                let strategy = fsdp(FsdpSharding::FullShard);
                let step = wick_step(config(d_model), strategy, world, ThreadBudget::Auto)?;
                println!(
                    "table strategy=fsdp_full_shard d_model={d_model} world={world} step_ms={:.1}",
                    step * 1e3
                );
            }
        }
    }
    Ok(())
}
