//! A tokenizer's chat template (`chat_template.jinja`, as transformers 5 saves it, or
//! `tokenizer_config.json`'s `chat_template`, as earlier versions did; rendered by minijinja
//! as `transformers` renders it with Jinja), which instruction data's conversations go
//! through ([`crate::Example`]).

use crate::error::read_text;
use crate::ModelError;
use serde_json::Value;
use std::path::Path;

/// A chat template, compiled once, and the special tokens it may name.
#[derive(Clone, Debug)]
pub struct ChatTemplate {
    env: minijinja::Environment<'static>,
    bos_token: String,
    eos_token: String,
}

/// The template with `transformers`' `{% generation %}` ... `{% endgeneration %}` tags (which
/// mark the assistant's text for its own mask, and which Jinja does not know) made plain
/// `{% if true %}` ... `{% endif %}` blocks, their whitespace control kept: wick finds the
/// assistant's text by rendering turn by turn instead.
fn without_generation_blocks(source: &str) -> String {
    let mut out = String::with_capacity(source.len());
    let mut rest = source;
    while let Some(at) = rest.find("{%") {
        out.push_str(&rest[..at]);
        let tag = &rest[at..];
        let Some(end) = tag.find("%}") else {
            break;
        };
        let inner = &tag[2..end];
        let (open, body) = match inner.strip_prefix(['-', '+']) {
            Some(b) => (&inner[..1], b),
            None => ("", inner),
        };
        let (body, close) = match body.strip_suffix(['-', '+']) {
            Some(b) => (b, &inner[inner.len() - 1..]),
            None => (body, ""),
        };
        match body.trim() {
            "generation" => out.push_str(&format!("{{%{open} if true {close}%}}")),
            "endgeneration" => out.push_str(&format!("{{%{open} endif {close}%}}")),
            _ => out.push_str(&tag[..end + 2]),
        }
        rest = &tag[end + 2..];
    }
    out.push_str(rest);
    out
}

/// The error of a tokenizer file at `path`.
fn tokenizer_error(path: &Path, message: String) -> ModelError {
    ModelError::Tokenizer {
        path: path.to_path_buf(),
        message,
    }
}

/// The chat template a `tokenizer_config.json` holds: its `chat_template`, or the one named
/// `default` of a list of named templates.
pub fn chat_template_of(config: &Value) -> Result<Option<String>, String> {
    match config.get("chat_template") {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) => Ok(Some(s.clone())),
        Some(Value::Array(named)) => named
            .iter()
            .find(|t| t.get("name").and_then(Value::as_str) == Some("default"))
            .and_then(|t| t.get("template")?.as_str())
            .map(|t| Some(t.to_string()))
            .ok_or_else(|| "'chat_template' lists no template named \"default\"".into()),
        Some(v) => Err(format!("'chat_template' must be a string, got {v}")),
    }
}

/// A token given as a string or as an added token's `{"content": ...}`.
fn token_text(v: Option<&Value>) -> Option<String> {
    match v? {
        Value::String(s) => Some(s.clone()),
        Value::Object(m) => m.get("content")?.as_str().map(str::to_string),
        _ => None,
    }
}

/// The file transformers 5 saves a tokenizer's chat template in, beside its
/// `tokenizer_config.json`.
pub const CHAT_TEMPLATE_FILE: &str = "chat_template.jinja";
/// The tokenizer's options file: special tokens, and before transformers 5 the chat template.
pub const TOKENIZER_CONFIG_FILE: &str = "tokenizer_config.json";

impl ChatTemplate {
    /// The chat template of the tokenizer in `dir`: `chat_template.jinja` where the
    /// directory has one (transformers 5's layout), otherwise `tokenizer_config.json`'s
    /// `chat_template`; its special tokens from `tokenizer_config.json`. `None` when neither
    /// holds a template.
    pub fn from_dir(dir: impl AsRef<Path>) -> Result<Option<Self>, ModelError> {
        let dir = dir.as_ref();
        let config = dir.join(TOKENIZER_CONFIG_FILE);
        let jinja = dir.join(CHAT_TEMPLATE_FILE);
        match (jinja.is_file(), config.is_file()) {
            (true, _) => Self::from_file(jinja).map(Some),
            (false, true) => Self::from_tokenizer_config(config),
            (false, false) => Ok(None),
        }
    }

    /// The template a file holds: a `chat_template.jinja` (its special tokens from the
    /// `tokenizer_config.json` beside it, if any), a `tokenizer_config.json` or a GGUF file
    /// (`tokenizer.chat_template`) that must hold one.
    pub fn from_file(path: impl AsRef<Path>) -> Result<Self, ModelError> {
        let path = path.as_ref();
        let none = || ModelError::Tokenizer {
            path: path.to_path_buf(),
            message: "holds no chat_template".into(),
        };
        if path.extension().is_some_and(|e| e == "jinja") {
            let beside = path.with_file_name(TOKENIZER_CONFIG_FILE);
            let config = match beside.is_file() {
                true => Some(read_text(&beside)?),
                false => None,
            };
            return Self::from_texts(path, Some(read_text(path)?), config.as_deref())?
                .ok_or_else(none);
        }
        if crate::is_gguf(path) {
            let config = crate::GgufTokenizer::open(path)?.map(|t| t.tokenizer_config);
            return Self::from_texts(path, None, config.as_deref())?.ok_or_else(none);
        }
        Self::from_tokenizer_config(path)?.ok_or_else(none)
    }

