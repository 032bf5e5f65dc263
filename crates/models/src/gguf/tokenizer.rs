//! The tokenizer a GGUF file holds (`tokenizer.ggml.*`), as the `tokenizer.json` that the
//! `tokenizers` crate loads and the `tokenizer_config.json` beside it, built to give the ids
//! llama.cpp gives (and the original Hugging Face tokenizer, which llama.cpp's own test
//! cases come from):
//!
//! - `gpt2` (byte-level BPE: Llama 3, Qwen2/3, SmolLM2, GPT-2): the vocabulary and merges as
//!   they are, and the pre-tokenizer `tokenizer.ggml.pre` names, as llama.cpp's regular
//!   expressions, with Llama 3's `ignore_merges` and Qwen2's NFC normalizer, both of which
//!   transformers' own GGUF conversion drops;
//! - `llama` (SentencePiece BPE: Llama 2, Mistral, Gemma): merges by the scores (the
//!   highest-scoring pair first, as llama.cpp's SentencePiece merges), byte fallback, and
//!   the space prefix where `tokenizer.ggml.add_space_prefix` (default true) says.
//!
//! Control tokens become special added tokens, user-defined ones plain added tokens (matched
//! in any text, as llama.cpp matches them).

use super::metadata::{string, Metadata};
use crate::ModelError;
use serde_json::{json, Map, Value as Json};
use std::collections::HashMap;

// llama.cpp's token types (`tokenizer.ggml.token_type`).
/// A token of the vocabulary.
pub(crate) const NORMAL: i32 = 1;
/// The unknown token.
pub(crate) const UNKNOWN: i32 = 2;
/// A special token (BOS, EOS, a chat turn's markers).
pub(crate) const CONTROL: i32 = 3;
/// An added token that is not special.
pub(crate) const USER_DEFINED: i32 = 4;
/// Padding of the vocabulary to the model's size.
pub(crate) const UNUSED: i32 = 5;
/// A byte of SentencePiece's byte fallback (`<0x0A>`).
pub(crate) const BYTE: i32 = 6;

/// GPT-2's words, numbers, punctuation runs and spaces (llama.cpp's form, without the
/// final `\s+`: what no alternative matches stays a piece of its own either way).
const GPT2_WORDS: &str = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)";
/// Llama 3's pattern: contractions in either case, numbers of up to three digits.
const LLAMA3: &str = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
/// Qwen2's: Llama 3's with one digit per piece.
const QWEN2: &str = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

/// How a byte-level BPE vocabulary splits text before its merges.
struct PreTokenizer {
    /// Patterns applied one after another, each splitting the pieces of the one before.
    patterns: &'static [&'static str],
    /// Whole pieces found in the vocabulary are taken as they are, unmerged (Llama 3).
    ignore_merges: bool,
    /// Text is NFC-normalized first (Qwen2).
    nfc: bool,
    /// `tokenizer.ggml.add_bos_token`'s default.
    add_bos: bool,
}

/// The pre-tokenizer `tokenizer.ggml.pre` names, for the names llama.cpp gives the
/// families wick trains and those that share their patterns.
fn pre_tokenizer(name: &str) -> Option<PreTokenizer> {
    let pre = |patterns, ignore_merges, nfc, add_bos| PreTokenizer {
        patterns,
        ignore_merges,
        nfc,
        add_bos,
    };
    Some(match name {
        "llama3" | "llama-v3" | "llama-bpe" | "falcon3" | "pixtral" => {
            pre(&[LLAMA3], true, false, true)
        }
        "qwen2" | "deepseek-r1-qwen" => pre(&[QWEN2], false, true, false),
        "smollm" | "starcoder" | "refact" | "command-r" => {
            pre(&[r"\p{N}", GPT2_WORDS], false, false, false)
        }
        "gpt-2" | "phi-2" | "mpt" | "olmo" => pre(&[GPT2_WORDS], false, false, false),
        "default" => pre(
            &[
                r"[\p{P}\$\+<=>\^~\|]+",
                GPT2_WORDS,
                r"\p{N}+",
                "[0-9][0-9][0-9]",
            ],
            false,
            false,
            false,
        ),
        _ => return None,
    })
}

