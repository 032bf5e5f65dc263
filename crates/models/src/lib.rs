//! wick-models: causal language models of today's decoder families (Llama 2 and 3.x,
//! SmolLM2, Mistral, Qwen2/2.5, Qwen3, Gemma 2) and GPT-2, built from wick-nn's
//! training-grade layers, read from and written as Hugging Face checkpoints.
//!
//! It owns the families' code ([`CausalLm`]: one `ctx.wrap` unit per block, logits for
//! every position, and for generation the next token's over a [`KvCache`]; tuned on
//! preference pairs as a [`PreferenceLm`]), `config.json` ([`ModelConfig`]: every field read, checked
//! or refused by name), and `tokenizer.json` ([`TextTokenizer`], on the `tokenizers`
//! crate). Parameters keep Hugging Face's names, so that a consolidated checkpoint is a
//! Hugging Face state dict. It knows wick-core (the module traits) and wick-nn only: the
//! strategy that shards it and the trainer that runs it are chosen by the caller.

// Functions of at most 80 lines (clippy.toml), in library code; tests may run longer.
#![warn(clippy::too_many_lines)]

mod causal_lm;
mod chat;
mod config;
mod decoder;
mod error;
mod example;
mod generation;
mod gguf;
mod gpt2;
mod kv_cache;
mod layers;
mod lora;
mod preference;
mod preference_pair;
mod quantized_base;
mod rope;
mod scoring;
mod tokenizer;
mod weight_files;

pub use causal_lm::CausalLm;
pub use chat::{chat_template_of, ChatTemplate, CHAT_TEMPLATE_FILE, TOKENIZER_CONFIG_FILE};
pub use config::{
    Activation, ConfigError, DecoderConfig, Family, Gpt2Config, ModelConfig, Rope, RopeScaling,
};
pub use error::ModelError;
pub use example::{Example, Schema};
pub use generation::{generate, Sampling, TokenPicker};
pub use gguf::{is_gguf, GgufExport, GgufModel, GgufTokenizer, GgufType, GgufWeights};
pub use kv_cache::KvCache;
pub use lora::{
    LoraConfig, ADAPTER_CONFIG_FILE, ADAPTER_WEIGHTS_FILE, DECODER_TARGETS, PEFT_PREFIX,
};
pub use preference::{PreferenceConfig, PreferenceLm, PreferenceLoss, PREFERENCE_METRICS};
pub use preference_pair::{Document, PreferencePair};
pub use quantized_base::{
    is_base_linear_weight, is_embedding_weight, is_quantized_weight, QuantizedBase,
    QuantizedBaseRecord, QUANTIZED_BASE_FILE,
};
pub use tokenizer::TextTokenizer;
pub use wick_core::BlockFormat;

// What a crate that uses wick-models alone needs from wick-core to make a model's
// parameters and run it; the rest is reachable as `wick_models::wick_core`.
pub use wick_core;
pub use wick_core::{
    OptimizerConfig, ParamInit, ParamRequest, ParamSource, PretrainedWeights, ShardedContext,
    SoloWorld, TrainModule, WeightSource,
};
