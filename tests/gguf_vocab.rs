//! The tokenizers of llama.cpp's vocabulary files (`models/ggml-vocab-*.gguf`, which the
//! `llama-cpp-python` source archive carries) give the ids of llama.cpp's own test cases
//! (`.gguf.inp` and `.gguf.out` beside each, written by transformers from the original
//! tokenizer): byte-level BPE with Llama 3's, Qwen2's, StarCoder's (SmolLM2's) and GPT-2's
//! pre-tokenizers, and SentencePiece (Llama 2, Phi-3); and so does each as a GGUF export
//! writes it (its pre-tokenizer named again by what it does) and reads it back.

use std::path::PathBuf;
use wick::models::{GgufTokenizer, TextTokenizer};

/// The folder `scripts/llama-vocabs.sh` fills, named by `WICK_LLAMA_VOCABS`.
fn vocabs() -> PathBuf {
    PathBuf::from(std::env::var("WICK_LLAMA_VOCABS").expect(
        "WICK_LLAMA_VOCABS names the folder scripts/llama-vocabs.sh filled with llama.cpp's vocabularies",
    ))
}

/// llama.cpp's cases of `name`: (text, ids), read as its `test-tokenizer-0` reads them.
fn cases(name: &str) -> Vec<(String, Vec<u32>)> {
    let dir = vocabs();
    let inp = std::fs::read_to_string(dir.join(format!("ggml-vocab-{name}.gguf.inp"))).unwrap();
    let out = std::fs::read_to_string(dir.join(format!("ggml-vocab-{name}.gguf.out"))).unwrap();
    let texts: Vec<&str> = inp
        .strip_suffix("\n__ggml_vocab_test__\n")
        .unwrap_or(&inp)
        .split("\n__ggml_vocab_test__\n")
        .collect();
    let ids: Vec<Vec<u32>> = out
        .lines()
        .map(|l| l.split_whitespace().map(|t| t.parse().unwrap()).collect())
        .collect();
    assert_eq!(texts.len(), ids.len(), "{name}: cases and answers");
    texts.into_iter().map(String::from).zip(ids).collect()
}

fn check(name: &str) {
    let path = vocabs().join(format!("ggml-vocab-{name}.gguf"));
    let read = TextTokenizer::from_file(&path).unwrap();
    check_cases(name, &read);
    // Written as a GGUF export writes it and read back: the same ids.
    let written = GgufTokenizer::written(&read, read.vocab_size(), &path).unwrap();
    check_cases(
        name,
        &TextTokenizer::from_json(written.tokenizer, &path).unwrap(),
    );
}

fn check_cases(name: &str, tokenizer: &TextTokenizer) {
    let cases = cases(name);
    let mut wrong = Vec::new();
    for (text, want) in &cases {
        let got = tokenizer.encode(text).unwrap();
        if &got != want {
            wrong.push(format!("{text:?}: wick {got:?}, llama.cpp {want:?}"));
        }
    }
    println!(
        "ggml-vocab-{name}: {} of {} cases equal",
        cases.len() - wrong.len(),
        cases.len()
    );
    assert!(wrong.is_empty(), "ggml-vocab-{name}:\n{}", wrong.join("\n"));
}

macro_rules! vocab_tests {
    ($($test:ident: $name:literal,)*) => {$(
        #[test]
        #[ignore = "needs llama.cpp's vocabularies, not checked in (several MB each): .ci/run fetches them with scripts/llama-vocabs.sh and runs this with WICK_LLAMA_VOCABS set"]
        fn $test() {
            check($name);
        }
    )*};
}

vocab_tests! {
    llama_bpe_llama_3: "llama-bpe",
    qwen2: "qwen2",
    starcoder_smollm2_pre_tokenizer: "starcoder",
    gpt_2: "gpt-2",
    llama_spm_llama_2: "llama-spm",
    phi_3_sentencepiece: "phi-3",
}
