//! The model families against Hugging Face `transformers` on the same weights and batches
//! (tests/fixtures/hf, made by scripts/hf_fixtures.py): logits, loss and every gradient,
//! then 10 AdamW steps under every strategy; the tokenizer's ids against the Python one.

use crate::common::relative_update_error;
use candle_core::{DType, Device, Tensor};
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use wick::core::{
    configure_rank, Algorithm, Callback, OptimizerConfig, RankStrategy, RunState, SoloWorld,
    Strategy, TokenBatch,
};
use wick::models::{CausalLm, TextTokenizer};
use wick::strategies::{strategy_by_name, Fsdp, FsdpSharding, Precision};
use wick::trainer::{Attached, DataLoader, Dataset, Trainer, TrainerBuilder};

/// The fixtures' folder.
pub(crate) fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/hf")
}

/// What `transformers` computed for the model in folder `family`.
pub(crate) fn reference(family: &str) -> HashMap<String, Tensor> {
    candle_core::safetensors::load(
        fixtures().join(family).join("reference.safetensors"),
        &Device::Cpu,
    )
    .unwrap()
}

/// The fixture's windows of 33 tokens, in order: global batch b is windows 4b..4b+4.
pub(crate) struct Windows(pub(crate) Tensor);

impl Windows {
    fn of(reference: &HashMap<String, Tensor>) -> Self {
        Windows(reference["windows"].to_dtype(DType::U32).unwrap())
    }
}

impl Dataset for Windows {
    type Batch = TokenBatch;
    fn len(&self) -> usize {
        self.0.dim(0).unwrap()
    }
    fn batch(&self, idx: &[usize], dev: &Device) -> candle_core::Result<Self::Batch> {
        let idx = Tensor::new(
            idx.iter().map(|&i| i as u32).collect::<Vec<_>>(),
            &Device::Cpu,
        )?;
        let rows = self.0.index_select(&idx, 0)?;
        let seq = rows.dim(1)? - 1;
        Ok(TokenBatch::new(
            rows.narrow(1, 0, seq)?.contiguous()?.to_device(dev)?,
            rows.narrow(1, 1, seq)?.contiguous()?.to_device(dev)?,
        ))
    }
    fn tokens_per_sample(&self) -> usize {
        self.0.dim(1).unwrap() - 1
    }
}

fn loader(reference: &HashMap<String, Tensor>) -> DataLoader<Windows> {
    DataLoader::new(Windows::of(reference), 4).without_shuffle()
}

pub(crate) fn max_diff(a: &Tensor, b: &Tensor) -> f32 {
    assert_eq!(a.dims(), b.dims());
    (a - b)
        .unwrap()
        .abs()
        .unwrap()
        .flatten_all()
        .unwrap()
        .max(0)
        .unwrap()
        .to_scalar()
        .unwrap()
}

pub(crate) fn pretrained(family: &str, optimizer: OptimizerConfig) -> CausalLm {
    CausalLm::from_pretrained(fixtures().join(family))
        .unwrap()
        .with_optimizer(optimizer)
}

/// The model's parameters made on one CPU rank, outside a trainer.
pub(crate) fn on_one_cpu(model: &mut CausalLm) -> Box<dyn RankStrategy> {
    let single = strategy_by_name("single").unwrap();
    let world = Arc::new(SoloWorld);
    configure_rank(single.as_ref(), world, Device::Cpu, 0, model).unwrap()
}

pub(crate) fn trainer(devices: usize, strategy: Box<dyn Strategy>, steps: usize) -> Trainer {
    Trainer::builder()
        .devices(devices)
        .strategy(strategy)
        .max_steps(steps)
        .no_logger()
        .progress(false)
        .model_summary(false)
        .build()
        .unwrap()
}

/// Every family's fixture: Llama 2, Llama 3.x (its rope), SmolLM2, Mistral (a window
/// shorter than the sequence), Qwen2 (biases, one sliding layer), Qwen3 (q/k norms, a head
/// width of its own), Gemma 2 (its norms, scaled embeddings, soft caps, sliding layers),
/// GPT-2.
pub(crate) const FAMILIES: [&str; 8] = [
    "llama", "llama3", "smollm2", "mistral", "qwen2", "qwen3", "gemma2", "gpt2",
];

