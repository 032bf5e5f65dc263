//! `wick prepare` of the data people bring (tests/fixtures/data, written by
//! scripts/dataset_fixtures.py with pyarrow): every Parquet file gives the token file of its
//! JSON Lines twin byte for byte, in each schema (`messages`, ShareGPT, Alpaca,
//! prompt/completion, text, preference pairs), found from the columns or named; a bad row is refused with
//! its file and row, and nothing is written; `--mix` interleaves files by weights, the same
//! for the same seed.

use super::{hf_fixture, wick};
use std::path::{Path, PathBuf};

fn data(name: &str) -> String {
    format!("{}/tests/fixtures/data/{name}", env!("CARGO_MANIFEST_DIR"))
}

/// `wick prepare --format jsonl` of `files` into `dir/out` with the chat tokenizer;
/// (ok, stdout, stderr).
fn prepare(dir: &Path, out: &str, files: &[&str], extra: &[&str]) -> (bool, String, String) {
    let tokenizer = format!("{}/tokenizer.json", hf_fixture("chat_v5"));
    let mut args = vec!["prepare", "--tokenizer", &tokenizer, "--format", "jsonl"];
    args.extend_from_slice(&["--no-progress", "--val-fraction", "0", "--output", out]);
    args.extend_from_slice(extra);
    let paths: Vec<String> = files.iter().map(|f| data(f)).collect();
    args.extend(paths.iter().map(String::as_str));
    wick(dir, &args)
}

fn bytes(path: PathBuf) -> Vec<u8> {
    std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

#[test]
fn parquet_in_every_schema_gives_the_token_file_of_the_same_examples_as_json_lines() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let pairs = [
        ("messages.parquet", "messages.jsonl", None),
        ("sharegpt.parquet", "sharegpt_as_messages.jsonl", None),
        ("sharegpt.jsonl", "sharegpt_as_messages.jsonl", None),
        ("alpaca.parquet", "alpaca_as_messages.jsonl", None),
        ("prompt_completion.parquet", "prompt_completion.jsonl", None),
        ("text.parquet", "text.jsonl", None),
        ("sharegpt.parquet", "messages.jsonl", Some("sharegpt")),
        ("alpaca.parquet", "alpaca_as_messages.jsonl", Some("alpaca")),
        ("preference.parquet", "preference.jsonl", None),
        (
            "preference_messages.parquet",
            "preference_messages.jsonl",
            None,
        ),
        (
            "preference_messages.parquet",
            "preference_messages.jsonl",
            Some("preference"),
        ),
    ];
    for (i, (parquet, twin, schema)) in pairs.into_iter().enumerate() {
        let extra: Vec<&str> = schema.map(|s| vec!["--schema", s]).unwrap_or_default();
        let (a, b) = (format!("a{i}.safetensors"), format!("b{i}.safetensors"));
        let (ok, out, err) = prepare(d, &a, &[parquet], &extra);
        assert!(ok, "{parquet}: {out}{err}");
        let (ok, out2, err) = prepare(d, &b, &[twin], &[]);
        assert!(ok, "{twin}: {out2}{err}");
        assert_eq!(
            bytes(d.join(&a)),
            bytes(d.join(&b)),
            "{parquet} and {twin}: {out}"
        );
    }
    // A schema named that the rows do not have is refused by the row.
    let (ok, _, err) = prepare(
        d,
        "x.safetensors",
        &["text.parquet"],
        &["--schema", "alpaca"],
    );
    assert!(
        !ok && err.contains("text.parquet: row 1") && err.contains("'instruction'"),
        "{err}"
    );
}

#[test]
fn a_bad_row_is_named_by_file_and_row_and_nothing_is_written() {
    let dir = tempfile::tempdir().unwrap();
    let (ok, _, err) = prepare(
        dir.path(),
        "bad.safetensors",
        &["messages.jsonl", "bad.parquet"],
        &[],
    );
    assert!(!ok, "{err}");
    assert!(
        err.contains("bad.parquet: row 3") && err.contains("'role'"),
        "{err}"
    );
    assert!(!dir.path().join("bad.safetensors").exists());
}

