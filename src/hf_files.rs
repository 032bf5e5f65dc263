//! The files of a Hugging Face model directory beside its weights, `config.json` and
//! `tokenizer.json`: the tokenizer's options and chat template, and the generation
//! defaults. `fit --model` carries those of its model into each checkpoint, and `export`
//! writes them back, completed where the source had none, as `save_pretrained` would: a
//! chat model comes out able to chat, in the layouts of transformers 4 and 5 alike.

use anyhow::Context;
use serde_json::{json, Map, Value};
use std::path::Path;
use wick_models::{
    chat_template_of, is_gguf, ChatTemplate, GgufTokenizer, TextTokenizer, CHAT_TEMPLATE_FILE,
    TOKENIZER_CONFIG_FILE,
};
use wick_trainer::Checkpoint;

/// A model directory's config (and the checkpoint attachment that holds it).
pub const CONFIG_FILE: &str = "config.json";
/// A model directory's tokenizer (and the checkpoint attachment that holds it).
pub const TOKENIZER_FILE: &str = "tokenizer.json";
/// The generation defaults (`eos_token_id` lists every token that ends a turn).
pub const GENERATION_CONFIG_FILE: &str = "generation_config.json";
/// The special tokens of tokenizers saved before transformers 5.
pub const SPECIAL_TOKENS_MAP_FILE: &str = "special_tokens_map.json";

/// The files of the tokenizer's directory that travel with it.
const TOKENIZER_SIDE_FILES: [&str; 3] = [
    TOKENIZER_CONFIG_FILE,
    CHAT_TEMPLATE_FILE,
    SPECIAL_TOKENS_MAP_FILE,
];

/// Every side file a checkpoint may carry, in the order `export` writes them.
pub const SIDE_FILES: [&str; 4] = [
    TOKENIZER_CONFIG_FILE,
    CHAT_TEMPLATE_FILE,
    SPECIAL_TOKENS_MAP_FILE,
    GENERATION_CONFIG_FILE,
];

/// The side files of `--model` (a directory, a `config.json` whose directory may hold a
/// `generation_config.json`, or a GGUF file) and of its tokenizer (`--tokenizer`'s
/// directory or GGUF file, or the model's), as (name, bytes), those that exist.
pub fn read_side_files(
    model: &Path,
    tokenizer: Option<&Path>,
) -> anyhow::Result<Vec<(&'static str, Vec<u8>)>> {
    // Each file from where it belongs: the tokenizer's, or the model's.
    let mut out = files_of(tokenizer.unwrap_or(model), &TOKENIZER_SIDE_FILES)?;
    out.extend(files_of(model, &[GENERATION_CONFIG_FILE])?);
    Ok(out)
}

/// The side files named `names` of `source`: of a directory (a model's or a checkpoint's),
/// of a file's directory, or those a GGUF file's metadata makes.
fn files_of(source: &Path, names: &[&'static str]) -> anyhow::Result<Vec<(&'static str, Vec<u8>)>> {
    let mut out = Vec::new();
    if source.is_file() && is_gguf(source) {
        if let Some(t) = GgufTokenizer::open(source)? {
            let made = [
                (TOKENIZER_CONFIG_FILE, t.tokenizer_config),
                (GENERATION_CONFIG_FILE, t.generation_config),
            ];
            out.extend(
                made.into_iter()
                    .filter(|(n, _)| names.contains(n))
                    .map(|(n, text)| (n, text.into_bytes())),
            );
        }
        return Ok(out);
    }
    let dir = match source.is_dir() {
        true => source,
        false => source.parent().unwrap_or(Path::new(".")),
    };
    for &name in names {
        let path = dir.join(name);
        if path.is_file() {
            let bytes =
                std::fs::read(&path).with_context(|| format!("reading {}", path.display()))?;
            out.push((name, bytes));
        }
    }
    Ok(out)
}

/// The side file `name` among `files`, as text.
pub fn side_file<'a>(files: &'a [(&str, Vec<u8>)], name: &str) -> Option<&'a [u8]> {
    files
        .iter()
        .find(|(n, _)| *n == name)
        .map(|(_, b)| b.as_slice())
}

/// The chat template among the side files `files` of `source` (which names it in errors).
pub fn chat_template(
    files: &[(&str, Vec<u8>)],
    source: &Path,
) -> anyhow::Result<Option<ChatTemplate>> {
    let text = |name| {
        side_file(files, name)
            .map(|b| String::from_utf8(b.to_vec()))
            .transpose()
            .with_context(|| format!("{}: {name} is not UTF-8", source.display()))
    };
    let jinja = text(CHAT_TEMPLATE_FILE)?;
    let config = text(TOKENIZER_CONFIG_FILE)?;
    Ok(ChatTemplate::from_texts(source, jinja, config.as_deref())?)
}

