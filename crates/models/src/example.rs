//! Instruction data: one example of the schemas fine-tuning datasets use, tokenized with a
//! mask of the tokens the loss counts.
//!
//! - `text`: every token counts;
//! - `prompt`/`completion`: the completion's tokens (and the end of text) count, the
//!   prompt's do not;
//! - `messages` (role/content), ShareGPT's `conversations` (from/value, its role names) and
//!   Alpaca's `instruction`/`input`/`output` (a user turn and the answer): the conversation
//!   through the chat template; the tokens of each assistant turn, as the template renders
//!   it, count;
//! - `prompt`/`chosen`/`rejected`: a preference pair, two documents ([`PreferencePair`]).
//!
//! Special tokens as the tokenizer's post-processor adds them (a Llama 3 tokenizer's
//! `<|begin_of_text|>`) to text and prompts; none to a rendered conversation, whose template
//! writes its own, as `apply_chat_template` tokenizes. Each example ends with the end-of-text
//! token, so packed examples are separated by it.

use crate::{ChatTemplate, PreferencePair, TextTokenizer};
use serde_json::{json, Map, Value};

/// Which columns an example is read from: named, or found from the keys it has.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Schema {
    /// The first of `messages`, `conversations`, `instruction`, `prompt`/`completion` and
    /// `text` the example has.
    #[default]
    Auto,
    /// `text`.
    Text,
    /// `prompt` and `completion`.
    PromptCompletion,
    /// `messages`: a list of `{"role", "content"}`.
    Messages,
    /// ShareGPT's `conversations`: a list of `{"from", "value"}`, `from` one of `system`,
    /// `human`/`user`, `gpt`/`assistant` (and the other assistants' names ShareGPT uses).
    ShareGpt,
    /// Alpaca's `instruction`, `input` (may be empty or absent) and `output`.
    Alpaca,
    /// Preference pairs: `prompt`, `chosen` and `rejected` ([`PreferencePair`]).
    Preference,
}

/// One example of instruction data.
#[derive(Clone, Debug, PartialEq)]
pub enum Example {
    /// `{"text": ...}`.
    Text(String),
    /// `{"prompt": ..., "completion": ...}`.
    PromptCompletion {
        /// What the model is given.
        prompt: String,
        /// What it learns to answer.
        completion: String,
    },
    /// A conversation, as `messages` holds it: `[{"role": ..., "content": ...}, ...]`.
    Messages(Vec<Value>),
    /// A prompt with a chosen and a rejected completion: two documents
    /// ([`PreferencePair::encode`]).
    Preference(PreferencePair),
}

/// ShareGPT's speakers and the chat template's roles they are.
const SHAREGPT_ROLES: [(&str, &str); 9] = [
    ("system", "system"),
    ("human", "user"),
    ("user", "user"),
    ("gpt", "assistant"),
    ("assistant", "assistant"),
    ("chatgpt", "assistant"),
    ("bing", "assistant"),
    ("bard", "assistant"),
    ("tool", "tool"),
];

impl Example {
    /// The example a JSON line holds (its schema found from its keys), or what is wrong
    /// with it.
    pub fn from_json_line(line: &str) -> Result<Self, String> {
        let v: Value = serde_json::from_str(line).map_err(|e| format!("not JSON: {e}"))?;
        Self::from_value(&v, Schema::Auto)
    }

    /// The example a row (a JSON object: a JSON line, or a Parquet row as JSON) holds in
    /// `schema`, or what is wrong with it.
    pub fn from_value(row: &Value, schema: Schema) -> Result<Self, String> {
        let Value::Object(m) = row else {
            return Err("not a JSON object".into());
        };
        let schema = match schema {
            Schema::Auto => detected(m)?,
            named => named,
        };
        let string = |key: &str| match m.get(key) {
            Some(Value::String(s)) => Ok(s.clone()),
            Some(other) => Err(format!("'{key}' must be a string, got {other}")),
            None => Err(format!("has no '{key}'")),
        };
        match schema {
            Schema::Auto => unreachable!("detected above"),
            Schema::Text => Ok(Example::Text(string("text")?)),
            Schema::Preference => Ok(Example::Preference(PreferencePair::from_row(m)?)),
            Schema::PromptCompletion => Ok(Example::PromptCompletion {
                prompt: string("prompt")?,
                completion: string("completion")?,
            }),
            Schema::Messages => messages(m.get("messages"), "messages", "role", "content"),
            Schema::ShareGpt => messages(m.get("conversations"), "conversations", "from", "value"),
            Schema::Alpaca => {
                let input = match m.get("input") {
                    None | Some(Value::Null) => String::new(),
                    Some(_) => string("input")?,
                };
                let mut user = string("instruction")?;
                if !input.is_empty() {
                    user = format!("{user}\n\n{input}");
                }
                Ok(Example::Messages(vec![
                    json!({"role": "user", "content": user}),
                    json!({"role": "assistant", "content": string("output")?}),
                ]))
            }
        }
    }

