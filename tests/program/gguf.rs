//! A llama.cpp GGUF file as `--model` and `--tokenizer` (tests/fixtures/gguf/chat-llama.gguf:
//! the Llama fixture's weights in f32, the chat fixture's tokenizer and template, written as
//! llama.cpp's converter writes them by scripts/gguf_fixtures.py): every command gives what
//! it gives for the same model as a Hugging Face directory; a LoRA run over the GGUF
//! exports as a model directory and as GGUF (merged in f32 and Q8_0, and its adapter as
//! llama.cpp's adapter file); and `export --model` converts a model as it is both ways.

use super::{chat_llama, val_loss, wick};
use candle_core::quantized::gguf_file::Content;
use std::path::Path;
use std::sync::Arc;
use wick::core::{configure_rank, SoloWorld};
use wick::models::CausalLm;
use wick::strategies::strategy_by_name;

fn chat_gguf() -> String {
    format!(
        "{}/tests/fixtures/gguf/chat-llama.gguf",
        env!("CARGO_MANIFEST_DIR")
    )
}

/// The tensors of the token file at `path`.
fn token_file(path: &Path) -> Vec<(String, Vec<u32>)> {
    let mut tensors: Vec<_> = candle_core::safetensors::load(path, &candle_core::Device::Cpu)
        .unwrap()
        .into_iter()
        .map(|(name, t)| {
            let t = t.to_dtype(candle_core::DType::U32).unwrap();
            (name, t.flatten_all().unwrap().to_vec1().unwrap())
        })
        .collect();
    tensors.sort();
    tensors
}

