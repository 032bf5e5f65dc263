//! LoRA: the base weights frozen (no gradient, no optimizer state) under every strategy,
//! frozen and trainable weights in the same unit, the adapters equal to one device's,
//! dropout masks the same however a unit runs, a resume bit-identical.

use crate::checkpoint::saved_state;
use crate::common::relative_update_error;
use crate::models::{fixtures, max_diff, on_one_cpu, trainer, Windows};
use candle_core::{DType, Device, Tensor};
use std::collections::HashMap;
use tempfile::TempDir;
use wick::core::{ActivationCheckpointing, OptimizerConfig, Strategy};
use wick::models::{CausalLm, LoraConfig, DECODER_TARGETS};
use wick::strategies::{strategy_by_name, Fsdp, FsdpSharding, Precision, Zero3};
use wick::trainer::{Attached, DataLoader, Dataset, ModelCheckpoint, Trainer};

/// Every linear layer of a block adapted, rank 4, alpha 8: 2x scale.
fn lora(dropout: f64) -> LoraConfig {
    LoraConfig {
        rank: 4,
        alpha: 8.0,
        dropout,
        targets: DECODER_TARGETS.iter().map(|t| t.to_string()).collect(),
    }
}

/// The Qwen2 fixture (q/k/v biases, a tied embedding, a sliding layer) under LoRA.
fn model(dropout: f64) -> CausalLm {
    CausalLm::from_pretrained(fixtures().join("qwen2"))
        .unwrap()
        .with_optimizer(OptimizerConfig::adamw(1e-3))
        .with_lora(lora(dropout))
        .unwrap()
}

fn loader() -> DataLoader<Windows> {
    let reference = candle_core::safetensors::load(
        fixtures().join("qwen2/reference.safetensors"),
        &Device::Cpu,
    )
    .unwrap();
    // 12 windows a step: the batch splits over 2, 3 and 4 ranks alike.
    DataLoader::new(
        Windows(reference["windows"].to_dtype(DType::U32).unwrap()),
        12,
    )
    .without_shuffle()
}

/// The parameters after `steps` steps on `devices` ranks, and the trained module.
fn train(
    devices: usize,
    strategy: Box<dyn Strategy>,
    dropout: f64,
    steps: usize,
) -> (HashMap<String, Tensor>, Attached<CausalLm>) {
    let mut t = trainer(devices, strategy, steps);
    let mut m = Attached::new(model(dropout));
    t.fit(&mut m, &loader(), None).unwrap();
    let params = t.full_parameters(&mut m).unwrap().into_iter().collect();
    (params, m)
}

fn fsdp(sharding: FsdpSharding) -> Box<dyn Strategy> {
    Fsdp::new(sharding).build()
}

fn worst(a: &HashMap<String, Tensor>, b: &HashMap<String, Tensor>) -> f32 {
    assert_eq!(a.len(), b.len());
    a.iter()
        .map(|(n, t)| max_diff(t, &b[n]))
        .fold(0.0, f32::max)
}