    /// The example's ids and, for each, whether the loss counts it as a target; the
    /// end-of-text token `eos` (when given) closes it, counted unless the example is a
    /// conversation (whose template closes each turn itself).
    pub fn encode(
        &self,
        tokenizer: &TextTokenizer,
        template: Option<&ChatTemplate>,
        eos: Option<u32>,
    ) -> Result<(Vec<u32>, Vec<bool>), String> {
        let err = |e: candle_core::Error| e.to_string();
        let (mut ids, mut counted) = match self {
            Example::Text(text) => {
                let ids = tokenizer.encode_with_special_tokens(text).map_err(err)?;
                let n = ids.len();
                (ids, vec![true; n])
            }
            Example::PromptCompletion { prompt, completion } => {
                let mut ids = tokenizer.encode_with_special_tokens(prompt).map_err(err)?;
                let mut counted = vec![false; ids.len()];
                let answer = tokenizer.encode(completion).map_err(err)?;
                counted.resize(ids.len() + answer.len(), true);
                ids.extend(answer);
                (ids, counted)
            }
            Example::Messages(messages) => {
                let template = template.ok_or(
                    "a 'messages' line needs the tokenizer's chat template (chat_template.jinja, or \
                     tokenizer_config.json's chat_template, beside tokenizer.json; or \
                     --chat-template FILE)",
                )?;
                conversation(tokenizer, template, messages)?
            }
            Example::Preference(_) => {
                return Err("a preference pair is two documents: PreferencePair::encode".into())
            }
        };
        if let Some(eos) = eos {
            if ids.last() != Some(&eos) {
                ids.push(eos);
                counted.push(!matches!(self, Example::Messages(_)));
            }
        }
        Ok((ids, counted))
    }
}

/// A conversation's ids through `template`, each assistant turn's tokens counted: turn i is
/// the text between the conversation before it (with the generation prompt) and the
/// conversation through it, as the template renders both.
fn conversation(
    tokenizer: &TextTokenizer,
    template: &ChatTemplate,
    messages: &[Value],
) -> Result<(Vec<u32>, Vec<bool>), String> {
    let full = template.render(messages, false)?;
    let mut spans = Vec::new();
    for (i, message) in messages.iter().enumerate() {
        if message.get("role").and_then(Value::as_str) != Some("assistant") {
            continue;
        }
        let before = template.render(&messages[..i], true)?;
        let through = template.render(&messages[..=i], false)?;
        if !through.starts_with(&before) || !full.starts_with(&through) {
            return Err(format!(
                "the chat template does not render the conversation turn by turn (message {i}), \
                 so its assistant tokens cannot be told apart"
            ));
        }
        spans.push(before.len()..through.len());
    }
    let (ids, offsets) = tokenizer
        .encode_with_offsets(&full)
        .map_err(|e| e.to_string())?;
    let counted = offsets
        .iter()
        .map(|(start, _)| spans.iter().any(|s| s.contains(start)))
        .collect();
    Ok((ids, counted))
}

/// The schema of a row, found from its keys.
fn detected(m: &Map<String, Value>) -> Result<Schema, String> {
    let has = |key: &str| m.contains_key(key);
    Ok(match () {
        _ if has("chosen") && has("rejected") => Schema::Preference,
        _ if has("messages") => Schema::Messages,
        _ if has("conversations") => Schema::ShareGpt,
        _ if has("instruction") && has("output") => Schema::Alpaca,
        _ if has("prompt") || has("completion") => Schema::PromptCompletion,
        _ if has("text") => Schema::Text,
        _ => {
            let keys: Vec<&String> = m.keys().collect();
            return Err(format!(
                "has none of 'chosen'/'rejected', 'messages', 'conversations', \
                 'instruction'/'output', 'prompt'/'completion' and 'text' (its keys: {keys:?})"
            ));
        }
    })
}

/// The conversation of `list` (the column `column`), each turn's speaker under `speaker`
/// and text under `text`, as `messages`: ShareGPT's speakers named by the roles they are.
fn messages(
    list: Option<&Value>,
    column: &str,
    speaker: &str,
    text: &str,
) -> Result<Example, String> {
    let Some(Value::Array(turns)) = list else {
        return Err(format!(
            "'{column}' must be a list, got {}",
            list.unwrap_or(&Value::Null)
        ));
    };
    let sharegpt = speaker == "from";
    let mut out = Vec::with_capacity(turns.len());
    for (i, turn) in turns.iter().enumerate() {
        let Some(who) = turn.get(speaker).and_then(Value::as_str) else {
            return Err(format!("{column}[{i}] has no '{speaker}' string"));
        };
        if !sharegpt {
            out.push(turn.clone());
            continue;
        }
        let role = SHAREGPT_ROLES
            .iter()
            .find(|(name, _)| *name == who)
            .map(|(_, role)| *role)
            .ok_or_else(|| format!("{column}[{i}]: a speaker '{who}' ShareGPT does not name"))?;
        let Some(content) = turn.get(text).and_then(Value::as_str) else {
            return Err(format!("{column}[{i}] has no '{text}' string"));
        };
        out.push(json!({"role": role, "content": content}));
    }
    Ok(Example::Messages(out))
}
