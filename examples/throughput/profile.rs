//! `--profile`: where a training step's time goes, by class of op, and each of the model's
//! matmul shapes run alone against the peak of a large square matmul, in one run.
//!
//! The classes come from the vendored candle-core's op profiler (`candle_core::op_profile`):
//! every op a rank runs is timed on the rank's thread, exclusive of the ops it runs itself;
//! an optimizer step and a collective count whole as their own class (wick-strategies and
//! wick-core open those scopes). The steps after the warm-up ones are profiled; each class
//! is given per step and per rank, and `other` is the step's time that no class holds (the
//! trainer, allocation, the sharding ops' own work).

use crate::{config, llama_data, llama_model, CharGpt, BATCH, LR, STEPS};
use candle_core::op_profile;
use candle_core::{Device, Tensor};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use wick::accelerator::Accelerator;
use wick::core::{Callback, RunState, Strategy};
use wick::strategies::{strategy_by_name, Fsdp, FsdpSharding};
use wick::trainer::{Attached, DataLoader};

/// The classes a step is reported in, and the profiler's classes each holds.
const GROUPS: [(&str, &[&str]); 8] = [
    ("matmul_forward", &["matmul", "wick-linear"]),
    ("matmul_backward", &["matmul_backward"]),
    ("copies", &["copy"]),
    (
        "elementwise",
        &[
            "elementwise",
            "reduce",
            "index",
            "custom_inplace",
            "wick-add-bias",
            "wick-column-sums",
            "wick-gelu",
            "wick-gelu-backward",
            "wick-swiglu",
            "wick-swiglu-backward",
        ],
    ),
    (
        "norms_attention",
        &[
            "wick-layer-norm",
            "wick-layer-norm-backward",
            "wick-rms-norm",
            "wick-rms-norm-backward",
            "wick-rotary",
            "wick-causal-attention",
            "wick-causal-attention-backward",
            "wick-cross-entropy",
            "wick-cross-entropy-backward",
        ],
    ),
    // The output projection and the loss in one op (its matmuls inside).
    ("output_and_loss", &["wick-linear-cross-entropy"]),
    ("optimizer", &["optimizer"]),
    ("collectives", &["collective"]),
];