/// The tokenizer files of a GGUF file's metadata.
pub(crate) struct TokenizerFiles {
    /// `tokenizer.json`.
    pub(crate) tokenizer: String,
    /// `tokenizer_config.json`: the special tokens, whether BOS is added, the chat
    /// template.
    pub(crate) tokenizer_config: String,
    /// The BOS id.
    pub(crate) bos_id: Option<u64>,
    /// The ids that end a turn: EOS, and end-of-turn and end-of-message where they differ.
    pub(crate) end_ids: Vec<u64>,
}

/// The vocabulary as the file lists it.
struct Vocab<'a> {
    tokens: Vec<&'a str>,
    types: Vec<i32>,
}

impl Vocab<'_> {
    /// Token -> id, the first id of a token listed twice.
    fn ids(&self) -> Map<String, Json> {
        let mut ids = Map::new();
        for (id, token) in self.tokens.iter().enumerate() {
            ids.entry(token.to_string()).or_insert(json!(id));
        }
        ids
    }

    /// Control, unknown and user-defined tokens, as `added_tokens` entries.
    fn added_tokens(&self) -> Vec<Json> {
        let kept = [UNKNOWN, CONTROL, USER_DEFINED];
        (self.tokens.iter().zip(&self.types).enumerate())
            .filter(|(_, (_, t))| kept.contains(t))
            .map(|(id, (token, kind))| {
                json!({
                    "id": id, "content": token, "single_word": false, "lstrip": false,
                    "rstrip": false, "normalized": false, "special": *kind != USER_DEFINED,
                })
            })
            .collect()
    }

    fn token(&self, id: Option<u64>) -> Option<&str> {
        self.tokens.get(usize::try_from(id?).ok()?).copied()
    }
}

/// The tokenizer files of the file `meta` reads, or `None` where it has no vocabulary.
pub(crate) fn tokenizer_files(meta: &Metadata) -> Result<Option<TokenizerFiles>, ModelError> {
    let Some(tokens) = meta.array("tokenizer.ggml.tokens", string)? else {
        return Ok(None);
    };
    let types = meta
        .array("tokenizer.ggml.token_type", |v| v.to_i32().ok())?
        .unwrap_or_else(|| vec![NORMAL; tokens.len()]);
    if types.len() != tokens.len() {
        return Err(
            meta.error("tokenizer.ggml.token_type and tokenizer.ggml.tokens differ in length")
        );
    }
    let vocab = Vocab { tokens, types };
    let model = meta.str("tokenizer.ggml.model")?.unwrap_or("llama");
    let (mut tokenizer, default_add_bos, default_bos) = match model {
        "gpt2" => byte_level_bpe(meta, &vocab)?,
        "llama" => sentencepiece_bpe(meta, &vocab)?,
        other => {
            return Err(meta.error(format!(
                "tokenizer.ggml.model '{other}': wick reads the 'gpt2' (byte-level BPE) and \
                 'llama' (SentencePiece) tokenizers"
            )))
        }
    };
    let id = |key: &str| meta.u64(&format!("tokenizer.ggml.{key}_token_id"));
    let bos = id("bos")?.or(default_bos);
    let eos = id("eos")?;
    let add_bos = meta
        .bool("tokenizer.ggml.add_bos_token")?
        .unwrap_or(default_add_bos);
    let add_eos = meta.bool("tokenizer.ggml.add_eos_token")?.unwrap_or(false);
    tokenizer["added_tokens"] = Json::Array(vocab.added_tokens());
    tokenizer["post_processor"] = post_processor(
        &vocab,
        add_bos.then_some(bos).flatten(),
        add_eos.then_some(eos).flatten(),
    );
    let mut config = json!({
        "tokenizer_class": "PreTrainedTokenizerFast",
        "add_bos_token": add_bos,
        "add_eos_token": add_eos,
        "clean_up_tokenization_spaces": false,
    });
    for (key, id) in [
        ("bos", bos),
        ("eos", eos),
        ("unk", id("unknown")?),
        ("pad", id("padding")?),
    ] {
        if let Some(token) = vocab.token(id) {
            config[format!("{key}_token")] = json!(token);
        }
    }
    if let Some(template) = meta.str("tokenizer.chat_template")? {
        config["chat_template"] = json!(template);
    }
    let mut end_ids: Vec<u64> = Vec::new();
    for end in [eos, id("eot")?, id("eom")?].into_iter().flatten() {
        if !end_ids.contains(&end) {
            end_ids.push(end);
        }
    }
    let text = |v: &Json| serde_json::to_string_pretty(v).expect("JSON serializes");
    Ok(Some(TokenizerFiles {
        tokenizer: text(&tokenizer),
        tokenizer_config: text(&config) + "\n",
        bos_id: bos,
        end_ids,
    }))
}

