//! The rows' models and data: the GPT's width, the Llama's config, and windows of token ids
//! from a fixed generator, enough for a row's steps.

use crate::char_corpus::CharWindows;
use crate::char_gpt::GptConfig;
use crate::BATCH;
use wick::models::CausalLm;
use wick::trainer::DataLoader;

/// A row's steps: the first `warmup` untimed (first allocations, the optimizer's state),
/// then `measured` timed.
#[derive(Clone, Copy)]
pub(crate) struct Steps {
    pub(crate) warmup: usize,
    pub(crate) measured: usize,
}

impl Steps {
    pub(crate) fn total(self) -> usize {
        self.warmup + self.measured
    }
}

/// The GPT of width `d_model`: the main job's model scaled up.
pub(crate) fn config(d_model: usize) -> GptConfig {
    GptConfig {
        vocab: 96,
        block: 64,
        d_model,
        n_layer: 4,
        n_head: 4,
    }
}

/// The Llama of `--llama`, as a Hugging Face config.
const LLAMA: &str = r#"{"model_type": "llama", "vocab_size": 8192, "hidden_size": 512,
    "intermediate_size": 1408, "num_hidden_layers": 4, "num_attention_heads": 8,
    "num_key_value_heads": 4, "max_position_embeddings": 256, "rms_norm_eps": 1e-5,
    "rope_theta": 10000.0, "tie_word_embeddings": false}"#;
pub(crate) const LLAMA_SEQ: usize = 256;
pub(crate) const LLAMA_BATCH: usize = 8;

/// The `--llama` model, fresh.
pub(crate) fn llama_model() -> anyhow::Result<CausalLm> {
    Ok(CausalLm::from_config_json(
        LLAMA.into(),
        std::path::Path::new("llama.json"),
    )?)
}

/// The `--llama` data for `steps`: windows of token ids from a fixed generator, in global
/// batches.
pub(crate) fn llama_data(steps: Steps) -> DataLoader<CharWindows> {
    random_windows(8192, LLAMA_SEQ, LLAMA_BATCH, 7, steps)
}

/// Windows of `seq` + 1 token ids below `vocab` from a fixed generator (`seed`), enough for
/// every one of `steps`, in global batches of `batch`.
pub(crate) fn random_windows(
    vocab: u64,
    seq: usize,
    batch: usize,
    seed: u64,
    steps: Steps,
) -> DataLoader<CharWindows> {
    let ids = lcg_ids(seed, (steps.total() + 2) * batch * (seq + 1), vocab);
    DataLoader::new(CharWindows::new(ids, seq, seq + 1), batch)
}

/// The GPT's windows for `steps`, from the same generator: the benchmark is about speed,
/// not learning.
pub(crate) fn data(c: &GptConfig, steps: Steps) -> CharWindows {
    let len = (steps.total() + 2) * BATCH * c.block + c.block + 1;
    CharWindows::new(lcg_ids(42, len, c.vocab as u64), c.block, c.block)
}

/// `len` token ids below `vocab` from a 64-bit LCG started at `seed`.
fn lcg_ids(seed: u64, len: usize, vocab: u64) -> Vec<u32> {
    let mut s = seed;
    (0..len)
        .map(|_| {
            s = s
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            ((s >> 33) % vocab) as u32
        })
        .collect()
}
