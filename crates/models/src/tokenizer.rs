//! `TextTokenizer`: a Hugging Face `tokenizer.json`, loaded by the `tokenizers` crate, with
//! what wick needs of it: ids in and text out, its vocabulary size, its end-of-text token,
//! and a hash that names it (token files record which tokenizer made them).

use crate::error::read_text;
use crate::ModelError;
use sha2::{Digest, Sha256};
use std::path::Path;
use std::sync::Arc;

/// The names end-of-text tokens go by in common tokenizers (GPT-2, Llama 3, Llama 2).
const END_OF_TEXT: &[&str] = &["<|endoftext|>", "<|end_of_text|>", "</s>"];

/// A token's byte range in the text it was encoded from: (start, end).
pub type Span = (usize, usize);

/// A loaded tokenizer and the JSON it was loaded from.
#[derive(Clone)]
pub struct TextTokenizer {
    inner: Arc<tokenizers::Tokenizer>,
    json: Arc<String>,
}

impl std::fmt::Debug for TextTokenizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TextTokenizer")
            .field("vocab_size", &self.vocab_size())
            .field("hash", &self.hash())
            .finish()
    }
}

impl TextTokenizer {
    /// Loads `tokenizer.json` at `path`, or the tokenizer of a GGUF file
    /// ([`crate::GgufTokenizer`]).
    pub fn from_file(path: impl AsRef<Path>) -> Result<Self, ModelError> {
        let path = path.as_ref();
        if crate::is_gguf(path) {
            let gguf = crate::GgufTokenizer::open(path)?.ok_or_else(|| ModelError::Tokenizer {
                path: path.to_path_buf(),
                message: "the GGUF file holds no tokenizer.ggml.tokens".into(),
            })?;
            return Self::from_json(gguf.tokenizer, path);
        }
        let json = read_text(path)?;
        Self::from_json(json, path)
    }

    /// Loads a tokenizer from its JSON text (`path` names it in errors).
    pub fn from_json(json: String, path: &Path) -> Result<Self, ModelError> {
        let inner = tokenizers::Tokenizer::from_bytes(json.as_bytes()).map_err(|e| {
            ModelError::Tokenizer {
                path: path.to_path_buf(),
                message: e.to_string(),
            }
        })?;
        Ok(TextTokenizer {
            inner: Arc::new(inner),
            json: Arc::new(json),
        })
    }

    /// The JSON the tokenizer was loaded from (written back unchanged on export).
    pub fn json(&self) -> &str {
        &self.json
    }

    /// The SHA-256 of that JSON, in hex: the tokenizer's identity.
    pub fn hash(&self) -> String {
        Sha256::digest(self.json.as_bytes())
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect()
    }

    /// Ids in the vocabulary, added tokens included: every id is below this.
    pub fn vocab_size(&self) -> usize {
        self.inner.get_vocab_size(true)
    }

    /// The id of the token that ends a document, when the tokenizer has one.
    pub fn end_of_text(&self) -> Option<u32> {
        END_OF_TEXT.iter().find_map(|t| self.inner.token_to_id(t))
    }

    /// The ids of `text`, without special tokens added (documents are separated by
    /// [`TextTokenizer::end_of_text`] where one is wanted).
    pub fn encode(&self, text: &str) -> candle_core::Result<Vec<u32>> {
        self.inner
            .encode(text, false)
            .map(|e| e.get_ids().to_vec())
            .map_err(|e| candle_core::Error::Msg(format!("tokenizer: {e}")))
    }

    /// The ids of `text` with the special tokens the tokenizer's post-processor adds (a
    /// Llama 3 tokenizer's `<|begin_of_text|>`; none for GPT-2's), as `tokenizer(text)`
    /// gives them in Python.
    pub fn encode_with_special_tokens(&self, text: &str) -> candle_core::Result<Vec<u32>> {
        self.inner
            .encode(text, true)
            .map(|e| e.get_ids().to_vec())
            .map_err(|e| candle_core::Error::Msg(format!("tokenizer: {e}")))
    }

    /// The ids of `text` (no special tokens added) and each one's byte range in `text`.
    pub fn encode_with_offsets(&self, text: &str) -> candle_core::Result<(Vec<u32>, Vec<Span>)> {
        let e = self
            .inner
            .encode(text, false)
            .map_err(|e| candle_core::Error::Msg(format!("tokenizer: {e}")))?;
        Ok((e.get_ids().to_vec(), e.get_offsets().to_vec()))
    }

    /// The id of token `token`, if the vocabulary has it.
    pub fn token_to_id(&self, token: &str) -> Option<u32> {
        self.inner.token_to_id(token)
    }

    /// The token of id `id`, if the vocabulary has it.
    pub fn id_to_token(&self, id: u32) -> Option<String> {
        self.inner.id_to_token(id)
    }

    /// The text of `ids`.
    pub fn decode(&self, ids: &[u32]) -> candle_core::Result<String> {
        self.inner
            .decode(ids, false)
            .map_err(|e| candle_core::Error::Msg(format!("tokenizer: {e}")))
    }
}
