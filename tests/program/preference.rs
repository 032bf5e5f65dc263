//! `wick prepare` of preference rows and `wick fit --objective dpo|ipo`: the pairs
//! tokenized as TRL's `DPOTrainer` tokenizes them (text, and conversations with an explicit
//! or implicit prompt), TRL's metrics in metrics.csv, the reference computed once and
//! reused, and the data of one objective refused by the other.

use super::{hf_fixture, wick};
use candle_core::{DType, Device};
use std::path::Path;
use wick::models::PREFERENCE_METRICS;

/// The documents of split `train` of a token file: each one's ids and counted flags.
fn documents(path: &Path) -> Vec<(Vec<u32>, Vec<bool>)> {
    let t = candle_core::safetensors::load(path, &Device::Cpu).unwrap();
    let ids: Vec<u32> = t["train"].to_dtype(DType::U32).unwrap().to_vec1().unwrap();
    let mask: Vec<u8> = t["train_mask"].to_vec1().unwrap();
    let mut starts: Vec<usize> = (t["train_starts"].to_vec1::<i64>().unwrap().iter())
        .map(|&s| s as usize)
        .collect();
    starts.push(ids.len());
    (starts.windows(2))
        .map(|w| {
            (
                ids[w[0]..w[1]].to_vec(),
                mask[w[0]..w[1]].iter().map(|&m| m == 1).collect(),
            )
        })
        .collect()
}

/// `wick prepare` of `rows` (JSON Lines) with the tokenizer of fixture `tokenizer` into
/// `dir/out`, `val` of it held out.
fn prepare(
    dir: &Path,
    tokenizer: &str,
    rows: &str,
    out: &str,
    val: &str,
) -> (bool, String, String) {
    let tokenizer = format!("{}/tokenizer.json", hf_fixture(tokenizer));
    let rows = format!("{}/{rows}", hf_fixture("dpo"));
    let args = [
        "prepare",
        "--format",
        "jsonl",
        "--val-fraction",
        val,
        "--tokenizer",
    ];
    wick(
        dir,
        &[
            &args[..],
            &[tokenizer.as_str(), "--output", out, rows.as_str()],
        ]
        .concat(),
    )
}

#[test]
fn preference_rows_are_tokenized_as_trl_does() {
    let dir = tempfile::tempdir().unwrap();
    // Text: TRL's collated batch (chosen rows, then rejected rows) of the fixture.
    let (ok, out, err) = prepare(dir.path(), "llama", "pairs.jsonl", "text.safetensors", "0");
    assert!(ok, "{out}{err}");
    assert!(
        out.contains("16 documents (two per preference pair)"),
        "{out}"
    );
    let reference = candle_core::safetensors::load(
        format!("{}/reference.safetensors", hf_fixture("dpo")),
        &Device::Cpu,
    )
    .unwrap();
    let ids = reference["ids"]
        .to_dtype(DType::U32)
        .unwrap()
        .to_vec2::<u32>()
        .unwrap();
    let mask = reference["completion_mask"].to_vec2::<i64>().unwrap();
    let docs = documents(&dir.path().join("text.safetensors"));
    assert_eq!(docs.len(), 16);
    for (d, (doc, counted)) in docs.iter().enumerate() {
        // Document 2i is pair i's chosen row (TRL's row i), 2i + 1 its rejected (row 8 + i).
        let row = d / 2 + if d % 2 == 1 { 8 } else { 0 };
        let n = doc.len();
        assert_eq!(doc[..], ids[row][..n], "document {d}");
        let trl: Vec<bool> = mask[row][..n].iter().map(|&m| m == 1).collect();
        assert_eq!(counted, &trl, "document {d}");
        assert!(
            mask[row][n..].iter().all(|&m| m == 0),
            "document {d} is TRL's whole row"
        );
    }
    // Conversations through the chat fixture's template, with the prompt given and left
    // for TRL's rule to find.
    let text =
        std::fs::read_to_string(format!("{}/conversational.json", hf_fixture("dpo"))).unwrap();
    let trl: serde_json::Value = serde_json::from_str(&text).unwrap();
    for kind in ["explicit", "implicit"] {
        let out_name = format!("{kind}.safetensors");
        let rows = format!("conversational_{kind}.jsonl");
        let (ok, out, err) = prepare(dir.path(), "chat", &rows, &out_name, "0");
        assert!(ok, "{out}{err}");
        let docs = documents(&dir.path().join(&out_name));
        let ids = |v: &serde_json::Value| -> Vec<u32> {
            v.as_array()
                .unwrap()
                .iter()
                .map(|i| i.as_u64().unwrap() as u32)
                .collect()
        };
        for (i, pair) in trl[kind].as_array().unwrap().iter().enumerate() {
            let prompt = ids(&pair["prompt_ids"]);
            for (which, doc) in [
                ("chosen_ids", &docs[2 * i]),
                ("rejected_ids", &docs[2 * i + 1]),
            ] {
                let completion = ids(&pair[which]);
                assert_eq!(
                    doc.0,
                    [prompt.clone(), completion.clone()].concat(),
                    "{kind} pair {i} {which}"
                );
                let want: Vec<bool> = (0..doc.0.len()).map(|j| j >= prompt.len()).collect();
                assert_eq!(doc.1, want, "{kind} pair {i} {which}");
            }
        }
    }
    // A pair's held-out part starts at a pair: a quarter of the tokens falls inside one.
    let (ok, out, err) = prepare(
        dir.path(),
        "llama",
        "pairs.jsonl",
        "held.safetensors",
        "0.3",
    );
    assert!(ok, "{out}{err}");
    let t =
        candle_core::safetensors::load(dir.path().join("held.safetensors"), &Device::Cpu).unwrap();
    let (train, val) = (
        t["train_starts"].dims1().unwrap(),
        t["val_starts"].dims1().unwrap(),
    );
    assert_eq!((train % 2, val % 2), (0, 0), "{train} and {val} documents");
    assert!(val >= 2, "{val}");
}

