//! The model families against Hugging Face `transformers` on the same weights and batches
//! (tests/fixtures/hf, made by scripts/hf_fixtures.py): logits, loss and every gradient,
//! then 10 AdamW steps under every strategy; the tokenizer's ids against the Python one.

use candle_core::{DType, Device, Tensor};
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use wick::core::{Algorithm, Callback, OptimizerConfig, RunState, SoloWorld, Strategy};
use wick::models::{CausalLm, TextTokenizer};
use wick::strategies::{strategy_by_name, Fsdp, FsdpSharding, Precision};
use wick::trainer::{Attached, DataLoader, Dataset, Trainer};

/// The fixtures' folder.
fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/hf")
}

/// What `transformers` computed for the model in folder `family`.
fn reference(family: &str) -> HashMap<String, Tensor> {
    candle_core::safetensors::load(
        fixtures().join(family).join("reference.safetensors"),
        &Device::Cpu,
    )
    .unwrap()
}

/// The fixture's windows of 33 tokens, in order: global batch b is windows 4b..4b+4.
struct Windows(Tensor);

impl Windows {
    fn of(reference: &HashMap<String, Tensor>) -> Self {
        Windows(reference["windows"].to_dtype(DType::U32).unwrap())
    }
}

impl Dataset for Windows {
    type Batch = (Tensor, Tensor);
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
        Ok((
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

fn max_diff(a: &Tensor, b: &Tensor) -> f32 {
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

fn pretrained(family: &str, optimizer: OptimizerConfig) -> CausalLm {
    CausalLm::from_pretrained(fixtures().join(family))
        .unwrap()
        .with_optimizer(optimizer)
}

/// The model's parameters made on one CPU rank, outside a trainer.
fn on_one_cpu(model: &mut CausalLm) -> Box<dyn Strategy> {
    let mut single = strategy_by_name("single").unwrap();
    single.connect(Arc::new(SoloWorld), Device::Cpu).unwrap();
    wick::accelerator::Accelerator::setup(single.as_mut(), model, 0).unwrap();
    single
}

fn trainer(devices: usize, strategy: Box<dyn Strategy>, steps: usize) -> Trainer {
    Trainer::builder()
        .devices(devices)
        .strategy_instance(strategy)
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
const FAMILIES: [&str; 8] = [
    "llama", "llama3", "smollm2", "mistral", "qwen2", "qwen3", "gemma2", "gpt2",
];

#[test]
fn logits_and_loss_match_transformers() {
    for family in FAMILIES {
        let r = reference(family);
        let mut model = pretrained(family, OptimizerConfig::adamw(1e-3));
        let _strategy = on_one_cpu(&mut model);
        let (ids, targets) = loader(&r)
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
fn plain_sgd() -> OptimizerConfig {
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
            t.fit(
                &mut Attached::new(pretrained(family, plain_sgd())),
                &loader(&r),
                None,
            )
            .unwrap();
            let mut worst = 0f32;
            for (param, after) in t.full_parameters().unwrap() {
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
struct Losses(Arc<Mutex<Vec<f64>>>);

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

/// Trains `family` 10 steps; returns the losses and the final parameters by name.
fn ten_steps(
    family: &str,
    devices: usize,
    strategy: Box<dyn Strategy>,
) -> (Vec<f64>, Vec<(String, Tensor)>) {
    let r = reference(family);
    let losses = Losses::default();
    let mut t = Trainer::builder()
        .devices(devices)
        .strategy_instance(strategy)
        .max_steps(10)
        .no_logger()
        .progress(false)
        .model_summary(false)
        .callback(losses.clone())
        .build()
        .unwrap();
    t.fit(
        &mut Attached::new(pretrained(family, OptimizerConfig::adamw(1e-3))),
        &loader(&r),
        None,
    )
    .unwrap();
    let seen = losses.0.lock().unwrap().clone();
    (seen, t.full_parameters().unwrap())
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
        let bf16 = Precision::Bf16Mixed.mixed();
        let fsdp = Fsdp::new(FsdpSharding::FullShard)
            .with_precision(bf16)
            .unwrap();
        let (losses, params) = ten_steps(family, 2, fsdp.build());
        let param_diff = params
            .iter()
            .map(|(n, p)| max_diff(p, &r[&format!("final.{n}")]))
            .fold(0f32, f32::max);
        let want = r["steps.losses"].to_vec1::<f32>().unwrap();
        let loss_diff = losses
            .iter()
            .zip(&want)
            .map(|(a, b)| (*a as f32 - b).abs())
            .fold(0f32, f32::max);
        println!(
            "{family} bf16-mixed: losses within {loss_diff:e}, parameters within {param_diff:e}"
        );
        // The mixed-precision tests' bound on parameters, and real 16-bit compute.
        assert!(
            param_diff <= 1e-2,
            "{family}: parameters differ by {param_diff}"
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
    let (ids, _) = loader(r)
        .dataset()
        .batch(&[0, 1, 2, 3], &Device::Cpu)
        .unwrap();
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

/// `config.json` of a published checkpoint of each family, as the hub serves it, and its
/// parameter count as `transformers` 5.24 builds it (`AutoModelForCausalLM.from_config` on
/// the meta device).
const PUBLISHED: [(&str, usize); 7] = [
    ("llama-3.2-1b", 1_235_814_400),
    ("smollm2-135m", 134_515_008),
    ("mistral-7b-v0.1", 7_241_732_096),
    ("qwen2.5-0.5b", 494_032_768),
    ("qwen3-0.6b", 596_049_920),
    ("gemma-2-2b", 2_614_341_888),
    ("gpt2", 124_439_808),
];

#[test]
fn published_configs_of_every_family_load_with_their_parameter_counts() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/configs");
    for (name, parameters) in PUBLISHED {
        let path = dir.join(format!("{name}.json"));
        let text = std::fs::read_to_string(&path).unwrap();
        let (config, unknown) = wick::models::ModelConfig::read_json(&text, &path)
            .unwrap_or_else(|e| panic!("{name}: {e}"));
        assert!(unknown.is_empty(), "{name}: fields not known: {unknown:?}");
        assert_eq!(config.num_parameters(), parameters, "{name}");
    }
    let read = |name: &str| {
        let path = dir.join(format!("{name}.json"));
        match wick::models::ModelConfig::from_file(&path).unwrap() {
            wick::models::ModelConfig::Decoder(c) => c,
            other => panic!("{other:?}"),
        }
    };
    use wick::models::{Family, RopeScaling};
    let llama = read("llama-3.2-1b");
    assert!(matches!(llama.rope.scaling, RopeScaling::Llama3 { factor, .. } if factor == 32.0));
    assert!(llama.tie_word_embeddings);
    // Qwen2.5's window is off (use_sliding_window false), its q/k/v have biases, o none.
    let qwen = read("qwen2.5-0.5b");
    assert!(qwen.layer_windows.iter().all(Option::is_none));
    assert!(qwen.qkv_bias && !qwen.o_bias);
    let mistral = read("mistral-7b-v0.1");
    assert!(mistral.layer_windows.iter().all(|w| *w == Some(4096)));
    let gemma = read("gemma-2-2b");
    assert_eq!(gemma.family, Family::Gemma2);
    assert_eq!(gemma.layer_windows[..2], [Some(4096), None]);
    assert_eq!(gemma.attention_scale, 1.0 / 16.0);
    assert_eq!(gemma.final_logit_softcapping, Some(30.0));
    let qwen3 = read("qwen3-0.6b");
    assert!(qwen3.qk_norm && qwen3.head_dim == 128 && qwen3.hidden_size == 1024);
}

#[test]
fn config_fields_that_change_the_math_are_refused_by_name() {
    let base: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(fixtures().join("llama/config.json")).unwrap(),
    )
    .unwrap();
    let with = |key: &str, value: serde_json::Value| {
        let mut c = base.clone();
        c[key] = value;
        wick::models::ModelConfig::read_json(&c.to_string(), Path::new("config.json"))
            .map(|(_, unknown)| unknown)
            .map_err(|e| e.to_string())
    };
    assert_eq!(with("use_cache", false.into()), Ok(vec![]));
    // A field wick does not know is ignored, as transformers ignores it, and named.
    assert_eq!(
        with("frobnication", 1.into()),
        Ok(vec!["frobnication".to_string()])
    );
    for (key, value, needle) in [
        (
            "rope_scaling",
            serde_json::json!({"rope_type": "longrope", "factor": 2.0}),
            "longrope",
        ),
        ("partial_rotary_factor", 0.5.into(), "partial_rotary_factor"),
        ("rope_interleaved", true.into(), "rope_interleaved"),
        ("use_mrope", true.into(), "use_mrope"),
        ("sliding_window", 4096.into(), "sliding_window"),
        ("hidden_act", "gelu".into(), "hidden_act"),
        ("num_key_value_heads", 3.into(), "num_key_value_heads"),
        (
            "rope_parameters",
            serde_json::json!({"rope_type": "llama3", "factor": 8.0, "rope_theta": 1e4}),
            "low_freq_factor",
        ),
        ("rope_theta", 5e5.into(), "differ"),
    ] {
        let e = with(key, value)
            .err()
            .unwrap_or_else(|| panic!("{key} was accepted"));
        assert!(
            e.contains("config.json") && e.contains(needle),
            "{key}: {e}"
        );
    }
    // Older transformers write rope_theta itself.
    let mut old = base.clone();
    old.as_object_mut().unwrap().remove("rope_parameters");
    old["rope_theta"] = 500000.0.into();
    match wick::models::ModelConfig::from_json(&old.to_string(), Path::new("config.json")).unwrap()
    {
        wick::models::ModelConfig::Decoder(c) => assert_eq!(c.rope.theta, 500000.0),
        other => panic!("{other:?}"),
    }
}

/// A config of `family` shape, tiny but for a real vocabulary, its embedding tied.
fn tied_config(family: &str, vocab: usize) -> String {
    match family {
        "gpt2" => serde_json::json!({
            "model_type": "gpt2", "vocab_size": vocab, "n_embd": 8, "n_layer": 1, "n_head": 2,
            "n_positions": 16, "resid_pdrop": 0.0, "embd_pdrop": 0.0, "attn_pdrop": 0.0,
        }),
        _ => serde_json::json!({
            "model_type": family, "vocab_size": vocab, "hidden_size": 8,
            "intermediate_size": 12, "num_hidden_layers": 1, "num_attention_heads": 2,
            "num_key_value_heads": 1, "head_dim": 4, "max_position_embeddings": 16,
            "tie_word_embeddings": true,
        }),
    }
    .to_string()
}

#[test]
fn tied_embeddings_of_vocabularies_that_do_not_divide_by_w_train_every_row() {
    // GPT-2's 50257 and Qwen's 151936 rows over 2, 3 and 4 ranks: the flat shards split
    // inside the tied table, and the last rows (on the last rank) must train as on one
    // device. Inputs and targets use the last ids, so those rows get gradient both ways.
    for (family, vocab) in [("gpt2", 50257usize), ("qwen2", 151936)] {
        let last = vocab as u32 - 1;
        let ids: Vec<u32> = (0..12 * 9).map(|i| last - (i * 7919) % 64).collect();
        let windows = Windows(Tensor::from_vec(ids, (12, 9), &Device::Cpu).unwrap());
        let text = tied_config(family, vocab);
        let run_at = |lr: f64, devices: usize, strategy: Box<dyn Strategy>| {
            let model = CausalLm::from_config_json(text.clone(), Path::new("config.json"))
                .unwrap()
                .with_optimizer(OptimizerConfig::adamw(lr));
            let mut t = trainer(devices, strategy, 2);
            let loader = DataLoader::new(Windows(windows.0.clone()), 12).without_shuffle();
            t.fit(&mut Attached::new(model), &loader, None).unwrap();
            t.full_parameters().unwrap()
        };
        let run = |devices: usize, strategy: Box<dyn Strategy>| run_at(1e-2, devices, strategy);
        let single = run(1, strategy_by_name("single").unwrap());
        let embedding = |params: &[(String, Tensor)]| {
            params
                .iter()
                .find(|(n, _)| n.ends_with("wte.weight") || n.ends_with("embed_tokens.weight"))
                .unwrap()
                .1
                .clone()
        };
        let want = embedding(&single);
        assert_eq!(want.dims(), [vocab, 8]);
        let tail = |t: &Tensor| t.narrow(0, vocab - 64, 64).unwrap();
        // The last rows moved on one device: trained, not merely equal (a rate of 0 keeps
        // the init).
        let initial = embedding(&run_at(0.0, 1, strategy_by_name("single").unwrap()));
        let moved = max_diff(&tail(&initial), &tail(&want));
        assert!(
            moved > 1e-3,
            "{family}: the last rows did not train ({moved})"
        );
        for w in [2, 3, 4] {
            for (name, strategy) in [
                ("zero3", strategy_by_name("zero3").unwrap()),
                ("fsdp", Fsdp::new(FsdpSharding::FullShard).build()),
            ] {
                let got = embedding(&run(w, strategy));
                let diff = max_diff(&got, &want);
                let tail_diff = max_diff(&tail(&got), &tail(&want));
                println!("{family} {vocab} {name} W={w}: embedding within {diff:e} (last rows {tail_diff:e})");
                assert!(
                    diff <= 1e-6,
                    "{family} {name} W={w}: embedding differs by {diff}"
                );
            }
        }
    }
}
