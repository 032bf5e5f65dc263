//! A Hugging Face tokenizer as the `tokenizer.ggml.*` metadata llama.cpp reads: the tokens
//! by id (padded to the model's vocabulary with unused tokens), their types, and the merges
//! of a byte-level BPE or the scores of a SentencePiece BPE. The pre-tokenizer's llama.cpp
//! name is found as llama.cpp's converter finds it, by what it does: each name wick reads is
//! tried, and the one whose tokenizer (as [`super::tokenizer`] builds it from the metadata
//! written) gives the source's ids on a probe text is written; none giving them is an error,
//! not a file that tokenizes otherwise.

use super::tokenizer::{self, BYTE, CONTROL, NORMAL, UNKNOWN, UNUSED, USER_DEFINED};
use crate::{ModelError, TextTokenizer};
use candle_core::quantized::gguf_file::Value;
use serde_json::Value as Json;
use std::collections::HashMap;
use std::path::Path;

/// Texts whose ids tell the pre-tokenizers apart: contractions in both cases, runs of
/// digits, spaces, tabs and newlines, punctuation, accents, CJK and an emoji.
const PROBES: &[&str] = &[
    "Hello world! I'M here, you'RE there; they'll've done it. 1234567 and 3.14159",
    "\n\n  \t indented\r\n\r\n   x  y\n \n\tz!!! ??? ... ---",
    " Äpfel über 你好世界 🦙.cpp\u{00a0}nbsp 12 345 6789 'S 'LL",
];

/// The names tried for a byte-level BPE, the families' own first.
const PRE_NAMES: [&str; 5] = ["llama-bpe", "qwen2", "smollm", "gpt-2", "default"];

/// The `tokenizer.ggml.*` metadata of `tokenizer` for a model of `vocab_size` ids, with
/// the special tokens `bos` and `eos` (ids) and the chat template; `path` names the
/// tokenizer in errors.
pub(crate) fn metadata(
    tokenizer: &TextTokenizer,
    vocab_size: usize,
    bos: Option<u32>,
    eos: Option<u32>,
    chat_template: Option<&str>,
    path: &Path,
) -> Result<Vec<(String, Value)>, ModelError> {
    let bad = |message: String| ModelError::Tokenizer {
        path: path.to_path_buf(),
        message,
    };
    let json: Json = serde_json::from_str(tokenizer.json()).map_err(|e| bad(e.to_string()))?;
    let model = &json["model"];
    if model["type"] != "BPE" {
        return Err(bad(format!(
            "a {} model: wick writes BPE tokenizers (byte-level or SentencePiece) as GGUF",
            model["type"]
        )));
    }
    let sentencepiece = model["byte_fallback"] == true;
    let (tokens, types) = tokens_and_types(&json, vocab_size, sentencepiece).map_err(bad)?;
    let types = Value::Array(types.into_iter().map(Value::I32).collect());
    let mut meta = vec![
        entry("tokenizer.ggml.tokens", strings(&tokens)),
        entry("tokenizer.ggml.token_type", types),
    ];
    meta.extend(special_tokens(tokenizer, bos, eos).map_err(bad)?);
    if let Some(template) = chat_template {
        meta.push(entry(
            "tokenizer.chat_template",
            Value::String(template.to_string()),
        ));
    }
    for candidate in candidates(model, &tokens, sentencepiece).map_err(bad)? {
        let mut all = meta.clone();
        all.extend(candidate);
        if tokenizes_as(&all, tokenizer, path)? {
            return Ok(all);
        }
    }
    Err(bad(
        "no tokenizer llama.cpp names (byte-level BPE with the llama-bpe, qwen2, smollm, gpt-2 \
         or default pre-tokenizer, or SentencePiece) gives this tokenizer's ids: it cannot be \
         written as GGUF faithfully"
            .into(),
    ))
}

/// Whether the tokenizer `meta` describes gives `source`'s ids on every probe.
fn tokenizes_as(
    meta: &[(String, Value)],
    source: &TextTokenizer,
    path: &Path,
) -> Result<bool, ModelError> {
    let files = tokenizer::read_back(meta, path)?;
    let candidate = TextTokenizer::from_json(files.tokenizer, path)?;
    for probe in PROBES {
        let ids = |t: &TextTokenizer| {
            t.encode(probe).map_err(|e| ModelError::Tokenizer {
                path: path.to_path_buf(),
                message: e.to_string(),
            })
        };
        if ids(&candidate)? != ids(source)? {
            return Ok(false);
        }
    }
    Ok(true)
}

/// Every id's token and type, padded to `vocab_size` with unused tokens as llama.cpp's
/// converter pads (`[PAD{id}]`).
fn tokens_and_types(
    json: &Json,
    vocab_size: usize,
    sentencepiece: bool,
) -> Result<(Vec<String>, Vec<i32>), String> {
    let mut by_id: HashMap<u64, (String, i32)> = HashMap::new();
    let vocab = json["model"]["vocab"]
        .as_object()
        .ok_or("model.vocab is not a map")?;
    let unk = json["model"]["unk_token"].as_str();
    for (token, id) in vocab {
        let id = id
            .as_u64()
            .ok_or_else(|| format!("the id of {token:?} is {id}"))?;
        let byte =
            sentencepiece && token.len() == 6 && token.starts_with("<0x") && token.ends_with('>');
        let kind = match () {
            _ if Some(token.as_str()) == unk => UNKNOWN,
            _ if byte => BYTE,
            _ => NORMAL,
        };
        by_id.insert(id, (token.clone(), kind));
    }
    for added in json["added_tokens"].as_array().into_iter().flatten() {
        let (Some(id), Some(content)) = (added["id"].as_u64(), added["content"].as_str()) else {
            return Err(format!("an added token without id or content: {added}"));
        };
        let kind = match (added["special"] == true, Some(content) == unk) {
            (_, true) => UNKNOWN,
            (true, false) => CONTROL,
            (false, false) => USER_DEFINED,
        };
        by_id.insert(id, (content.to_string(), kind));
    }
    let size = by_id
        .keys()
        .max()
        .map_or(0, |m| m + 1)
        .max(vocab_size as u64);
    Ok((0..size)
        .map(|id| {
            by_id
                .remove(&id)
                .unwrap_or_else(|| (format!("[PAD{id}]"), UNUSED))
        })
        .unzip())
}