#[test]
fn a_gguf_model_prepares_validates_chats_and_fine_tunes_as_its_directory_does() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let hf = chat_llama(d);
    let gguf = chat_gguf();
    let corpus = format!("{}/data/licenses.txt", env!("CARGO_MANIFEST_DIR"));
    let chat = format!(
        "{}/tests/fixtures/hf/chat/chat.jsonl",
        env!("CARGO_MANIFEST_DIR")
    );
    // The same ids from the GGUF's tokenizer and template as from the directory's.
    for (sub, tokenizer) in [
        ("hf", hf.join("tokenizer.json")),
        ("gguf", gguf.clone().into()),
    ] {
        let at = d.join(sub);
        std::fs::create_dir_all(&at).unwrap();
        let tokenizer = tokenizer.to_str().unwrap();
        for (out, args) in [
            ("tokens.safetensors", vec![corpus.as_str()]),
            ("chat.safetensors", vec!["--format", "jsonl", chat.as_str()]),
        ] {
            let prepare = [
                &[
                    "prepare",
                    "--tokenizer",
                    tokenizer,
                    "--output",
                    out,
                    "--no-progress",
                ][..],
                &args,
            ]
            .concat();
            let (ok, o, e) = wick(&at, &prepare);
            assert!(ok, "{o}{e}");
        }
    }
    for file in ["tokens.safetensors", "chat.safetensors"] {
        let (a, b) = (
            token_file(&d.join("hf").join(file)),
            token_file(&d.join("gguf").join(file)),
        );
        assert!(!a.is_empty());
        assert_eq!(a, b, "{file}: the GGUF's tokenizer gives other ids");
    }
    // The same loss, and the same greedy answer to a chat message.
    let hf = hf.to_str().unwrap();
    let hf_loss = val_loss(&d.join("hf"), &["--model", hf], "1", "single");
    let gguf_loss = val_loss(&d.join("gguf"), &["--model", &gguf], "2", "fsdp");
    assert!(
        (hf_loss - gguf_loss).abs() < 1e-5,
        "{hf_loss} vs {gguf_loss}"
    );
    let greedy = [
        "--chat",
        "What does the license permit?",
        "--temperature",
        "0",
        "--max-new-tokens",
        "8",
    ];
    let answer = |model: &str| {
        let (ok, out, err) = wick(d, &[&["sample", "--model", model][..], &greedy].concat());
        assert!(ok, "{out}{err}");
        out
    };
    assert_eq!(answer(hf), answer(&gguf));

    // LoRA over the GGUF: its checkpoint chats with the GGUF's template and exports merged.
    let at = d.join("gguf");
    let fit = [
        "fit",
        "--model",
        &gguf,
        "--data",
        "tokens.safetensors",
        "--seq",
        "32",
        "--batch-size",
        "4",
        "--max-steps",
        "2",
        "--val-every",
        "2",
        "--no-progress",
        "--checkpoint-dir",
        "ck",
        "--lora-rank",
        "4",
    ];
    let (ok, out, err) = wick(&at, &fit);
    assert!(ok, "{out}{err}");
    let (ok, out, err) = wick(&at, &[&["sample", "ck/last"][..], &greedy].concat());
    assert!(ok && !out.trim().is_empty(), "{out}{err}");
    let (ok, out, err) = wick(&at, &["export", "ck/last", "merged", "--merge"]);
    assert!(ok, "{out}{err}");
    for f in [
        "config.json",
        "model.safetensors",
        "tokenizer.json",
        "tokenizer_config.json",
        "chat_template.jinja",
        "generation_config.json",
    ] {
        assert!(at.join("merged").join(f).is_file(), "the export has no {f}");
    }
    let merged = at.join("merged");
    let merged_answer = answer(merged.to_str().unwrap());

    // GGUF out: the merged model in f32 reads back as the merged directory's model (the
    // reader is llama.cpp's and transformers' reading: tests/gguf.rs), in Q8_0 close to it.
    for (file, args) in [
        ("merged.gguf", vec!["--merge"]),
        ("q8_0.gguf", vec!["--merge", "--quant", "q8_0"]),
        ("adapter.gguf", vec!["--adapter"]),
    ] {
        let export = [&["export", "ck/last", file, "--gguf"][..], &args].concat();
        let (ok, out, err) = wick(&at, &export);
        assert!(ok, "{out}{err}");
    }
    let ids = [[3u32, 1, 88, 86, 264, 202, 58, 75]];
    let ids = candle_core::Tensor::new(&ids, &candle_core::Device::Cpu).unwrap();
    let want = logits(CausalLm::from_pretrained(&merged).unwrap(), &ids);
    let f32 = logits(CausalLm::from_gguf(at.join("merged.gguf")).unwrap(), &ids);
    let q8 = logits(CausalLm::from_gguf(at.join("q8_0.gguf")).unwrap(), &ids);
    let (exact, moved) = (max_diff(&f32, &want), max_diff(&q8, &want));
    assert!(exact <= 1e-6, "the f32 GGUF's logits moved by {exact}");
    assert!(
        moved > 1e-6 && moved < 0.1,
        "Q8_0 moved the logits by {moved}"
    );
    // QLoRA over that Q8_0 file's own blocks, sharded by fsdp: the checkpoint records the
    // base as read, and validating it reads the base so (the run's own validation loss).
    let kept_at = at.join("kept");
    std::fs::create_dir_all(&kept_at).unwrap();
    let q8_file = at.join("q8_0.gguf");
    let q8_file = q8_file.to_str().unwrap();
    let prepare = [
        "prepare",
        "--tokenizer",
        q8_file,
        "--output",
        "tokens.safetensors",
    ];
    let (ok, out, err) = wick(
        &kept_at,
        &[&prepare[..], &["--no-progress", &corpus]].concat(),
    );
    assert!(ok, "{out}{err}");
    let mut kept = fit.to_vec();
    kept[2] = q8_file;
    kept.extend(["--keep-quantized", "--devices", "2", "--run-name", "kept"]);
    let (ok, out, err) = wick(&kept_at, &kept);
    assert!(ok, "{out}{err}");
    // Each rank holds the Q8_0 weights as their blocks: well under half the f32 model.
    let number_before = |word: &str| -> f64 {
        let at = out
            .find(word)
            .unwrap_or_else(|| panic!("no '{word}' in {out}"));
        let digits = out[..at].trim_end().rsplit(' ').next().unwrap();
        digits.parse().unwrap()
    };
    let all = number_before(" trainable,") + number_before(" frozen (no gradient");
    let held = number_before(" B, grads");
    assert!(
        held < 0.8 * 4.0 * all / 2.0,
        "{held} B a rank of {all} parameters"
    );
    let metrics = std::fs::read_to_string(kept_at.join("runs/kept/metrics.csv")).unwrap();
    let last = metrics.lines().nth(2).unwrap();
    let trained: f64 = last.split(',').nth(3).unwrap().parse().unwrap();
    let validated = val_loss(&kept_at, &["ck/last"], "1", "single");
    assert!(
        (validated - trained).abs() < 1e-5,
        "{validated} vs {trained}"
    );
    // Merged into the values its blocks decode to: a plain model of the same loss.
    let (ok, out, err) = wick(&kept_at, &["export", "ck/last", "merged", "--merge"]);
    assert!(ok, "{out}{err}");
    let merged = val_loss(&kept_at, &["--model", "merged"], "1", "single");
    assert!((merged - trained).abs() < 1e-5, "{merged} vs {trained}");
    assert_eq!(
        answer(at.join("merged.gguf").to_str().unwrap()),
        merged_answer
    );
    // A model as it is, converted both ways: the GGUF as a directory, that directory as
    // a GGUF again; the same logits.
    let g = chat_gguf();
    let (ok, out, err) = wick(&at, &["export", "--model", &g, "from-gguf"]);
    assert!(ok, "{out}{err}");
    let (ok, out, err) = wick(
        &at,
        &["export", "--model", "from-gguf", "again.gguf", "--gguf"],
    );
    assert!(ok, "{out}{err}");
    let source = logits(CausalLm::from_gguf(&g).unwrap(), &ids);
    let dir = logits(
        CausalLm::from_pretrained(at.join("from-gguf")).unwrap(),
        &ids,
    );
    let again = logits(CausalLm::from_gguf(at.join("again.gguf")).unwrap(), &ids);
    assert_eq!(max_diff(&dir, &source), 0.0);
    assert_eq!(max_diff(&again, &source), 0.0);
    let (ok, _, err) = wick(&at, &["export", "ck/last", "x", "--model", &g]);
    assert!(!ok && err.contains("OUT only"), "{err}");
    // The adapter file: llama.cpp's names, A and B of every adapted weight.
    let mut file = std::fs::File::open(at.join("adapter.gguf")).unwrap();
    let content = Content::read(&mut file).unwrap();
    let text = |k: &str| content.metadata[k].to_string().unwrap().clone();
    assert_eq!(text("general.type"), "adapter");
    assert_eq!(text("adapter.type"), "lora");
    let mut names: Vec<&String> = content.tensor_infos.keys().collect();
    names.sort();
    assert_eq!(names.len(), 8, "{names:?}");
    assert_eq!(names[0], "blk.0.attn_q.weight.lora_a");
    assert_eq!(content.tensor_infos[names[0]].shape.dims(), [4, 64]);
}

/// The largest difference between `a` and `b`.
fn max_diff(a: &candle_core::Tensor, b: &candle_core::Tensor) -> f32 {
    let d = (a - b).unwrap().abs().unwrap().flatten_all().unwrap();
    d.max(0).unwrap().to_scalar().unwrap()
}

/// The logits of `lm` over `ids`, on one CPU rank.
fn logits(mut lm: CausalLm, ids: &candle_core::Tensor) -> candle_core::Tensor {
    let single = strategy_by_name("single").unwrap();
    let world = Arc::new(SoloWorld);
    let cpu = candle_core::Device::Cpu;
    let _rank = configure_rank(single.as_ref(), world, cpu, 0, &mut lm).unwrap();
    lm.logits(ids).unwrap()
}
