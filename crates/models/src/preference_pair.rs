//! Preference data: a prompt with a chosen and a rejected completion (TRL's preference
//! schema), tokenized as TRL's `DPOTrainer` tokenizes it.

use crate::{ChatTemplate, TextTokenizer};
use serde_json::{Map, Value};

/// One row of preference data: `prompt`, `chosen` and `rejected`, each text, or each a list
/// of messages (the prompt's turns; each completion's turns after them). Without
/// `prompt`, the messages `chosen` and `rejected` begin with are the prompt (TRL's implicit
/// prompt).
#[derive(Clone, Debug, PartialEq)]
pub struct PreferencePair {
    prompt: Value,
    chosen: Value,
    rejected: Value,
}

/// A tokenized document: its ids and whether each counts as a target.
pub type Document = (Vec<u32>, Vec<bool>);

impl PreferencePair {
    /// The pair a row holds, or what is wrong with it.
    pub(crate) fn from_row(m: &Map<String, Value>) -> Result<Self, String> {
        let column = |key: &str| match m.get(key) {
            Some(v @ (Value::String(_) | Value::Array(_))) => Ok(v.clone()),
            Some(other) => Err(format!(
                "'{key}' must be a string or a list of messages, got {other}"
            )),
            None => Err(format!("has no '{key}'")),
        };
        let (chosen, rejected) = (column("chosen")?, column("rejected")?);
        let prompt = match m.get("prompt") {
            Some(_) => column("prompt")?,
            None => implicit_prompt(&chosen, &rejected)?,
        };
        let (chosen, rejected) = match m.get("prompt") {
            Some(_) => (chosen, rejected),
            None => {
                let n = prompt.as_array().map_or(0, Vec::len);
                (rest(&chosen, n), rest(&rejected, n))
            }
        };
        let lists = [&prompt, &chosen, &rejected].map(Value::is_array);
        if lists.iter().any(|&l| l != lists[0]) {
            return Err(
                "'prompt', 'chosen' and 'rejected' must all be text or all be lists of \
                        messages"
                    .into(),
            );
        }
        Ok(PreferencePair {
            prompt,
            chosen,
            rejected,
        })
    }

    /// Its two documents, the prompt followed by the chosen completion, then by the rejected
    /// one, the completions' tokens counted: as TRL tokenizes them, the prompt alone and the
    /// prompt with each completion (text with the special tokens the tokenizer adds and
    /// each completion closed by the end-of-text token `eos`; messages through the chat
    /// template, the prompt with its generation prompt), the completion starting where the
    /// three first differ.
    pub fn encode(
        &self,
        tokenizer: &TextTokenizer,
        template: Option<&ChatTemplate>,
        eos: Option<u32>,
    ) -> Result<[Document; 2], String> {
        let err = |e: candle_core::Error| e.to_string();
        let (prompt, chosen, rejected) = match (&self.prompt, &self.chosen, &self.rejected) {
            (Value::Array(p), Value::Array(c), Value::Array(r)) => {
                let template = template.ok_or(
                    "preference rows of messages need the tokenizer's chat template \
                     (chat_template.jinja, or tokenizer_config.json's chat_template, beside \
                     tokenizer.json; or --chat-template FILE)",
                )?;
                let render = |turns: &[Value], generation: bool| {
                    let text = template.render(turns, generation)?;
                    tokenizer.encode(&text).map_err(err)
                };
                let joined = |c: &[Value]| [p.as_slice(), c].concat();
                (
                    render(p, true)?,
                    render(&joined(c), false)?,
                    render(&joined(r), false)?,
                )
            }
            (Value::String(p), Value::String(c), Value::String(r)) => {
                let end = eos
                    .and_then(|id| tokenizer.id_to_token(id))
                    .unwrap_or_default();
                let closed = |c: &str| match c.ends_with(&end) {
                    true => format!("{p}{c}"),
                    false => format!("{p}{c}{end}"),
                };
                let encode = |text: &str| tokenizer.encode_with_special_tokens(text).map_err(err);
                (encode(p)?, encode(&closed(c))?, encode(&closed(r))?)
            }
            _ => unreachable!("checked in from_row"),
        };
        let shared = common_prefix(&prompt, &chosen).min(common_prefix(&prompt, &rejected));
        let document = |ids: Vec<u32>, which: &str| {
            if ids.len() <= shared {
                return Err(format!(
                    "the {which} completion has no tokens after the prompt"
                ));
            }
            let counted = (0..ids.len()).map(|i| i >= shared).collect();
            Ok((ids, counted))
        };
        Ok([document(chosen, "chosen")?, document(rejected, "rejected")?])
    }
}

/// The messages `chosen` and `rejected` both begin with (TRL's `extract_prompt`).
fn implicit_prompt(chosen: &Value, rejected: &Value) -> Result<Value, String> {
    let (Value::Array(c), Value::Array(r)) = (chosen, rejected) else {
        return Err(
            "has no 'prompt' (only lists of messages carry their prompt in 'chosen' \
                    and 'rejected')"
                .into(),
        );
    };
    let n = c.iter().zip(r).take_while(|(a, b)| a == b).count();
    Ok(Value::Array(c[..n].to_vec()))
}

/// The messages of `list` after its first `n`.
fn rest(list: &Value, n: usize) -> Value {
    match list {
        Value::Array(turns) => Value::Array(turns[n.min(turns.len())..].to_vec()),
        other => other.clone(),
    }
}

/// How many ids `a` and `b` share at their start.
fn common_prefix(a: &[u32], b: &[u32]) -> usize {
    a.iter().zip(b).take_while(|(x, y)| x == y).count()
}