/// Writes into `dir` the side files of a `fit --model` checkpoint `ck`, completed
/// ([`completed_side_files`]); returns their names.
pub fn write_side_files(ck: &Checkpoint, dir: &Path) -> anyhow::Result<Vec<&'static str>> {
    let attached = |name: &str| {
        ck.attachment(name)
            .with_context(|| format!("{}: holds no {name}", ck.dir().display()))
    };
    let (config, tokenizer) = (attached(CONFIG_FILE)?, attached(TOKENIZER_FILE)?);
    let config: Value = serde_json::from_slice(&std::fs::read(&config)?)
        .with_context(|| format!("{} is not JSON", config.display()))?;
    let tokenizer = TextTokenizer::from_file(tokenizer)?;
    let mut names = Vec::new();
    for (name, bytes) in completed_side_files(carried_side_files(ck)?, &config, &tokenizer)? {
        std::fs::write(dir.join(name), bytes)?;
        names.push(name);
    }
    Ok(names)
}

/// The side files checkpoint `ck` carries.
pub fn carried_side_files(ck: &Checkpoint) -> anyhow::Result<Vec<(&'static str, Vec<u8>)>> {
    let mut carried = Vec::new();
    for name in SIDE_FILES {
        if let Some(path) = ck.attachment(name) {
            carried.push((name, std::fs::read(&path)?));
        }
    }
    Ok(carried)
}

/// The side files an export writes, given those `carried`, the model's `config.json` and
/// its tokenizer: what was carried, and what `save_pretrained` writes that was not:
/// a `tokenizer_config.json` naming the special tokens of `config.json`'s ids, the chat
/// template in `chat_template.jinja` (transformers 5's file) where only
/// `tokenizer_config.json` held it, and a `generation_config.json` from `config.json`'s
/// token ids (transformers' `GenerationConfig.from_model_config`).
pub fn completed_side_files(
    mut carried: Vec<(&'static str, Vec<u8>)>,
    config: &Value,
    tokenizer: &TextTokenizer,
) -> anyhow::Result<Vec<(&'static str, Vec<u8>)>> {
    let ids: Map<String, Value> = ["bos_token_id", "eos_token_id", "pad_token_id"]
        .into_iter()
        .filter_map(|key| {
            Some((
                key.to_string(),
                config.get(key).filter(|v| !v.is_null())?.clone(),
            ))
        })
        .collect();
    if side_file(&carried, TOKENIZER_CONFIG_FILE).is_none() {
        let mut tokenizer_config = json!({ "tokenizer_class": "PreTrainedTokenizerFast" });
        for (id_key, token_key) in [("bos_token_id", "bos_token"), ("eos_token_id", "eos_token")] {
            // A list of end tokens names its first as the tokenizer's.
            let id = ids
                .get(id_key)
                .and_then(|v| v.as_u64().or_else(|| v.get(0)?.as_u64()));
            if let Some(token) = id.and_then(|id| tokenizer.id_to_token(u32::try_from(id).ok()?)) {
                tokenizer_config[token_key] = Value::String(token);
            }
        }
        carried.push((TOKENIZER_CONFIG_FILE, pretty(&tokenizer_config)));
    }
    if side_file(&carried, CHAT_TEMPLATE_FILE).is_none() {
        let bytes = side_file(&carried, TOKENIZER_CONFIG_FILE).expect("written above");
        let tokenizer_config: Value = serde_json::from_slice(bytes)
            .with_context(|| format!("the carried {TOKENIZER_CONFIG_FILE} is not JSON"))?;
        let template = chat_template_of(&tokenizer_config).map_err(anyhow::Error::msg)?;
        if let Some(template) = template {
            carried.push((CHAT_TEMPLATE_FILE, template.into_bytes()));
        }
    }
    if side_file(&carried, GENERATION_CONFIG_FILE).is_none() && !ids.is_empty() {
        let mut generation = ids;
        generation.insert("_from_model_config".into(), Value::Bool(true));
        carried.push((GENERATION_CONFIG_FILE, pretty(&Value::Object(generation))));
    }
    carried.sort_by_key(|(name, _)| SIDE_FILES.iter().position(|n| n == name));
    Ok(carried)
}

/// `value` as transformers writes JSON: indented, with a final newline.
fn pretty(value: &Value) -> Vec<u8> {
    let mut text = serde_json::to_string_pretty(value).expect("a JSON value serializes");
    text.push('\n');
    text.into_bytes()
}