#[test]
fn dpo_logs_trl_metrics_computes_its_reference_once_and_refuses_other_data() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let (ok, out, err) = prepare(d, "llama", "pairs.jsonl", "pairs.safetensors", "0.25");
    assert!(ok, "{out}{err}");
    let model = hf_fixture("llama");
    let fit = |objective: &str, data: &str, name: &str| {
        let args = [
            "fit",
            "--model",
            &model,
            "--data",
            data,
            "--objective",
            objective,
            "--seq",
            "48",
            "--batch-size",
            "2",
            "--max-steps",
            "3",
            "--val-every",
            "3",
            "--no-checkpoints",
            "--no-progress",
            "--run-name",
            name,
            "--lr",
            "1e-3",
        ];
        wick(d, &args)
    };
    let (ok, out, err) = fit("dpo", "pairs.safetensors", "first");
    assert!(ok, "{out}{err}");
    assert!(
        err.contains(
            "computing the reference log-probabilities of 7 training and 1 validation pairs"
        ),
        "{err}"
    );
    assert!(d.join("pairs.safetensors.dpo-reference").is_file());
    let csv = std::fs::read_to_string(d.join("runs/first/metrics.csv")).unwrap();
    let mut lines = csv.lines();
    let header: Vec<&str> = lines.next().unwrap().split(',').collect();
    assert_eq!(header[12..], PREFERENCE_METRICS, "{header:?}");
    let first: Vec<f64> = lines
        .next()
        .unwrap()
        .split(',')
        .map(|c| c.parse().unwrap_or(f64::NAN))
        .collect();
    // The policy is the reference at the first step: no reward, DPO's loss log 2.
    assert_eq!(first[2], std::f64::consts::LN_2 as f32 as f64, "{first:?}");
    assert_eq!(first[12..16], [0.0; 4], "{first:?}");
    assert!(first[16] < 0.0 && first[17] < 0.0, "{first:?}");
    let last: Vec<f64> = csv
        .lines()
        .last()
        .unwrap()
        .split(',')
        .map(|c| c.parse().unwrap_or(f64::NAN))
        .collect();
    assert!(
        last[15] > 0.0 && last[2] < first[2],
        "the chosen move ahead: {last:?}"
    );
    // A second run reuses the reference.
    let (ok, out, err) = fit("ipo", "pairs.safetensors", "second");
    assert!(ok, "{out}{err}");
    assert!(
        err.contains("the reference log-probabilities: pairs.safetensors.dpo-reference"),
        "{err}"
    );
    assert!(!err.contains("computing"), "{err}");
    // Pairs are not instruction data, and instruction data is not pairs.
    let (ok, _, err) = fit("sft", "pairs.safetensors", "sft");
    assert!(
        !ok && err.contains("holds preference pairs") && err.contains("--objective dpo"),
        "{err}"
    );
    let (ok, out, err) = prepare(d, "chat", "../chat/chat.jsonl", "chat.safetensors", "0.25");
    assert!(ok, "{out}{err}");
    let (ok, _, err) = fit("dpo", "chat.safetensors", "dpo-on-chat");
    assert!(!ok && err.contains("holds no preference pairs"), "{err}");
}
