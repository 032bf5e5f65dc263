//! `wick sample` and `wick chat` over a Hugging Face model: greedy text equal to the
//! library's generation (itself equal to transformers', tests/generation.rs), a chat
//! message through the template, the end tokens of generation_config.json, and a
//! conversation read from standard input.

use super::{chat_llama, hf_fixture, wick};
use std::io::Write;
use std::path::Path;
use std::process::{Command, Stdio};
use wick::core::{configure_rank, SoloWorld};
use wick::models::{generate, CausalLm, Sampling, TextTokenizer};
use wick::strategies::strategy_by_name;

/// The greedy tokens of the model directory `dir` after `prompt`, by the library.
fn greedy(dir: &Path, prompt: &[u32], n: usize) -> Vec<u32> {
    let mut lm = CausalLm::from_pretrained(dir).unwrap();
    let single = strategy_by_name("single").unwrap();
    let _rank = configure_rank(
        single.as_ref(),
        std::sync::Arc::new(SoloWorld),
        candle_core::Device::Cpu,
        0,
        &mut lm,
    )
    .unwrap();
    let sampling = Sampling {
        max_new_tokens: n,
        ..Sampling::default()
    };
    generate(&lm, prompt, &sampling, |_| Ok(())).unwrap()
}

/// A copy of the Llama fixture whose generation_config.json ends generation at `eos`.
fn llama_ending_at(dir: &Path, eos: &[u32]) -> std::path::PathBuf {
    let copy = dir.join("llama-eos");
    std::fs::create_dir_all(&copy).unwrap();
    for f in ["config.json", "model.safetensors", "tokenizer.json"] {
        std::fs::copy(Path::new(&hf_fixture("llama")).join(f), copy.join(f)).unwrap();
    }
    let config = serde_json::json!({ "eos_token_id": eos });
    std::fs::write(copy.join("generation_config.json"), config.to_string()).unwrap();
    copy
}

#[test]
fn sample_streams_the_greedy_text_of_a_model_directory_and_stops_at_its_end_tokens() {
    let dir = tempfile::tempdir().unwrap();
    let llama = hf_fixture("llama");
    let tokenizer = TextTokenizer::from_file(format!("{llama}/tokenizer.json")).unwrap();
    let prompt = "Permission is hereby";
    let ids = tokenizer.encode_with_special_tokens(prompt).unwrap();
    let want = greedy(Path::new(&llama), &ids, 12);
    let sample = |model: &str| {
        let args = [
            "sample",
            "--model",
            model,
            "--prompt",
            prompt,
            "--temperature",
            "0",
            "--max-new-tokens",
            "12",
        ];
        let (ok, out, err) = wick(dir.path(), &args);
        assert!(ok, "{out}{err}");
        out
    };
    let out = sample(&llama);
    let text = format!("{prompt}{}\n", tokenizer.decode(&want).unwrap());
    assert_eq!(out, text);
    // generation_config.json's list of end tokens ends it at the first of them, unwritten.
    let ends = llama_ending_at(dir.path(), &[want[3], 5000]);
    let first = want.iter().position(|&t| t == want[3]).unwrap();
    let out = sample(ends.to_str().unwrap());
    assert_eq!(
        out,
        format!("{prompt}{}\n", tokenizer.decode(&want[..first]).unwrap())
    );
}

#[test]
fn a_chat_message_goes_through_the_template_and_a_conversation_is_read_from_input() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let model = chat_llama(d);
    let template = wick::models::ChatTemplate::from_dir(&model)
        .unwrap()
        .unwrap();
    let tokenizer = TextTokenizer::from_file(model.join("tokenizer.json")).unwrap();
    let message = "What does the license permit?";
    let rendered = template
        .render(
            &[serde_json::json!({ "role": "user", "content": message })],
            true,
        )
        .unwrap();
    let ids = tokenizer.encode(&rendered).unwrap();
    let stop = tokenizer.token_to_id("<|endoftext|>").unwrap();
    let mut want = greedy(&model, &ids, 8);
    if let Some(end) = want.iter().position(|&t| t == stop) {
        want.truncate(end);
    }
    let model = model.to_str().unwrap();
    let greedy_args = ["--temperature", "0", "--max-new-tokens", "8"];
    let (ok, out, err) = wick(
        d,
        &[
            &["sample", "--model", model, "--chat", message][..],
            &greedy_args,
        ]
        .concat(),
    );
    assert!(ok, "{out}{err}");
    assert_eq!(out, format!("{}\n", tokenizer.decode(&want).unwrap()));

    // Two turns on standard input: two answers, the first the same as `sample --chat`'s.
    let mut child = Command::new(env!("CARGO_BIN_EXE_wick"))
        .args([&["chat", "--model", model][..], &greedy_args].concat())
        .current_dir(d)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    write!(
        child.stdin.take().unwrap(),
        "{message}\n\nAnd any person?\n"
    )
    .unwrap();
    let done = child.wait_with_output().unwrap();
    let answers = String::from_utf8_lossy(&done.stdout).into_owned();
    assert!(
        done.status.success(),
        "{answers}{}",
        String::from_utf8_lossy(&done.stderr)
    );
    let lines: Vec<&str> = answers.lines().collect();
    assert_eq!(lines.len(), 2, "{answers:?}");
    assert_eq!(format!("{}\n", lines[0]), out);
}