    /// The template of `tokenizer_config.json` at `path` (its `chat_template`, or the one
    /// named `default` of a list), with its `bos_token` and `eos_token`; `None` when it has
    /// no template.
    pub fn from_tokenizer_config(path: impl AsRef<Path>) -> Result<Option<Self>, ModelError> {
        let path = path.as_ref();
        Self::from_texts(path, None, Some(&read_text(path)?))
    }

    /// The template of a tokenizer's files as texts: `chat_template.jinja`'s, or else the
    /// `chat_template` of `tokenizer_config.json`'s (which names the special tokens either
    /// way); `None` when neither holds one. `path` names them in errors.
    pub fn from_texts(
        path: &Path,
        jinja: Option<String>,
        tokenizer_config: Option<&str>,
    ) -> Result<Option<Self>, ModelError> {
        let config = match tokenizer_config {
            Some(text) => serde_json::from_str(text).map_err(|e| {
                tokenizer_error(path, format!("{TOKENIZER_CONFIG_FILE}: not JSON: {e}"))
            })?,
            None => Value::Null,
        };
        let source = match jinja {
            Some(source) => Some(source),
            None => chat_template_of(&config).map_err(|message| tokenizer_error(path, message))?,
        };
        source
            .map(|source| Self::compiled(path, source, &config))
            .transpose()
    }

    /// `source` compiled, with the special tokens of `config` (a `tokenizer_config.json`).
    /// A template that does not parse is an error now, not at the first example.
    fn compiled(path: &Path, source: String, config: &Value) -> Result<Self, ModelError> {
        let env = environment(without_generation_blocks(&source))
            .map_err(|e| tokenizer_error(path, format!("chat_template: {e}")))?;
        Ok(ChatTemplate {
            env,
            bos_token: token_text(config.get("bos_token")).unwrap_or_default(),
            eos_token: token_text(config.get("eos_token")).unwrap_or_default(),
        })
    }

    /// The end-of-text token the config names (`eos_token`), if any.
    pub fn eos_token(&self) -> Option<&str> {
        Some(self.eos_token.as_str()).filter(|t| !t.is_empty())
    }

    /// `messages` rendered as `apply_chat_template(messages, tokenize=False,
    /// add_generation_prompt=...)` renders them.
    pub fn render(
        &self,
        messages: &[Value],
        add_generation_prompt: bool,
    ) -> Result<String, String> {
        let template = self
            .env
            .get_template("chat_template")
            .map_err(|e| e.to_string())?;
        template
            .render(minijinja::context! {
                messages => jinja_value(&Value::Array(messages.to_vec())),
                add_generation_prompt => add_generation_prompt,
                bos_token => self.bos_token.as_str(),
                eos_token => self.eos_token.as_str(),
            })
            .map_err(|e| {
                let mut message = e.to_string();
                let mut cause = std::error::Error::source(&e);
                while let Some(c) = cause {
                    message.push_str(&format!(": {c}"));
                    cause = c.source();
                }
                message
            })
    }
}

/// A JSON value as a template value (objects keep their keys' order).
fn jinja_value(v: &Value) -> minijinja::Value {
    match v {
        Value::Null => minijinja::Value::from(()),
        Value::Bool(b) => minijinja::Value::from(*b),
        Value::Number(n) => match (n.as_i64(), n.as_f64()) {
            (Some(i), _) => minijinja::Value::from(i),
            (None, Some(f)) => minijinja::Value::from(f),
            _ => minijinja::Value::from(n.to_string()),
        },
        Value::String(s) => minijinja::Value::from(s.as_str()),
        Value::Array(items) => items.iter().map(jinja_value).collect(),
        Value::Object(m) => {
            minijinja::Value::from_pairs(m.iter().map(|(k, v)| (k.as_str(), jinja_value(v))))
        }
    }
}

/// Jinja as `transformers` sets it up: blocks trimmed, Python's string methods, and
/// `raise_exception` for the templates that refuse a conversation.
fn environment(source: String) -> Result<minijinja::Environment<'static>, minijinja::Error> {
    let mut env = minijinja::Environment::new();
    let syntax = minijinja::syntax::SyntaxConfig::builder()
        .trim_blocks(true)
        .lstrip_blocks(true)
        .build()?;
    env.set_syntax(syntax);
    env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
    env.add_function("raise_exception", |message: String| -> Result<String, _> {
        Err(minijinja::Error::new(
            minijinja::ErrorKind::InvalidOperation,
            message,
        ))
    });
    env.add_template_owned("chat_template", source)?;
    Ok(env)
}

#[cfg(test)]
mod tests {
    use super::without_generation_blocks;

    #[test]
    fn generation_tags_become_plain_blocks_with_their_whitespace_control() {
        let t = "a{% generation %}b{%- endgeneration -%} c {{ x }}{% if y %}z{% endif %}";
        assert_eq!(
            without_generation_blocks(t),
            "a{% if true %}b{%- endif -%} c {{ x }}{% if y %}z{% endif %}"
        );
    }
}