/// A byte-level BPE's merges as llama.cpp writes them: "left right".
fn merges(model: &Json) -> Result<Vec<String>, String> {
    let list = model["merges"]
        .as_array()
        .ok_or("model.merges is not a list")?;
    list.iter()
        .map(|m| match m {
            Json::String(s) => Ok(s.clone()),
            Json::Array(pair) => match (
                pair.first().and_then(Json::as_str),
                pair.get(1).and_then(Json::as_str),
            ) {
                (Some(a), Some(b)) => Ok(format!("{a} {b}")),
                _ => Err(format!("a merge that is not a pair: {m}")),
            },
            _ => Err(format!("a merge that is not a pair: {m}")),
        })
        .collect()
}

/// SentencePiece scores that make llama.cpp merge in the order of the merges: the token
/// the merge of rank r makes scores -r (the first merge highest); every other token 0
/// less than the last merge's.
fn merge_scores(model: &Json, tokens: &[String]) -> Result<Vec<f32>, String> {
    let ids: HashMap<&str, usize> = tokens
        .iter()
        .enumerate()
        .map(|(i, t)| (t.as_str(), i))
        .collect();
    let merges = merges(model)?;
    let floor = -(merges.len() as f32) - 1.0;
    let mut scores = vec![floor; tokens.len()];
    for (rank, merge) in merges.iter().enumerate() {
        let merged: String = merge.split(' ').collect();
        if let Some(&id) = ids.get(merged.as_str()) {
            if scores[id] == floor {
                scores[id] = -(rank as f32);
            }
        }
    }
    Ok(scores)
}

/// A metadata entry.
fn entry(key: &str, value: Value) -> (String, Value) {
    (key.to_string(), value)
}

/// An array of strings.
fn strings(items: &[String]) -> Value {
    Value::Array(items.iter().cloned().map(Value::String).collect())
}

/// BOS and EOS, and whether the tokenizer adds them to a text (as its post-processor does:
/// then the ids it adds are the ones written).
fn special_tokens(
    tokenizer: &TextTokenizer,
    bos: Option<u32>,
    eos: Option<u32>,
) -> Result<Vec<(String, Value)>, String> {
    let with = tokenizer
        .encode_with_special_tokens("a")
        .map_err(|e| e.to_string())?;
    let plain = tokenizer.encode("a").map_err(|e| e.to_string())?;
    let add_bos = with.len() > plain.len() && with.first() != plain.first();
    let add_eos = with.len() > plain.len() && with.last() != plain.last();
    let bos = if add_bos { with.first().copied() } else { bos };
    let eos = if add_eos { with.last().copied() } else { eos };
    let mut meta = Vec::new();
    for (key, id) in [("bos", bos), ("eos", eos)] {
        if let Some(id) = id {
            meta.push(entry(
                &format!("tokenizer.ggml.{key}_token_id"),
                Value::U32(id),
            ));
        }
    }
    meta.push(entry("tokenizer.ggml.add_bos_token", Value::Bool(add_bos)));
    meta.push(entry("tokenizer.ggml.add_eos_token", Value::Bool(add_eos)));
    Ok(meta)
}

/// The ways llama.cpp could name the tokenizer `model` is: SentencePiece with and without
/// the space prefix, or byte-level BPE with each pre-tokenizer of [`PRE_NAMES`].
fn candidates(
    model: &Json,
    tokens: &[String],
    sentencepiece: bool,
) -> Result<Vec<Vec<(String, Value)>>, String> {
    if !sentencepiece {
        let merges = strings(&merges(model)?);
        return Ok(PRE_NAMES
            .iter()
            .map(|pre| {
                vec![
                    entry("tokenizer.ggml.model", Value::String("gpt2".into())),
                    entry("tokenizer.ggml.pre", Value::String(pre.to_string())),
                    entry("tokenizer.ggml.merges", merges.clone()),
                ]
            })
            .collect());
    }
    let scores = merge_scores(model, tokens)?;
    let scores = Value::Array(scores.into_iter().map(Value::F32).collect());
    let unk = tokens
        .iter()
        .position(|t| Some(t.as_str()) == model["unk_token"].as_str());
    Ok([true, false]
        .iter()
        .map(|&prefix| {
            let mut m = vec![
                entry("tokenizer.ggml.model", Value::String("llama".into())),
                entry("tokenizer.ggml.scores", scores.clone()),
                entry("tokenizer.ggml.add_space_prefix", Value::Bool(prefix)),
            ];
            let unk = unk.map(|u| entry("tokenizer.ggml.unknown_token_id", Value::U32(u as u32)));
            m.extend(unk);
            m
        })
        .collect())
}