#[test]
fn lora_trains_only_its_adapters_and_every_strategy_matches_one_device() {
    let base =
        candle_core::safetensors::load(fixtures().join("qwen2/model.safetensors"), &Device::Cpu)
            .unwrap();
    let (single, m) = train(1, strategy_by_name("single").unwrap(), 0.0, 3);
    let adapters: usize = single
        .iter()
        .filter(|(n, _)| LoraConfig::is_adapter(n))
        .map(|(_, t)| t.elem_count())
        .sum();
    // 2 layers x 7 layers adapted x (A and B).
    assert_eq!(
        single.keys().filter(|n| LoraConfig::is_adapter(n)).count(),
        28
    );
    assert_eq!(m.num_parameters(), Some(adapters));
    // The adapters the model builds are those LoraConfig describes for its config.
    let mut built: Vec<(String, Vec<usize>)> = single
        .iter()
        .filter(|(n, _)| LoraConfig::is_adapter(n))
        .map(|(n, t)| (n.clone(), t.dims().to_vec()))
        .collect();
    let mut described = lora(0.0).adapter_shapes(model(0.0).config());
    built.sort();
    described.sort();
    assert_eq!(built, described);
    // One device: gradients and AdamW's two moments for the adapters only.
    let bytes = m.state_bytes().unwrap();
    assert_eq!((bytes.grads, bytes.optimizer), (4 * adapters, 8 * adapters));
    let frozen: usize = base.values().map(Tensor::elem_count).sum();
    assert_eq!(bytes.params, 4 * (adapters + frozen));
    for (name, value) in &single {
        match base.get(name) {
            // Frozen: exactly the pretrained weight.
            Some(w) => assert_eq!(max_diff(value, w), 0.0, "{name} moved"),
            None => assert!(
                LoraConfig::is_adapter(name),
                "{name}: neither base nor adapter"
            ),
        }
    }
    let moved = |part: &str| {
        single
            .iter()
            .filter(|(n, _)| n.contains(part))
            .map(|(_, t)| {
                t.abs()
                    .unwrap()
                    .max_all()
                    .unwrap()
                    .to_scalar::<f32>()
                    .unwrap()
            })
            .fold(f32::INFINITY, f32::min)
    };
    assert!(moved(".lora_B.") > 1e-4, "B stayed at zero somewhere");
    let cases: [(usize, &str, Box<dyn Strategy>); 12] = [
        (2, "ddp", strategy_by_name("ddp").unwrap()),
        (3, "ddp", strategy_by_name("ddp").unwrap()),
        (3, "zero1", strategy_by_name("zero1").unwrap()),
        (2, "zero2", strategy_by_name("zero2").unwrap()),
        (3, "zero3", strategy_by_name("zero3").unwrap()),
        (
            3,
            "zero3 prefetch",
            Box::new(Zero3::new().with_prefetch(true)),
        ),
        (2, "fsdp full_shard", fsdp(FsdpSharding::FullShard)),
        (3, "fsdp shard_grad_op", fsdp(FsdpSharding::ShardGradOp)),
        (
            3,
            "fsdp shard_grad_op, recomputed",
            Fsdp::new(FsdpSharding::ShardGradOp)
                .with_activation_checkpointing(ActivationCheckpointing::Full)
                .build(),
        ),
        (4, "ddp", strategy_by_name("ddp").unwrap()),
        (4, "fsdp hybrid_shard/2", fsdp(FsdpSharding::HybridShard)),
        (2, "fsdp no_shard", fsdp(FsdpSharding::NoShard)),
    ];
    // ddp at each world size: what the sharded strategies must equal there to the bit's
    // neighbourhood (one device differs in the order the mean over ranks is summed, which
    // AdamW amplifies in the elements whose gradient nearly cancels).
    let mut ddp_at: HashMap<usize, HashMap<String, Tensor>> = HashMap::new();
    for (w, name, strategy) in cases {
        let (got, m) = train(w, strategy, 0.0, 3);
        let same_w = ddp_at.entry(w).or_insert_with(|| got.clone());
        let beside_ddp = worst(&got, same_w);
        // Hybrid sharding means within groups, then across them: another order of sums.
        let bound = if name.contains("hybrid") { 2e-6 } else { 1e-7 };
        assert!(beside_ddp <= bound, "{name} W={w}: {beside_ddp} from ddp");
        let diff = worst(&got, &single);
        let (worst_name, _) = got
            .iter()
            .map(|(n, t)| (n.clone(), max_diff(t, &single[n])))
            .fold((String::new(), 0.0), |a, b| if b.1 > a.1 { b } else { a });
        println!("lora {name} W={w}: within {diff:e} of one device ({worst_name})");
        assert!(diff <= 2e-6, "{name} W={w}: {diff}");
        for (n, value) in got.iter().filter(|(n, _)| !LoraConfig::is_adapter(n)) {
            assert_eq!(max_diff(value, &base[n]), 0.0, "{name} W={w}: {n} moved");
        }
        // No rank keeps gradients or optimizer state beyond the adapters' (and padding).
        let b = m.state_bytes().unwrap();
        let slack = 8 * 64;
        assert!(
            b.optimizer <= 8 * adapters + slack && b.grads <= 4 * adapters + slack,
            "{name} W={w}: {b:?} for {adapters} adapter parameters"
        );
    }
    // bf16-mixed: frozen weights gathered in bf16 beside the adapters, still never moved.
    let bf16 = Fsdp::new(FsdpSharding::FullShard)
        .with_precision(Precision::Bf16Mixed)
        .unwrap()
        .build();
    let (got, _) = train(2, bf16, 0.0, 3);
    // The B adapters start at zero: their update is their value. Bounded relative to its
    // size (a tenth), the bound sits far below what the reference moved; 16-bit compute
    // must show (not the f32 bits).
    let update_error = relative_update_error(
        got.iter().filter(|(n, _)| n.contains(".lora_B.")),
        |n| single.get(n).cloned(),
        |n| single.get(n).map(|t| t.zeros_like().unwrap()),
    );
    let diff = worst(&got, &single);
    println!(
        "lora fsdp full_shard bf16-mixed W=2: the B adapters' update within {update_error:e} \
         of its size, parameters within {diff:e} of one device in f32"
    );
    assert!(
        update_error <= 0.1 && diff > 0.0,
        "bf16-mixed: {update_error}, {diff}"
    );
    for (n, value) in got.iter().filter(|(n, _)| !LoraConfig::is_adapter(n)) {
        assert_eq!(max_diff(value, &base[n]), 0.0, "bf16-mixed: {n} moved");
    }
}

