//! `wick fit --model DIR --lora-rank R`: a LoRA fine-tune whose checkpoints hold the
//! adapters only, resumed bit-identically, validated and sampled over the base model, and
//! exported as PEFT's adapter directory and as merged weights that give the same logits.

use super::{hf_fixture, prepare, tensors, val_loss, wick};
use candle_core::{Device, Tensor};
use std::path::Path;
use wick::models::{CausalLm, LoraConfig, PEFT_PREFIX};

/// The logits of the first 32 token ids under `model`, on one CPU rank.
fn logits(mut model: CausalLm) -> Tensor {
    let single = wick::strategies::strategy_by_name("single").unwrap();
    let world = std::sync::Arc::new(wick::core::SoloWorld);
    let _rank =
        wick::core::configure_rank(single.as_ref(), world, Device::Cpu, 0, &mut model).unwrap();
    let ids: Vec<u32> = (0..32u32).map(|i| (i * 37) % 384).collect();
    model
        .logits(&Tensor::from_vec(ids, (1, 32), &Device::Cpu).unwrap())
        .unwrap()
}

fn max_diff(a: &Tensor, b: &Tensor) -> f32 {
    (a - b)
        .unwrap()
        .abs()
        .unwrap()
        .max_all()
        .unwrap()
        .to_scalar()
        .unwrap()
}

#[test]
fn a_lora_fine_tune_saves_adapters_resumes_and_exports_as_peft_and_merged() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let model = hf_fixture("qwen2");
    let (ok, out, err) = prepare(d, &model);
    assert!(ok, "{out}{err}");
    let fit = |extra: &[&str]| {
        let mut args = vec![
            "fit",
            "--model",
            &model,
            "--data",
            "tokens.safetensors",
            "--seq",
            "32",
            "--batch-size",
            "4",
            "--max-steps",
            "4",
            "--val-every",
            "2",
            "--save-every",
            "2",
            "--no-progress",
            "--run-name",
            "lora",
            "--checkpoint-dir",
            "ck",
            "--lr",
            "1e-2",
            "--lora-rank",
            "4",
            "--lora-alpha",
            "16",
            "--lora-dropout",
            "0.05",
            "--lora-targets",
            "q_proj,v_proj,down_proj",
        ];
        args.extend_from_slice(extra);
        let (ok, out, err) = wick(d, &args);
        assert!(ok, "{out}{err}");
    };
    fit(&[]);
    let losses = || -> Vec<String> {
        std::fs::read_to_string(d.join("runs/lora/metrics.csv"))
            .unwrap()
            .lines()
            .map(|l| l.split(',').take(3).collect::<Vec<_>>().join(","))
            .collect()
    };
    let first = losses();
    // The checkpoint holds the adapters (2 layers x 3 targets x A, B), not the base model.
    let saved = wick::trainer::Checkpoint::open(d.join("ck/last")).unwrap();
    let names: Vec<&str> = saved.parameters().map(|(n, _)| n).collect();
    assert_eq!(names.len(), 12, "{names:?}");
    assert!(names.iter().all(|n| LoraConfig::is_adapter(n)), "{names:?}");
    // Resumed at step 2 under another strategy: the same losses after it.
    fit(&["--resume", "ck/step-00000002", "--strategy", "zero3"]);
    assert_eq!(first, losses(), "a resumed LoRA run differs");
    // Validated over the base model the checkpoint names, at any world size.
    let val = |devices, strategy| val_loss(d, &["ck/last"], devices, strategy);
    let (one, two) = (val("1", "single"), val("2", "fsdp"));
    assert!((one - two).abs() < 1e-5, "{one} vs {two}");
    let (ok, out, err) = wick(
        d,
        &["sample", "ck/last", "--prompt", "The ", "--tokens", "4"],
    );
    assert!(ok && out.starts_with("The "), "{out}{err}");

    // A plain export of a LoRA checkpoint is refused, naming the two forms.
    let (ok, _, err) = wick(d, &["export", "ck/last", "whole"]);
    assert!(
        !ok && err.contains("--adapter") && err.contains("--merge"),
        "{err}"
    );
    let (ok, out, err) = wick(d, &["export", "ck/last", "adapter", "--adapter"]);
    assert!(ok, "{out}{err}");
    let adapter = tensors(&d.join("adapter/adapter_model.safetensors"));
    assert_eq!(adapter.len(), 12);
    let q_a = format!("{PEFT_PREFIX}model.layers.0.self_attn.q_proj.lora_A.weight");
    assert!(
        adapter.iter().any(|(n, s, _)| *n == q_a && s == &[4, 32]),
        "{adapter:?}"
    );
    let config = std::fs::read_to_string(d.join("adapter/adapter_config.json")).unwrap();
    let (lora, base) =
        LoraConfig::from_peft_json(&config, Path::new("adapter_config.json")).unwrap();
    assert_eq!((lora.rank, lora.alpha, lora.dropout), (4, 16.0, 0.05));
    assert_eq!(
        Path::new(&base.unwrap()).canonicalize().unwrap(),
        Path::new(&model).canonicalize().unwrap()
    );
    let (ok, out, err) = wick(d, &["export", "ck/last", "merged", "--merge"]);
    assert!(ok, "{out}{err}");
    assert_eq!(
        tensors(&d.join("merged/model.safetensors")),
        tensors(&Path::new(&model).join("model.safetensors")),
        "the merged model's tensors are not the base model's"
    );

    // The adapter over the base and the merged weights give the same logits, which the
    // training moved away from the base model's.
    let base = CausalLm::from_pretrained(&model).unwrap();
    let with_adapter = logits(base.clone().with_peft_adapter(d.join("adapter")).unwrap());
    let merged = logits(CausalLm::from_pretrained(d.join("merged")).unwrap());
    let diff = max_diff(&with_adapter, &merged);
    println!("lora export: adapter over base vs merged logits within {diff:e}");
    assert!(diff <= 1e-5, "adapter and merged logits differ by {diff}");
    assert!(
        max_diff(&with_adapter, &logits(base)) > 1e-3,
        "training moved nothing"
    );

    // LoRA on GPT-2, whose layers it is not built for, is refused naming the family.
    let (ok, _, err) = wick(
        d,
        &[
            "fit",
            "--model",
            &hf_fixture("gpt2"),
            "--data",
            "tokens.safetensors",
            "--lora-rank",
            "4",
            "--max-steps",
            "1",
        ],
    );
    assert!(!ok && err.contains("GPT-2"), "{err}");
}

