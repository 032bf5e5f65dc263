//! A llama.cpp GGUF file as `--model` and `--tokenizer` (tests/fixtures/gguf/chat-llama.gguf:
//! the Llama fixture's weights in f32, the chat fixture's tokenizer and template, written as
//! llama.cpp's converter writes them by scripts/gguf_fixtures.py): every command gives what
//! it gives for the same model as a Hugging Face directory, and a LoRA run over the GGUF
//! exports as a model directory.

use super::{chat_llama, val_loss, wick};
use std::path::Path;

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
    let (ok, out, err) = wick(
        d,
        &[
            &["sample", "--model", merged.to_str().unwrap()][..],
            &greedy,
        ]
        .concat(),
    );
    assert!(ok, "{out}{err}");
}
