//! llama.cpp's GGUF files, read and written. Read as a model's source: the config from the
//! `{arch}.*` metadata, the tokenizer from `tokenizer.ggml.*` (with its chat template), and
//! the weights dequantized to f32 on load by Candle's `quantized` module, under Hugging
//! Face's names and in Hugging Face's layout. Written ([`GgufExport`]) the other way, in
//! f32, f16, bf16, Q8_0, Q4_K or Q6_K, and a LoRA run's adapters as llama.cpp's adapter
//! file. The architectures of the families wick trains: `llama` (Llama 2 and 3.x, SmolLM2,
//! Mistral), `qwen2`, `qwen3`, `gemma2` and `gpt2`.

mod architecture;
mod metadata;
mod tokenizer;
mod vocab;
mod weights;
mod writer;

pub use weights::GgufWeights;
pub use writer::{GgufExport, GgufType};

use crate::{ModelConfig, ModelError, TextTokenizer};
use candle_core::quantized::gguf_file::Content;
use metadata::Metadata;
use serde_json::json;
use std::path::Path;

/// What a GGUF file holds, as the files of a Hugging Face model directory.
pub struct GgufModel {
    /// `config.json`, from the architecture's metadata.
    pub config: String,
    /// The tokenizer's files, where the file has a vocabulary.
    pub tokenizer: Option<GgufTokenizer>,
    /// The tensors.
    pub weights: GgufWeights,
}

/// The tokenizer of a GGUF file, as the files of a Hugging Face model directory.
pub struct GgufTokenizer {
    /// `tokenizer.json`.
    pub tokenizer: String,
    /// `tokenizer_config.json`: the special tokens, whether BOS is added, and the chat
    /// template (`tokenizer.chat_template`).
    pub tokenizer_config: String,
    /// `generation_config.json`: BOS, and every id that ends a turn (EOS, end-of-turn).
    pub generation_config: String,
}

/// The metadata of the GGUF file at `path`.
fn read_content(path: &Path) -> Result<Content, ModelError> {
    let bad = |message: String| ModelError::Missing {
        path: path.to_path_buf(),
        message,
    };
    let mut file = std::fs::File::open(path).map_err(|e| bad(format!("cannot open: {e}")))?;
    Content::read(&mut file).map_err(|e| bad(format!("not a GGUF file: {e}")))
}

impl GgufTokenizer {
    /// The tokenizer of the GGUF file at `path` (a model, or a vocabulary alone as
    /// llama.cpp's `ggml-vocab-*.gguf`); `None` where it has no `tokenizer.ggml.tokens`.
    pub fn open(path: &Path) -> Result<Option<Self>, ModelError> {
        let content = read_content(path)?;
        Self::of(&Metadata {
            content: &content,
            path,
        })
    }

    /// `tokenizer` as a GGUF export writes it (for a model of `vocab_size` ids) and as it
    /// reads back: the files a reader of that GGUF gets. `path` names it in errors.
    pub fn written(
        tokenizer: &TextTokenizer,
        vocab_size: usize,
        path: &Path,
    ) -> Result<Self, ModelError> {
        let meta = vocab::metadata(tokenizer, vocab_size, None, None, None, path)?;
        Ok(Self::from_files(tokenizer::read_back(&meta, path)?))
    }

    fn of(meta: &Metadata) -> Result<Option<Self>, ModelError> {
        Ok(tokenizer::tokenizer_files(meta)?.map(Self::from_files))
    }

    fn from_files(files: tokenizer::TokenizerFiles) -> Self {
        let mut generation = json!({"bos_token_id": files.bos_id});
        generation["eos_token_id"] = match files.end_ids.as_slice() {
            [one] => json!(one),
            many => json!(many),
        };
        GgufTokenizer {
            tokenizer: files.tokenizer,
            tokenizer_config: files.tokenizer_config,
            generation_config: pretty(&generation),
        }
    }
}

impl GgufModel {
    /// Reads the GGUF file at `path`: its metadata now, its tensors as the model's
    /// parameters ask for them.
    pub fn open(path: &Path) -> Result<Self, ModelError> {
        let content = read_content(path)?;
        let meta = Metadata {
            content: &content,
            path,
        };
        let mut config = architecture::config_json(&meta)?;
        if content.tensor_infos.contains_key(ROPE_FREQS) {
            let divisors = dequantized(&content, path, ROPE_FREQS)?;
            config["rope_scaling"] = architecture::llama3_rope(&meta, &config, &divisors)?;
        }
        let config = pretty(&config);
        let tokenizer = GgufTokenizer::of(&meta)?;
        let model_config = ModelConfig::from_json(&config, path)?;
        Ok(GgufModel {
            config,
            tokenizer,
            weights: GgufWeights::new(path, content, model_config),
        })
    }
}

/// llama.cpp's tensor of a Llama 3 rope's frequency divisors.
const ROPE_FREQS: &str = "rope_freqs.weight";

/// The tensor `name` of the GGUF file at `path` (whose metadata is `content`), in f32.
fn dequantized(content: &Content, path: &Path, name: &str) -> Result<Vec<f32>, ModelError> {
    let read = || -> candle_core::Result<Vec<f32>> {
        let mut file = std::fs::File::open(path)?;
        let t = content.tensor(&mut file, name, &candle_core::Device::Cpu)?;
        t.dequantize(&candle_core::Device::Cpu)?
            .flatten_all()?
            .to_vec1()
    };
    read().map_err(|e| ModelError::Missing {
        path: path.to_path_buf(),
        message: format!("{name}: {e}"),
    })
}

/// `value` as transformers writes JSON: indented, with a final newline.
fn pretty(value: &serde_json::Value) -> String {
    serde_json::to_string_pretty(value).expect("a JSON value serializes") + "\n"
}

/// Whether the file at `path` is a GGUF file (its first bytes say so).
pub fn is_gguf(path: &Path) -> bool {
    use std::io::Read;
    let mut magic = [0u8; 4];
    std::fs::File::open(path)
        .and_then(|mut f| f.read_exact(&mut magic))
        .is_ok_and(|()| &magic == b"GGUF")
}