#[test]
fn logits_and_loss_match_transformers() {
    for family in FAMILIES {
        let r = reference(family);
        let mut model = pretrained(family, OptimizerConfig::adamw(1e-3));
        let _strategy = on_one_cpu(&mut model);
        let TokenBatch { ids, targets, .. } = loader(&r)
            .dataset()
            .batch(&[0, 1, 2, 3], &Device::Cpu)
            .unwrap();
        let logits = model.logits(&ids).unwrap();
        let diff = max_diff(&logits, &r["logits"]);
        println!("{family}: logits within {diff:e} of transformers");
        assert!(diff <= 1e-5, "{family}: logits differ by {diff}");
        let loss = model
            .loss(&ids, &targets)
            .unwrap()
            .to_scalar::<f32>()
            .unwrap();
        let want = r["loss"].to_vec1::<f32>().unwrap()[0];
        assert!(
            (loss - want).abs() <= 1e-5,
            "{family}: loss {loss} vs {want}"
        );
    }
}

/// One SGD step at rate 1 moves every parameter by minus its gradient.
pub(crate) fn plain_sgd() -> OptimizerConfig {
    OptimizerConfig::from(Algorithm::Sgd {
        lr: 1.0,
        momentum: 0.0,
        nesterov: false,
        weight_decay: 0.0,
    })
}

#[test]
fn every_gradient_matches_transformers_under_single_and_zero3() {
    for family in FAMILIES {
        let r = reference(family);
        let before: HashMap<String, Tensor> = candle_core::safetensors::load(
            fixtures().join(family).join("model.safetensors"),
            &Device::Cpu,
        )
        .unwrap();
        for (devices, name) in [(1, "single"), (2, "zero3")] {
            let mut t = trainer(devices, strategy_by_name(name).unwrap(), 1);
            let mut m = Attached::new(pretrained(family, plain_sgd()));
            t.fit(&mut m, &loader(&r), None).unwrap();
            let mut worst = 0f32;
            for (param, after) in t.full_parameters(&mut m).unwrap() {
                let grad = (&before[&param] - &after).unwrap();
                let diff = max_diff(&grad, &r[&format!("grad.{param}")]);
                assert!(
                    diff <= 1e-5,
                    "{family} {name}: gradient of {param} differs by {diff}"
                );
                worst = worst.max(diff);
            }
            println!("{family} {name} at W={devices}: every gradient within {worst:e}");
        }
    }
}

/// Rank 0's train_loss after each step.
#[derive(Clone, Default)]
pub(crate) struct Losses(pub(crate) Arc<Mutex<Vec<f64>>>);

impl Callback for Losses {
    fn on_train_batch_end(&mut self, state: &RunState) -> candle_core::Result<()> {
        if state.rank == 0 {
            self.0.lock().unwrap().push(state.metrics["train_loss"]);
        }
        Ok(())
    }
}

/// The strategies of the 10-step comparison, at W = 2 and 4 (and single).
fn strategies() -> Vec<(String, usize, Box<dyn Strategy>)> {
    let mut all: Vec<(String, usize, Box<dyn Strategy>)> =
        vec![("single".into(), 1, strategy_by_name("single").unwrap())];
    for w in [2, 4] {
        for name in ["ddp", "zero3"] {
            all.push((name.into(), w, strategy_by_name(name).unwrap()));
        }
        all.push((
            "fsdp full_shard".into(),
            w,
            Fsdp::new(FsdpSharding::FullShard).build(),
        ));
    }
    all
}

/// A quiet trainer of `steps` steps whose rank 0 records each step's loss in `losses`.
pub(crate) fn recording_trainer(
    devices: usize,
    strategy: Box<dyn Strategy>,
    steps: usize,
    losses: &Losses,
) -> Trainer {
    recording_builder(devices, strategy, steps, losses)
        .build()
        .unwrap()
}

/// [`recording_trainer`]'s builder, for more callbacks.
pub(crate) fn recording_builder(
    devices: usize,
    strategy: Box<dyn Strategy>,
    steps: usize,
    losses: &Losses,
) -> TrainerBuilder {
    Trainer::builder()
        .devices(devices)
        .strategy(strategy)
        .max_steps(steps)
        .no_logger()
        .progress(false)
        .model_summary(false)
        .callback(losses.clone())
}

/// Trains `family` 10 steps; returns the losses and the final parameters by name.
fn ten_steps(
    family: &str,
    devices: usize,
    strategy: Box<dyn Strategy>,
) -> (Vec<f64>, Vec<(String, Tensor)>) {
    let r = reference(family);
    let losses = Losses::default();
    let mut t = recording_trainer(devices, strategy, 10, &losses);
    let mut m = Attached::new(pretrained(family, OptimizerConfig::adamw(1e-3)));
    t.fit(&mut m, &loader(&r), None).unwrap();
    let seen = losses.0.lock().unwrap().clone();
    (seen, t.full_parameters(&mut m).unwrap())
}

