//! `--hf DIR [--lora-rank R] [--checkpoint-activations] [--processes]`: the model of a
//! Hugging Face directory (for the real-size row, the SmolLM2-135M-shaped one
//! `scripts/hf_fixtures.py --smollm2-135m DIR` writes) under fsdp full_shard at W=2, the
//! ranks as threads or (`--processes`, under `mpirun -np 2`) as processes, sequence 256,
//! global batch 8, fully fine-tuned or with LoRA of rank R (alpha 2R, every linear layer of
//! a block, no dropout), each block keeping its activations or (with
//! `--checkpoint-activations`) recomputing them in backward. Its peak memory is measured
//! from outside the process, the same way as PyTorch's (`scripts/rss_peak.py`); rank 0
//! prints `rss_peak steady` when the 4 measured steps begin, after 2 warm-up steps, for
//! the steady-state peak.
//! `scripts/torch_baseline.py --hf DIR [--lora R] [--checkpoint-activations]` prints the
//! same row for transformers (and peft) with FSDP2.
//!
//! The model FLOPs per token are the model's own (`ModelConfig::flops_per_token`, what the
//! loggers' `mfu` uses): PaLM's 6 x the parameters that multiply (the embedding table too
//! when it is tied, since it projects the logits) plus attention's 12 x layers x heads x
//! head_dim x sequence. Under LoRA a frozen weight's backward computes only its input's
//! gradient: 4 x the frozen parameters that multiply, 6 x the adapters.

use crate::{random_windows, timed_fit, StepClock, Steps};
use std::path::Path;
use wick::accelerator::Accelerator;
use wick::core::{ActivationCheckpointing, TrainModule};
use wick::models::{CausalLm, LoraConfig, DECODER_TARGETS};
use wick::strategies::{Fsdp, FsdpSharding};

const SEQ: usize = 256;
const BATCH: usize = 8;
/// Fewer steps than the small rows': each takes seconds, and the rows run 5 rounds. As
/// `scripts/torch_baseline.py --hf` runs them.
const STEPS: Steps = Steps {
    warmup: 2,
    measured: 4,
};

/// The row of `dir`'s model under fsdp full_shard at W=2, with LoRA of `rank` if given and
/// every block recomputed in backward if `recompute`, over `ranks` (two ranks, and the
/// transport they are named by); `peak` is the measured GEMM peak the utilisation is taken
/// over, if measured. Rank 0 prints the row.
pub fn hf_row(
    dir: &Path,
    rank: Option<usize>,
    recompute: bool,
    ranks: (Accelerator, &str),
    peak: Option<f64>,
) -> anyhow::Result<()> {
    let (accelerator, transport) = ranks;
    let load = std::time::Instant::now();
    let mut model = CausalLm::from_pretrained(dir)?;
    let vocab = model.config().vocab_size() as u64;
    let name = match rank {
        Some(r) => {
            model = model.with_lora(LoraConfig {
                rank: r,
                alpha: 2.0 * r as f64,
                dropout: 0.0,
                targets: DECODER_TARGETS.iter().map(|t| t.to_string()).collect(),
            })?;
            format!("hf:{}+lora{r}", dir.display())
        }
        None => format!("hf:{}", dir.display()),
    };
    let per_token = model
        .flops_per_token(SEQ)
        .expect("a causal LM gives its FLOPs");
    let (ac, ac_label) = match recompute {
        true => (
            ActivationCheckpointing::Full,
            " activation_checkpointing=full",
        ),
        false => (ActivationCheckpointing::None, ""),
    };
    let strategy = Fsdp::new(FsdpSharding::FullShard)
        .with_activation_checkpointing(ac)
        .build();
    let rank0 = accelerator.local_ranks().start == 0;
    let world = accelerator.world_size();
    let clock = StepClock::announcing(STEPS);
    let data = random_windows(vocab, SEQ, BATCH, 11, STEPS);
    let model = timed_fit(model, &data, strategy, accelerator, &clock)?;
    let step = clock.median_step();
    let trainable = model.num_parameters().unwrap_or(0);
    let frozen = model.num_frozen_parameters().unwrap_or(0);
    if !rank0 {
        return Ok(());
    }
    let tps = (BATCH * SEQ) as f64 / step;
    let gflops = tps * per_token / 1e9;
    println!(
        "impl=wick model={name} strategy=fsdp_full_shard{ac_label} world={world} \
         transport={transport} parameters={trainable} frozen={frozen} \
         flops_per_token={per_token:.0} tokens_per_s={tps:.1} gflops={gflops:.1}{} \
         run_s={:.0}",
        peak.map_or(String::new(), |p| format!(" mfu={:.3}", gflops / p)),
        load.elapsed().as_secs_f64()
    );
    Ok(())
}