#[test]
fn a_qlora_fine_tune_is_validated_and_merged_over_its_quantized_base_under_ddp_and_fsdp() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let model = hf_fixture("qwen2");
    let (ok, out, err) = prepare(d, &model);
    assert!(ok, "{out}{err}");
    let fit_in = |format: &str, strategy: &str, run: &str, extra: &[&str]| {
        let options = "--data tokens.safetensors --seq 32 --batch-size 4 --max-steps 2 \
                       --no-progress --lora-rank 4 --devices 2";
        let mut args = vec!["fit", "--model", &model, "--strategy", strategy];
        args.extend(["--quantize-base", format]);
        args.extend(["--run-name", run]);
        args.extend(options.split_whitespace());
        args.extend_from_slice(extra);
        wick(d, &args)
    };
    let fit = |strategy: &str, run: &str, extra: &[&str]| fit_in("nf4", strategy, run, extra);
    let (ok, out, err) = fit(
        "ddp",
        "ddp",
        &["--val-every", "2", "--checkpoint-dir", "ck"],
    );
    assert!(ok, "{out}{err}");
    let val_loss_of = |run: &str| -> f64 {
        let metrics = std::fs::read_to_string(d.join(format!("runs/{run}/metrics.csv"))).unwrap();
        let last = metrics.lines().nth(2).unwrap();
        last.split(',').nth(3).unwrap().parse().unwrap()
    };
    let trained = val_loss_of("ddp");
    // The checkpoint records the NF4 base: validating it reads the base as the run did.
    let validated = val_loss(d, &["ck/last"], "1", "single");
    assert!(
        (validated - trained).abs() < 1e-5,
        "{validated} vs {trained}"
    );
    // Over the f32 base (the base alone: two steps barely move the adapters) it is another
    // loss, far outside that bound.
    let over_f32 = val_loss(d, &["--model", &model], "1", "single");
    assert!((over_f32 - trained).abs() > 1e-4, "{over_f32} vs {trained}");
    // Merged into the base's decoded values: a plain model of the same loss.
    let (ok, out, err) = wick(d, &["export", "ck/last", "merged", "--merge"]);
    assert!(ok, "{out}{err}");
    let merged = val_loss(d, &["--model", "merged"], "1", "single");
    assert!((merged - trained).abs() < 1e-5, "{merged} vs {trained}");
    // fsdp shards the NF4 blocks and trains the same run (the last step's training loss);
    // in bf16 it trains too.
    let (ok, out, err) = fit("fsdp", "fsdp", &["--no-checkpoints"]);
    assert!(ok, "{out}{err}");
    let train_loss = |run: &str| -> f64 {
        let metrics = std::fs::read_to_string(d.join(format!("runs/{run}/metrics.csv"))).unwrap();
        let last = metrics.lines().nth(2).unwrap().split(',').nth(2).unwrap();
        last.parse().unwrap()
    };
    let (sharded, whole) = (train_loss("fsdp"), train_loss("ddp"));
    assert!((sharded - whole).abs() < 1e-6, "{sharded} vs {whole}");
    let bf16 = ["--no-checkpoints", "--precision", "bf16-mixed"];
    let (ok, out, err) = fit("fsdp", "bf16", &bf16);
    assert!(ok, "{out}{err}");
    // llama.cpp's Q4_K blocks, sharded by fsdp: the checkpoint records them, and validation
    // reads the base as the run did, not as NF4.
    let q4k = ["--val-every", "2", "--checkpoint-dir", "ck-q4k"];
    let (ok, out, err) = fit_in("q4_k", "fsdp", "q4k", &q4k);
    assert!(ok, "{out}{err}");
    let trained = val_loss_of("q4k");
    let record_of = |dir: &str| {
        let last = std::fs::read_to_string(d.join(dir).join("last")).unwrap();
        let record = d.join(dir).join(last.trim()).join("quantized_base.txt");
        std::fs::read_to_string(record).unwrap().trim().to_string()
    };
    assert_eq!(record_of("ck-q4k"), "q4_k");
    let validated = val_loss(d, &["ck-q4k/last"], "1", "single");
    assert!(
        (validated - trained).abs() < 1e-5,
        "{validated} vs {trained}"
    );
    assert!((validated - whole).abs() > 1e-5, "q4_k trained as nf4 did");
    // The tied embedding in NF4 too, sharded by fsdp: recorded, validated and merged as the
    // run trained over it, which is not the run over an f32 embedding.
    let embeddings = [
        "--quantize-embeddings",
        "--val-every",
        "2",
        "--checkpoint-dir",
        "ck-emb",
    ];
    let (ok, out, err) = fit("fsdp", "emb", &embeddings);
    assert!(ok, "{out}{err}");
    assert_eq!(record_of("ck-emb"), "nf4 embeddings");
    let trained = val_loss_of("emb");
    assert!((trained - val_loss_of("ddp")).abs() > 1e-5, "{trained}");
    let validated = val_loss(d, &["ck-emb/last"], "1", "single");
    assert!(
        (validated - trained).abs() < 1e-5,
        "{validated} vs {trained}"
    );
    let (ok, out, err) = wick(d, &["export", "ck-emb/last", "merged-emb", "--merge"]);
    assert!(ok, "{out}{err}");
    let merged = val_loss(d, &["--model", "merged-emb"], "1", "single");
    assert!((merged - trained).abs() < 1e-5, "{merged} vs {trained}");
    let bf16 = [
        "--quantize-embeddings",
        "--no-checkpoints",
        "--precision",
        "bf16-mixed",
    ];
    let (ok, out, err) = fit("fsdp", "emb-bf16", &bf16);
    assert!(ok, "{out}{err}");
}