#[test]
fn ten_adamw_steps_match_transformers_under_every_strategy() {
    for family in FAMILIES {
        let r = reference(family);
        let want = r["steps.losses"].to_vec1::<f32>().unwrap();
        for (name, devices, strategy) in strategies() {
            let (losses, params) = ten_steps(family, devices, strategy);
            assert_eq!(losses.len(), 10, "{family} {name}");
            let loss_diff = losses
                .iter()
                .zip(&want)
                .map(|(a, b)| (*a as f32 - b).abs())
                .fold(0f32, f32::max);
            let param_diff = params
                .iter()
                .map(|(n, p)| max_diff(p, &r[&format!("final.{n}")]))
                .fold(0f32, f32::max);
            println!(
                "{family} {name} at W={devices}: 10 losses within {loss_diff:e}, final parameters \
                 within {param_diff:e} of transformers"
            );
            assert!(
                loss_diff <= 1e-5,
                "{family} {name} W={devices}: losses differ by {loss_diff}"
            );
            assert!(
                param_diff <= 1e-4,
                "{family} {name} W={devices}: parameters differ by {param_diff}"
            );
        }
    }
}

#[test]
fn bf16_mixed_trains_close_to_transformers_f32() {
    for family in FAMILIES {
        let r = reference(family);
        let bf16 = Precision::Bf16Mixed;
        let fsdp = Fsdp::new(FsdpSharding::FullShard)
            .with_precision(bf16)
            .unwrap();
        let (losses, params) = ten_steps(family, 2, fsdp.build());
        let init = candle_core::safetensors::load(
            fixtures().join(family).join("model.safetensors"),
            &Device::Cpu,
        )
        .unwrap();
        let update_error = relative_update_error(
            params.iter().map(|(n, p)| (n, p)),
            |n| r.get(&format!("final.{n}")).cloned(),
            |n| init.get(n).cloned(),
        );
        let want = r["steps.losses"].to_vec1::<f32>().unwrap();
        let loss_diff = losses
            .iter()
            .zip(&want)
            .map(|(a, b)| (*a as f32 - b).abs())
            .fold(0f32, f32::max);
        // The reference's own movement over the 10 steps, which the bounds sit far below.
        let loss_moved = want[0] - want[9];
        println!(
            "{family} bf16-mixed: losses within {loss_diff:e} (the loss moved {loss_moved:e}), \
             the update within {update_error:e} of its size"
        );
        assert!(
            update_error <= 0.06,
            "{family}: the update differs by {update_error} of its size"
        );
        assert!(
            loss_diff <= 2e-3 && loss_moved >= 10.0 * 2e-3,
            "{family}: losses differ by {loss_diff}, moved {loss_moved}"
        );
        assert!(loss_diff > 1e-6, "{family}: bf16 matched f32 exactly");
    }
}

#[test]
fn scaled_ropes_match_transformers_over_a_2048_token_window() {
    // llama3 and yarn scale frequencies whatever the length, linear divides them, dynamic
    // rescales past max_position_embeddings (512 in its fixture): short windows hide a
    // wrong low frequency, one of 2048 tokens does not.
    for family in ["llama3", "rope_linear", "rope_dynamic", "rope_yarn"] {
        let r = reference(family);
        let window = r["long.window"].to_dtype(DType::U32).unwrap();
        let t = window.dim(1).unwrap() - 1;
        let (ids, targets) = (
            window.narrow(1, 0, t).unwrap(),
            window.narrow(1, 1, t).unwrap(),
        );
        let mut model = pretrained(family, OptimizerConfig::adamw(1e-3));
        let _strategy = on_one_cpu(&mut model);
        let logits = model.logits(&ids).unwrap();
        let tail = r["long.logits_tail"].dim(1).unwrap();
        let diff = max_diff(
            &logits.narrow(1, t - tail, tail).unwrap(),
            &r["long.logits_tail"],
        );
        let loss = model
            .loss(&ids, &targets)
            .unwrap()
            .to_scalar::<f32>()
            .unwrap();
        let want = r["long.loss"].to_vec1::<f32>().unwrap()[0];
        println!("{family}: {t} tokens, last logits within {diff:e}, loss {loss} vs {want}");
        assert!(diff <= 1e-5, "{family}: logits differ by {diff}");
        assert!(
            (loss - want).abs() <= 1e-5,
            "{family}: loss {loss} vs {want}"
        );
    }
}

#[test]
fn the_tokenizer_gives_the_python_tokenizers_ids() {
    let tok = TextTokenizer::from_file(fixtures().join("tokenizer.json")).unwrap();
    let text = std::fs::read_to_string(fixtures().join("tokenizer_ids.json")).unwrap();
    let json: serde_json::Value = serde_json::from_str(&text).unwrap();
    let want: Vec<u32> = json["ids"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_u64().unwrap() as u32)
        .collect();
    let ids = tok.encode(json["text"].as_str().unwrap()).unwrap();
    assert_eq!(ids, want);
    assert_eq!(tok.decode(&ids).unwrap(), json["text"].as_str().unwrap());
    assert_eq!(tok.end_of_text(), Some(0));
}