#[test]
fn lora_dropout_masks_are_the_same_however_a_unit_runs_and_a_resume_continues_exactly() {
    // Masks depend on the rank and the batch, not on how the unit is run: kept activations,
    // recomputed ones (activation checkpointing) and ddp's plain graph agree.
    let (ddp, _) = train(2, strategy_by_name("ddp").unwrap(), 0.1, 3);
    let (no_dropout, _) = train(2, strategy_by_name("ddp").unwrap(), 0.0, 3);
    assert!(worst(&ddp, &no_dropout) > 1e-4, "dropout changed nothing");
    let recomputed = Fsdp::new(FsdpSharding::FullShard)
        .with_activation_checkpointing(ActivationCheckpointing::Full)
        .build();
    for (name, strategy) in [
        ("fsdp full_shard", fsdp(FsdpSharding::FullShard)),
        ("fsdp full_shard, recomputed", recomputed),
    ] {
        let (got, _) = train(2, strategy, 0.1, 3);
        let diff = worst(&got, &ddp);
        assert!(diff <= 1e-6, "{name}: {diff}");
    }
    // A checkpoint holds the adapters and their moments, and resumes bit-identically.
    let first = TempDir::new().unwrap();
    let run = |from: Option<&std::path::Path>, root: &std::path::Path| {
        let mut t = Trainer::builder()
            .devices(2)
            .strategy("zero3")
            .max_steps(4)
            .no_logger()
            .progress(false)
            .model_summary(false)
            .checkpoint(ModelCheckpoint::new(root).every_n_steps(2))
            .build()
            .unwrap();
        let mut m = Attached::new(model(0.1));
        match from {
            Some(from) => t.fit_from(&mut m, &loader(), None, from),
            None => t.fit(&mut m, &loader(), None),
        }
        .unwrap();
        t.full_parameters(&mut m)
            .unwrap()
            .into_iter()
            .collect::<HashMap<_, _>>()
    };
    let whole = run(None, first.path());
    let saved = saved_state(&first.path().join("step-00000002"));
    assert!(!saved.is_empty());
    assert!(
        saved.iter().all(|(n, _)| LoraConfig::is_adapter(n)),
        "a checkpoint saved a frozen weight"
    );
    let second = TempDir::new().unwrap();
    let resumed = run(Some(&first.path().join("step-00000002")), second.path());
    assert_eq!(worst(&whole, &resumed), 0.0);
    assert_eq!(
        saved_state(&first.path().join("step-00000004")),
        saved_state(&second.path().join("step-00000004"))
    );
}

/// PEFT's adapter over the Qwen2 fixture (tests/fixtures/hf/lora) and what PEFT computed
/// with it.
fn peft_reference() -> HashMap<String, Tensor> {
    candle_core::safetensors::load(fixtures().join("lora/reference.safetensors"), &Device::Cpu)
        .unwrap()
}

