//! Generation speed of a Hugging Face model directory on one CPU rank, in f32, greedy over
//! the KV cache: tokens/s of `--new` tokens after a `--prompt`-token prompt, and the time of
//! one new token around the 10th and the 500th (the cache keeps them level: each token
//! computes its own position only). `scripts/generation-report.sh` runs it beside
//! transformers' greedy `generate` (`scripts/generate_baseline.py`) on the same cores.
//!
//! ```sh
//! cargo run --release --example generation_speed -- DIR --new 500 --prompt 10 --rounds 5
//! ```

use clap::Parser;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;
use wick::core::{configure_rank, SoloWorld};
use wick::models::{generate, CausalLm, Sampling};
use wick::strategies::strategy_by_name;

/// The options.
#[derive(Parser)]
struct Args {
    /// The model directory (config.json, model.safetensors).
    dir: PathBuf,
    /// New tokens per round.
    #[arg(long, default_value_t = 500)]
    new: usize,
    /// Prompt tokens (ids 1, 2, ...).
    #[arg(long, default_value_t = 10)]
    prompt: usize,
    /// Rounds, each a whole generation.
    #[arg(long, default_value_t = 5)]
    rounds: usize,
}

/// The median of `xs`.
fn median(mut xs: Vec<f64>) -> f64 {
    xs.sort_by(f64::total_cmp);
    xs[xs.len() / 2]
}

/// The time of new token `k` (1-based): the median over tokens `k - 5 ..= k + 5` of the
/// gaps between consecutive tokens, in milliseconds.
fn token_ms(gaps: &[f64], k: usize) -> f64 {
    let (lo, hi) = (k.saturating_sub(5).max(2), (k + 5).min(gaps.len()));
    median(gaps[lo - 1..hi].to_vec()) * 1e3
}

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let mut lm = CausalLm::from_pretrained(&args.dir)?;
    let single = strategy_by_name("single")?;
    let _rank = configure_rank(
        single.as_ref(),
        Arc::new(SoloWorld),
        candle_core::Device::Cpu,
        0,
        &mut lm,
    )?;
    let prompt: Vec<u32> = (1..=args.prompt as u32).collect();
    let sampling = Sampling {
        max_new_tokens: args.new,
        ..Sampling::default()
    };
    for round in 1..=args.rounds {
        let start = Instant::now();
        let mut stamps = Vec::with_capacity(args.new);
        generate(&lm, &prompt, &sampling, |_| {
            stamps.push(start.elapsed().as_secs_f64());
            Ok(())
        })?;
        let total = start.elapsed().as_secs_f64();
        // gaps[k - 1]: the time of new token k (the first: the prompt's pass and one token).
        let gaps: Vec<f64> = stamps
            .iter()
            .scan(0.0, |last, &t| {
                let gap = t - *last;
                *last = t;
                Some(gap)
            })
            .collect();
        let late = args.new.min(500);
        println!(
            "wick round {round}: {:.1} tokens/s, token 10 {:.2} ms, token {late} {:.2} ms",
            stamps.len() as f64 / total,
            token_ms(&gaps, 10),
            token_ms(&gaps, late),
        );
    }
    Ok(())
}