/// A byte-level BPE tokenizer (`gpt2`), its default for adding BOS, and its BOS id.
fn byte_level_bpe(meta: &Metadata, vocab: &Vocab) -> Result<(Json, bool, Option<u64>), ModelError> {
    let name = meta.str("tokenizer.ggml.pre")?.unwrap_or("default");
    let pre = pre_tokenizer(name).ok_or_else(|| {
        meta.error(format!(
            "tokenizer.ggml.pre '{name}': wick builds llama-bpe, qwen2, smollm, gpt-2 and \
             their aliases"
        ))
    })?;
    let merges = meta
        .array("tokenizer.ggml.merges", string)?
        .ok_or_else(|| meta.error("has no tokenizer.ggml.merges"))?;
    let merges = merges
        .iter()
        .enumerate()
        .map(|(i, m)| {
            // Byte-level tokens hold no space (a space byte is written 'Ġ').
            m.split_once(' ')
                .map(|(a, b)| json!([a, b]))
                .ok_or_else(|| {
                    meta.error(format!("tokenizer.ggml.merges[{i}] '{m}' is not a pair"))
                })
        })
        .collect::<Result<Vec<_>, _>>()?;
    let mut steps: Vec<Json> = pre
        .patterns
        .iter()
        .map(|p| json!({"type": "Split", "pattern": {"Regex": p}, "behavior": "Isolated", "invert": false}))
        .collect();
    steps.push(json!({"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": false, "use_regex": false}));
    let tokenizer = json!({
        "version": "1.0",
        "truncation": null,
        "padding": null,
        "normalizer": if pre.nfc { json!({"type": "NFC"}) } else { Json::Null },
        "pre_tokenizer": {"type": "Sequence", "pretokenizers": steps},
        "decoder": {"type": "ByteLevel", "add_prefix_space": true, "trim_offsets": true, "use_regex": true},
        "model": {
            "type": "BPE", "dropout": null, "unk_token": null, "continuing_subword_prefix": null,
            "end_of_word_suffix": null, "fuse_unk": false, "byte_fallback": false,
            "ignore_merges": pre.ignore_merges, "vocab": vocab.ids(), "merges": merges,
        },
    });
    Ok((tokenizer, pre.add_bos, None))
}

/// A SentencePiece BPE tokenizer (`llama`), its default for adding BOS, and its BOS id.
fn sentencepiece_bpe(
    meta: &Metadata,
    vocab: &Vocab,
) -> Result<(Json, bool, Option<u64>), ModelError> {
    let scores = meta
        .array("tokenizer.ggml.scores", |v| v.to_f32().ok())?
        .ok_or_else(|| {
            meta.error("a SentencePiece vocabulary ('llama') needs tokenizer.ggml.scores")
        })?;
    if scores.len() != vocab.tokens.len() {
        return Err(meta.error("tokenizer.ggml.scores and tokenizer.ggml.tokens differ in length"));
    }
    let add_space_prefix = meta
        .bool("tokenizer.ggml.add_space_prefix")?
        .unwrap_or(true);
    let escape = json!({"type": "Replace", "pattern": {"String": " "}, "content": "▁"});
    let normalizer = match add_space_prefix {
        true => {
            json!({"type": "Sequence", "normalizers": [{"type": "Prepend", "prepend": "▁"}, escape]})
        }
        false => escape,
    };
    let mut decoders = vec![
        json!({"type": "Replace", "pattern": {"String": "▁"}, "content": " "}),
        json!({"type": "ByteFallback"}),
        json!({"type": "Fuse"}),
    ];
    if add_space_prefix {
        decoders.push(json!({"type": "Strip", "content": " ", "start": 1, "stop": 0}));
    }
    let unk = vocab.token(meta.u64("tokenizer.ggml.unknown_token_id")?.or(Some(0)));
    let tokenizer = json!({
        "version": "1.0",
        "truncation": null,
        "padding": null,
        "normalizer": normalizer,
        "pre_tokenizer": null,
        "decoder": {"type": "Sequence", "decoders": decoders},
        "model": {
            "type": "BPE", "dropout": null, "unk_token": unk, "continuing_subword_prefix": null,
            "end_of_word_suffix": null, "fuse_unk": true, "byte_fallback": true,
            "ignore_merges": false, "vocab": vocab.ids(), "merges": merges_by_score(vocab, &scores),
        },
    });
    Ok((tokenizer, true, Some(1)))
}

