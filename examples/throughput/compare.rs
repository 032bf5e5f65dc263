//! `--compare`: wick's rows beside `scripts/torch_baseline.py`'s, ranks as threads or (with
//! `--processes`) as the processes `mpirun` started.

use crate::{
    config, flops_per_token, gpt_step, gpt_width, llama_step, peak_gflops, strategy, Steps, BATCH,
    LLAMA_BATCH, LLAMA_SEQ, MATMUL,
};
use wick::accelerator::{Accelerator, ThreadBudget};

/// `model`'s tokens per step, median seconds per step (of `steps`) and parameters under
/// `name` on `accelerator`'s ranks (the rows are rank 0's).
fn measure(
    model: &str,
    name: &str,
    accelerator: Accelerator,
    steps: Steps,
) -> anyhow::Result<(usize, f64, usize)> {
    if model == "llama" {
        let (step, params) = llama_step(strategy(name)?, accelerator, steps)?;
        return Ok((LLAMA_BATCH * LLAMA_SEQ, step, params));
    }
    let c = config(gpt_width(model)?);
    let (step, params) = gpt_step(c, strategy(name)?, accelerator, steps)?;
    Ok((BATCH * c.block, step, params))
}

/// How each `--compare` row runs: its steps, and its pools' worker spin where asked for
/// (otherwise the accelerator's default).
#[derive(Clone, Copy)]
pub(crate) struct RowOptions {
    pub(crate) steps: Steps,
    pub(crate) worker_spin: Option<std::time::Duration>,
}

/// How the `--compare` ranks are run: `transport=` in each row.
#[derive(Clone, Copy, PartialEq)]
enum Ranks {
    /// W = 1: one rank, nothing to carry.
    One,
    /// Ranks as threads of this process (`ThreadWorld`): no GPU counterpart.
    Threads,
    /// This process is one of the ranks `mpirun` started (`MpiWorld`), each in a pool of
    /// `cores / W` threads, as each of PyTorch's processes runs `cores / W`.
    Mpi,
}

/// This process as one of the ranks `mpirun` started, in a pool of `cores / W` threads (as
/// each of PyTorch's processes runs `cores / W`).
pub(crate) fn process_accelerator() -> anyhow::Result<Accelerator> {
    let accelerator = Accelerator::from_env(None)?;
    anyhow::ensure!(
        accelerator.launcher().is_some(),
        "--processes needs mpirun (and a build with --features mpi)"
    );
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let per_rank = (cores / accelerator.world_size()).max(1);
    Ok(accelerator.with_thread_budget(ThreadBudget::per_rank(per_rank)?))
}

/// The `--compare` rows: `models` under single, ddp at W=2 and fsdp full_shard at W=2 as
/// threads, or, started by `mpirun` (`--processes`), ddp and fsdp full_shard with this
/// process as one rank; in the format `scripts/torch_baseline.py` prints PyTorch's, with
/// model FLOPs utilisation over the peak measured first (threads only).
pub(crate) fn compare_rows(
    models: &[String],
    processes: bool,
    options: RowOptions,
) -> anyhow::Result<()> {
    let peak = match processes {
        false => {
            let peak = peak_gflops()?;
            println!("peak_gflops={peak:.1}");
            Some(peak)
        }
        true => None,
    };
    let runs: Vec<(&str, Ranks)> = match processes {
        false => vec![
            ("single", Ranks::One),
            ("ddp", Ranks::Threads),
            ("fsdp_full_shard", Ranks::Threads),
        ],
        true => vec![("ddp", Ranks::Mpi), ("fsdp_full_shard", Ranks::Mpi)],
    };
    for model in models {
        for &(name, ranks) in &runs {
            let accelerator = match ranks {
                Ranks::One => Accelerator::cpu(1)?,
                Ranks::Threads => Accelerator::cpu(2)?,
                Ranks::Mpi => process_accelerator()?,
            };
            let accelerator = match options.worker_spin {
                Some(spin) => accelerator.with_worker_spin(spin),
                None => accelerator,
            };
            let world = accelerator.world_size();
            let rank0 = accelerator.local_ranks().start == 0;
            let (tokens, step, params) = measure(model, name, accelerator, options.steps)?;
            if !rank0 {
                continue;
            }
            let tps = tokens as f64 / step;
            let per_token = flops_per_token(model)?;
            let gflops = tps * per_token / 1e9;
            let transport = match ranks {
                Ranks::One => "none",
                Ranks::Threads => "threads",
                Ranks::Mpi => "mpi",
            };
            let mfu = peak.map_or(String::new(), |p| format!(" mfu={:.3}", gflops / p));
            println!(
                "impl=wick model={model} strategy={name} world={world} transport={transport} \
                 matmul={MATMUL} parameters={params} flops_per_token={per_token:.0} \
                 tokens_per_s={tps:.0} gflops={gflops:.1}{mfu}"
            );
        }
    }
    Ok(())
}