#[test]
fn mixed_files_follow_the_weights_and_the_seed() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let files = ["messages.jsonl", "alpaca.parquet", "text.parquet"];
    let mixed = |out: &str, extra: &[&str]| {
        let (ok, stdout, err) = prepare(d, out, &files, extra);
        assert!(ok, "{stdout}{err}");
        (bytes(d.join(out)), stdout)
    };
    let (one, said) = mixed("m1.safetensors", &["--mix", "1,1,0", "--seed", "7"]);
    let (again, _) = mixed("m2.safetensors", &["--mix", "1,1,0", "--seed", "7"]);
    assert_eq!(one, again, "the same seed, the same file");
    let (other, _) = mixed("m3.safetensors", &["--mix", "1,1,0", "--seed", "8"]);
    assert_ne!(one, other, "another seed, another order");
    // Weight 0: no text example; the first file drawn with nothing left ends the mix, so
    // fewer examples than the two files hold (8).
    let examples: usize = said
        .split(" example(s)")
        .next()
        .and_then(|s| s.rsplit(' ').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("{said}"));
    assert!((4..8).contains(&examples), "{said}");
    let (ok, _, err) = prepare(d, "m4.safetensors", &files, &["--mix", "1,1"]);
    assert!(!ok && err.contains("--mix"), "{err}");
}

#[test]
fn a_corpus_written_as_several_token_files_is_one_corpus_to_fit() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let files = [
        "messages.jsonl",
        "sharegpt.jsonl",
        "alpaca.parquet",
        "prompt_completion.jsonl",
        "text.jsonl",
    ];
    let (ok, out, err) = prepare(d, "one.safetensors", &files, &[]);
    assert!(ok, "{out}{err}");
    let (ok, out, err) = prepare(d, "shards", &files, &["--tokens-per-file", "120"]);
    assert!(ok, "{out}{err}");
    let mut shards: Vec<PathBuf> = std::fs::read_dir(d.join("shards"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    shards.sort();
    assert!(shards.len() >= 3, "{out}: {shards:?}");
    assert!(
        out.contains(&format!("({} token files)", shards.len())),
        "{out}"
    );
    // The files one after another hold the one file's tokens, flags and example starts.
    let load = |p: &Path| candle_core::safetensors::load(p, &candle_core::Device::Cpu).unwrap();
    let one = load(&d.join("one.safetensors"));
    let (mut ids, mut mask, mut starts) = (vec![], vec![], vec![]);
    for shard in &shards {
        let t = load(shard);
        let offset = ids.len() as i64;
        let shard_ids = t["train"].to_dtype(candle_core::DType::U32).unwrap();
        ids.extend(shard_ids.to_vec1::<u32>().unwrap());
        mask.extend(t["train_mask"].to_vec1::<u8>().unwrap());
        let s = t["train_starts"].to_vec1::<i64>().unwrap();
        starts.extend(s.iter().map(|s| s + offset));
    }
    let u32s = |name: &str| one[name].to_dtype(candle_core::DType::U32).unwrap();
    assert_eq!(ids, u32s("train").to_vec1::<u32>().unwrap());
    assert_eq!(mask, one["train_mask"].to_vec1::<u8>().unwrap());
    assert_eq!(starts, one["train_starts"].to_vec1::<i64>().unwrap());
    // fit takes the directory, or a list, as one corpus (each file with its held-out part).
    let tokenizer = format!("{}/tokenizer.json", hf_fixture("chat_v5"));
    let mut args = vec!["prepare", "--tokenizer", &tokenizer, "--format", "jsonl"];
    args.extend([
        "--no-progress",
        "--val-fraction",
        "0.3",
        "--tokens-per-file",
        "120",
    ]);
    args.extend(["--output", "held"]);
    let paths: Vec<String> = files.iter().map(|f| data(f)).collect();
    args.extend(paths.iter().map(String::as_str));
    let (ok, out, err) = wick(d, &args);
    assert!(ok, "{out}{err}");
    let model = super::chat_llama(d);
    let model = model.to_str().unwrap();
    let mut shards: Vec<PathBuf> = std::fs::read_dir(d.join("held"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    shards.sort();
    for data in [
        "held".to_string(),
        shards
            .iter()
            .map(|s| s.to_str().unwrap())
            .collect::<Vec<_>>()
            .join(","),
    ] {
        let (ok, out, err) = wick(
            d,
            &[
                "fit",
                "--model",
                model,
                "--data",
                &data,
                "--seq",
                "64",
                "--batch-size",
                "2",
                "--max-steps",
                "2",
                "--val-every",
                "1000",
                "--no-progress",
                "--checkpoint-dir",
                "ck",
                "--log-dir",
                "runs",
            ],
        );
        assert!(ok, "{out}{err}");
        assert!(
            err.contains("train split: windows of 64 packed as documents"),
            "{err}"
        );
    }
}