/// A copy of the fixture Llama whose weights are `dtype` and, with `shards`, split over
/// several files listed by `model.safetensors.index.json`.
fn rewritten_llama(dir: &Path, dtype: DType, shards: usize) -> PathBuf {
    let src = fixtures().join("llama");
    std::fs::create_dir_all(dir).unwrap();
    for f in ["config.json", "tokenizer.json"] {
        std::fs::copy(src.join(f), dir.join(f)).unwrap();
    }
    let tensors =
        candle_core::safetensors::load(src.join("model.safetensors"), &Device::Cpu).unwrap();
    let mut names: Vec<&String> = tensors.keys().collect();
    names.sort();
    let converted = |n: &String| tensors[n].to_dtype(dtype).unwrap();
    if shards == 1 {
        let all: HashMap<String, Tensor> =
            names.iter().map(|n| ((*n).clone(), converted(n))).collect();
        candle_core::safetensors::save(&all, dir.join("model.safetensors")).unwrap();
        return dir.to_path_buf();
    }
    let mut map = serde_json::Map::new();
    for (s, chunk) in names.chunks(names.len().div_ceil(shards)).enumerate() {
        let file = format!("model-{:05}-of-{shards:05}.safetensors", s + 1);
        let part: HashMap<String, Tensor> =
            chunk.iter().map(|n| ((*n).clone(), converted(n))).collect();
        candle_core::safetensors::save(&part, dir.join(&file)).unwrap();
        for n in chunk {
            map.insert((*n).clone(), file.clone().into());
        }
    }
    let index = serde_json::json!({ "metadata": {}, "weight_map": map });
    std::fs::write(dir.join("model.safetensors.index.json"), index.to_string()).unwrap();
    dir.to_path_buf()
}

/// Logits of the batch under `model`, its parameters made on one CPU rank.
fn logits_of(mut model: CausalLm, r: &HashMap<String, Tensor>) -> Tensor {
    let _strategy = on_one_cpu(&mut model);
    let ids = loader(r)
        .dataset()
        .batch(&[0, 1, 2, 3], &Device::Cpu)
        .unwrap()
        .ids;
    model.logits(&ids).unwrap()
}

#[test]
fn sharded_and_16_bit_weight_files_load() {
    let tmp = tempfile::tempdir().unwrap();
    let r = reference("llama");
    // Three f32 shards: the same model.
    let sharded = rewritten_llama(&tmp.path().join("sharded"), DType::F32, 3);
    assert!(!sharded.join("model.safetensors").exists());
    let diff = max_diff(
        &logits_of(CausalLm::from_pretrained(&sharded).unwrap(), &r),
        &r["logits"],
    );
    assert!(diff <= 1e-5, "sharded: logits differ by {diff}");
    // bf16 and f16 on disk are read as f32: the model of the rounded weights, exactly.
    for dtype in [DType::BF16, DType::F16] {
        let half = rewritten_llama(&tmp.path().join(format!("{dtype:?}")), dtype, 2);
        let widened = rewritten_llama(&tmp.path().join(format!("{dtype:?}-f32")), DType::F32, 1);
        let tensors = candle_core::safetensors::load(
            half.join("model-00001-of-00002.safetensors"),
            &Device::Cpu,
        )
        .unwrap();
        assert!(tensors.values().all(|t| t.dtype() == dtype));
        // The widened copy holds the half values as f32.
        let rounded: HashMap<String, Tensor> = candle_core::safetensors::load(
            fixtures().join("llama/model.safetensors"),
            &Device::Cpu,
        )
        .unwrap()
        .into_iter()
        .map(|(n, t)| (n, t.to_dtype(dtype).unwrap().to_dtype(DType::F32).unwrap()))
        .collect();
        candle_core::safetensors::save(&rounded, widened.join("model.safetensors")).unwrap();
        let a = logits_of(CausalLm::from_pretrained(&half).unwrap(), &r);
        let b = logits_of(CausalLm::from_pretrained(&widened).unwrap(), &r);
        assert_eq!(max_diff(&a, &b), 0.0, "{dtype:?}");
        assert!(
            max_diff(&a, &r["logits"]) > 0.0,
            "{dtype:?} weights were not rounded"
        );
    }
    // A directory without weights says what it lacks.
    std::fs::remove_file(sharded.join("model.safetensors.index.json")).unwrap();
    let e = CausalLm::from_pretrained(&sharded)
        .err()
        .unwrap()
        .to_string();
    assert!(
        e.contains("neither model.safetensors nor model.safetensors.index.json"),
        "{e}"
    );
}