/// The merges that rebuild each normal token from two others, the highest-scoring token
/// first (SentencePiece merges the pair whose token scores highest); ties in the order of
/// the token's id, then of its halves' ids, as transformers' SentencePiece converter
/// orders them.
fn merges_by_score(vocab: &Vocab, scores: &[f32]) -> Vec<Json> {
    let mut ids: HashMap<&str, usize> = HashMap::new();
    for (id, token) in vocab.tokens.iter().enumerate() {
        ids.entry(token).or_insert(id);
    }
    let mut merges: Vec<(f32, usize, usize, usize)> = Vec::new();
    for (id, token) in vocab.tokens.iter().enumerate() {
        if vocab.types[id] != NORMAL {
            continue;
        }
        for (at, _) in token.char_indices().skip(1) {
            let (left, right) = token.split_at(at);
            if let (Some(&l), Some(&r)) = (ids.get(left), ids.get(right)) {
                merges.push((scores[id], id, l, r));
            }
        }
    }
    merges.sort_by(|a, b| {
        b.0.total_cmp(&a.0)
            .then((a.1, a.2, a.3).cmp(&(b.1, b.2, b.3)))
    });
    merges
        .into_iter()
        .map(|(_, _, l, r)| json!([vocab.tokens[l], vocab.tokens[r]]))
        .collect()
}

/// The post-processor adding `bos` before and `eos` after a text (none where neither).
fn post_processor(vocab: &Vocab, bos: Option<u64>, eos: Option<u64>) -> Json {
    let named = |id: Option<u64>| Some((vocab.token(id)?, id?));
    let (bos, eos) = (named(bos), named(eos));
    if bos.is_none() && eos.is_none() {
        return Json::Null;
    }
    let special = |(token, _): (&str, u64), type_id: u32| json!({"SpecialToken": {"id": token, "type_id": type_id}});
    let sequence = |name: &str, type_id: u32| json!({"Sequence": {"id": name, "type_id": type_id}});
    let around = |name: &str, type_id: u32| {
        let mut items: Vec<Json> = bos.map(|b| special(b, type_id)).into_iter().collect();
        items.push(sequence(name, type_id));
        items.extend(eos.map(|e| special(e, type_id)));
        items
    };
    let mut pair = around("A", 0);
    pair.extend(around("B", 1));
    let mut special_tokens = Map::new();
    for (token, id) in bos.into_iter().chain(eos) {
        special_tokens.insert(
            token.to_string(),
            json!({"id": token, "ids": [id], "tokens": [token]}),
        );
    }
    json!({"type": "TemplateProcessing", "single": around("A", 0), "pair": pair, "special_tokens": special_tokens})
}

/// The tokenizer files a reader gets of a file whose metadata is `meta` (which lists the
/// tokens): what an export is about to write, read back before it is written.
pub(crate) fn read_back(
    meta: &[(String, candle_core::quantized::gguf_file::Value)],
    path: &std::path::Path,
) -> Result<TokenizerFiles, ModelError> {
    use candle_core::quantized::gguf_file::{Content, VersionedMagic};
    let content = Content {
        magic: VersionedMagic::GgufV3,
        metadata: meta.iter().cloned().collect(),
        tensor_infos: HashMap::new(),
        tensor_data_offset: 0,
    };
    let files = tokenizer_files(&Metadata {
        content: &content,
        path,
    })?;
    Ok(files.expect("the metadata lists the tokens"))
}