/// What a profiled run measured: the wall time of the profiled steps, the process's page
/// faults in them (where /proc says), and each profiler class's time, summed over the
/// ranks.
type Window = (Duration, Option<u64>, Vec<(&'static str, Duration, u64)>);

/// When the profiled steps began, and the process's page faults then.
type Started = (Instant, Option<u64>);

/// Turns the profiler on after the warm-up steps and off after the measured ones (rank 0
/// decides; the ranks step together).
#[derive(Clone, Default)]
struct ProfileWindow {
    started: Arc<Mutex<Option<Started>>>,
    result: Arc<Mutex<Option<Window>>>,
}

impl Callback for ProfileWindow {
    fn on_train_batch_end(&mut self, state: &RunState) -> candle_core::Result<()> {
        if state.rank != 0 {
            return Ok(());
        }
        if state.global_step == STEPS.warmup {
            op_profile::take();
            op_profile::set_enabled(true);
            *self.started.lock().unwrap() = Some((Instant::now(), minor_faults()));
        } else if state.global_step == STEPS.total() {
            op_profile::set_enabled(false);
            let (start, faults) = self.started.lock().unwrap().take().expect("started");
            let faults = minor_faults().zip(faults).map(|(end, start)| end - start);
            *self.result.lock().unwrap() = Some((start.elapsed(), faults, op_profile::take()));
        }
        Ok(())
    }
}

/// Profiles `fit` under `strategy` at `world` ranks as threads.
fn profiled<M: wick::trainer::Replicate + 'static>(
    model: M,
    data: &DataLoader<impl wick::trainer::Dataset<Batch = M::Batch>>,
    strategy: Box<dyn Strategy>,
    world: usize,
) -> anyhow::Result<Window> {
    let window = ProfileWindow::default();
    let mut trainer = crate::quiet_trainer(
        Accelerator::cpu(world)?,
        strategy,
        STEPS.total(),
        window.clone(),
    )?;
    trainer.fit(&mut Attached::new(model), data, None)?;
    let result = window.result.lock().unwrap().take();
    result.ok_or_else(|| anyhow::anyhow!("the profiled steps did not run"))
}

/// Prints a profiled run: the step, then each class per step and rank.
fn report(model: &str, strategy: &str, world: usize, (wall, faults, classes): Window) {
    let per_step = |d: Duration| d.as_secs_f64() * 1e3 / STEPS.measured as f64;
    let step = per_step(wall);
    // A step that faults in thousands of pages is getting fresh memory from the kernel
    // for buffers the last step freed (host_tuning.rs says why that costs).
    let faults = faults.map_or("unknown".into(), |f| {
        (f / STEPS.measured as u64).to_string()
    });
    println!(
        "profile model={model} strategy={strategy} world={world} step_ms={step:.1} \
         page_faults_per_step={faults}"
    );
    let per_rank = |d: Duration| per_step(d) / world as f64;
    let mut held = 0.0;
    for (group, members) in GROUPS {
        // Summed from +0.0: an empty float sum is -0.0.
        let ms = classes
            .iter()
            .filter(|(c, _, _)| members.contains(c))
            .fold(0.0, |ms, (_, t, _)| ms + per_rank(*t));
        held += ms;
        println!(
            "profile model={model} strategy={strategy} world={world} class={group} ms={ms:.1} share={:.3}",
            ms / step
        );
    }
    let other = step - held;
    println!(
        "profile model={model} strategy={strategy} world={world} class=other ms={other:.1} share={:.3}",
        other / step
    );
    // The profiler's own classes, for what `other` and the groups hold.
    let detail: Vec<String> = classes
        .iter()
        .map(|(c, t, n)| {
            format!(
                "{c}:{:.1}ms/{}",
                per_rank(*t),
                *n as usize / STEPS.measured / world
            )
        })
        .collect();
    println!(
        "# {model} {strategy} W={world}, per step and rank (time/calls): {}",
        detail.join(" ")
    );
}

/// The best of five runs of `f`, after one to warm up.
fn best(mut f: impl FnMut() -> candle_core::Result<()>) -> anyhow::Result<f64> {
    f()?;
    let mut best = f64::MAX;
    for _ in 0..5 {
        let start = Instant::now();
        f()?;
        best = best.min(start.elapsed().as_secs_f64());
    }
    Ok(best)
}

/// Each linear layer's three matmuls alone (forward `x·Wᵀ`, backward `g·W` and `xᵀ·g`, as
/// candle's backward runs them), at `rows` rows: GFLOP/s each and over the peak; returns
/// the seconds all of them take per step.
fn matmuls_alone(
    model: &str,
    rows: usize,
    linears: &[(usize, usize, usize)],
    peak: f64,
) -> anyhow::Result<f64> {
    let mut total = 0.0;
    for &(input, output, count) in linears {
        let x = Tensor::randn(0f32, 1.0, (rows, input), &Device::Cpu)?;
        let w = Tensor::randn(0f32, 1.0, (output, input), &Device::Cpu)?;
        let g = Tensor::randn(0f32, 1.0, (rows, output), &Device::Cpu)?;
        let flops = 2.0 * (rows * input * output) as f64 / 1e9;
        let forward = best(|| x.matmul(&w.t()?).map(|_| ()))?;
        let data = best(|| g.matmul(&w).map(|_| ()))?;
        let weight = best(|| x.t()?.matmul(&g).map(|_| ()))?;
        total += count as f64 * (forward + data + weight);
        println!(
            "matmul model={model} rows={rows} in={input} out={output} per_step={count} \
             forward_gflops={:.1} backward_data_gflops={:.1} backward_weight_gflops={:.1} \
             of_peak={:.2}/{:.2}/{:.2}",
            flops / forward,
            flops / data,
            flops / weight,
            flops / forward / peak,
            flops / data / peak,
            flops / weight / peak,
        );
    }
    println!(
        "matmul model={model} alone_ms_per_step={:.1} (every linear's three matmuls, all cores)",
        total * 1e3
    );
    Ok(total)
}

/// The `--profile` rows: the GPT at d_model 512 and the Llama, each under `single` and
/// fsdp full_shard at W=2, after their matmul shapes alone and the peak.
pub fn profile_rows(peak: f64, models: &[String], strategies: &[String]) -> anyhow::Result<()> {
    let model_wanted = |model: &str| models.iter().any(|m| m == model);
    let wanted = |model: &str, strategy: &str| {
        model_wanted(model) && strategies.iter().any(|s| s == strategy)
    };
    println!("peak_gflops={peak:.1}");
    let c = config(512);
    let d = c.d_model;
    let gpt_linears = [
        (d, 3 * d, c.n_layer),
        (d, d, c.n_layer),
        (d, 4 * d, c.n_layer),
        (4 * d, d, c.n_layer),
        (d, c.vocab, 1),
    ];
    let (h, kv, m, layers) = (512, 256, 1408, 4);
    let llama_linears = [
        (h, h, 2 * layers),
        (h, kv, 2 * layers),
        (h, m, 2 * layers),
        (m, h, layers),
        (h, 8192, 1),
    ];
    // The matmuls alone first: the first accelerator keeps Candle's own pool to one thread
    // for the rest of the process.
    if model_wanted("gpt-d512") {
        matmuls_alone("gpt-d512", BATCH * c.block, &gpt_linears, peak)?;
    }
    if model_wanted("llama") {
        matmuls_alone(
            "llama",
            crate::LLAMA_BATCH * crate::LLAMA_SEQ,
            &llama_linears,
            peak,
        )?;
    }
    let gpt_data = DataLoader::new(crate::data(&c, STEPS), BATCH);
    for (name, world) in [("single", 1), ("fsdp_full_shard", 2), ("ddp", 2)] {
        if !wanted("gpt-d512", name) {
            continue;
        }
        let strategy = match name {
            "fsdp_full_shard" => Fsdp::new(FsdpSharding::FullShard).build(),
            n => strategy_by_name(n)?,
        };
        let window = profiled(CharGpt::new(c, LR), &gpt_data, strategy, world)?;
        report("gpt-d512", name, world, window);
    }
    let llama = llama_data(STEPS);
    for (name, world) in [("single", 1), ("fsdp_full_shard", 2)] {
        if !wanted("llama", name) {
            continue;
        }
        let strategy = match name {
            "fsdp_full_shard" => Fsdp::new(FsdpSharding::FullShard).build(),
            n => strategy_by_name(n)?,
        };
        let window = profiled(llama_model()?, &llama, strategy, world)?;
        report("llama", name, world, window);
    }
    Ok(())
}

/// The process's minor page faults so far (`/proc/self/stat`'s tenth field), where there is
/// a /proc.
fn minor_faults() -> Option<u64> {
    let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
    // The fields after the command's name, which is in parentheses and may hold spaces.
    let after_name = &stat[stat.rfind(')')? + 1..];
    after_name.split_whitespace().nth(7)?.parse().ok()
}