fn with_peft_adapter(optimizer: OptimizerConfig) -> CausalLm {
    CausalLm::from_pretrained(fixtures().join("qwen2"))
        .unwrap()
        .with_optimizer(optimizer)
        .with_peft_adapter(fixtures().join("lora"))
        .unwrap()
}

#[test]
fn a_peft_adapter_gives_peft_logits_gradients_and_ten_adamw_steps() {
    let r = peft_reference();
    let windows = Windows(r_windows());
    // Logits and loss of the first batch, on one device.
    let mut t = trainer(1, strategy_by_name("single").unwrap(), 1);
    let one = wick::core::Algorithm::Sgd {
        lr: 1.0,
        momentum: 0.0,
        nesterov: false,
        weight_decay: 0.0,
    };
    let mut model = Attached::new(with_peft_adapter(OptimizerConfig::from(one)));
    let first = DataLoader::new(Windows(windows.0.narrow(0, 0, 4).unwrap()), 4).without_shuffle();
    let mut alone = with_peft_adapter(OptimizerConfig::adamw(1e-3));
    let strategy = on_one_cpu(&mut alone);
    let wick::core::TokenBatch { ids, targets, .. } =
        first.dataset().batch(&[0, 1, 2, 3], &Device::Cpu).unwrap();
    let diff = max_diff(&alone.logits(&ids).unwrap(), &r["logits"]);
    println!("peft adapter: logits within {diff:e} of PEFT's");
    assert!(diff <= 1e-5, "logits differ by {diff}");
    let loss = alone
        .loss(&ids, &targets)
        .unwrap()
        .to_scalar::<f32>()
        .unwrap();
    let want = r["loss"].to_vec1::<f32>().unwrap()[0];
    assert!((loss - want).abs() <= 1e-5, "loss {loss} vs PEFT's {want}");
    let before: HashMap<String, Tensor> = strategy.full_parameters().unwrap().into_iter().collect();
    // One SGD step at rate 1 moves each adapter by minus its gradient.
    t.fit(&mut model, &first, None).unwrap();
    let mut worst_grad = 0f32;
    for (name, after) in t.full_parameters(&mut model).unwrap() {
        match r.get(&format!("grad.{name}")) {
            Some(want) => {
                let grad = (&before[&name] - &after).unwrap();
                worst_grad = worst_grad.max(max_diff(&grad, want));
            }
            None => assert_eq!(max_diff(&before[&name], &after), 0.0, "{name} moved"),
        }
    }
    println!("peft adapter: every adapter gradient within {worst_grad:e} of PEFT's");
    assert!(worst_grad <= 1e-5, "gradients differ by {worst_grad}");
    // 10 AdamW steps of the adapters, on one device and sharded.
    for (name, w, strategy) in [
        ("single", 1, strategy_by_name("single").unwrap()),
        ("fsdp full_shard", 2, fsdp(FsdpSharding::FullShard)),
        ("zero2", 4, strategy_by_name("zero2").unwrap()),
    ] {
        let mut t = trainer(w, strategy, 10);
        let loader = DataLoader::new(Windows(windows.0.clone()), 4).without_shuffle();
        let mut m = Attached::new(with_peft_adapter(OptimizerConfig::adamw(1e-3)));
        t.fit(&mut m, &loader, None).unwrap();
        let diff = t
            .full_parameters(&mut m)
            .unwrap()
            .iter()
            .filter_map(|(n, p)| Some(max_diff(p, r.get(&format!("final.{n}"))?)))
            .fold(0f32, f32::max);
        println!("peft adapter, {name} W={w}: 10 AdamW steps within {diff:e} of PEFT's");
        assert!(diff <= 1e-5, "{name} W={w}: {diff}");
    }
}

/// The Qwen2 fixture's windows (those PEFT's reference was computed on).
fn r_windows() -> Tensor {
    candle_core::safetensors::load(fixtures().join("qwen2/reference.safetensors"), &Device::Cpu)
        .unwrap()["windows"]
        .to_dtype(DType::U32)
        .unwrap()
}
