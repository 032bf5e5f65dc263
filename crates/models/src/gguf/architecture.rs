//! llama.cpp's architectures of the families wick trains: the `config.json` of a file's
//! `{arch}.*` metadata, and each Hugging Face tensor's GGUF name and layout (llama.cpp's
//! converter permutes Llama's query and key rows for its rope, transposes GPT-2's Conv1D
//! weights, and stores Gemma's norms as 1 + weight).

use super::metadata::Metadata;
use crate::{Family, ModelConfig, ModelError};
use candle_core::Tensor;
use serde_json::{json, Value as Json};

/// How a GGUF tensor's values are laid out against Hugging Face's.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) enum Layout {
    /// The same values in the same order.
    Same,
    /// The rows of each of this many heads in llama.cpp's rope order: (pair, half) where
    /// Hugging Face has (half, pair).
    Permuted(usize),
    /// Transposed: llama.cpp's [out, in] of GPT-2's Conv1D [in, out].
    Transposed,
    /// 1 + the weight: Gemma's RMS norms scale by (1 + w), llama.cpp's by its stored value.
    PlusOne,
}

impl Layout {
    /// `t`, as the file holds it, in Hugging Face's layout.
    pub(crate) fn to_hf(self, t: Tensor) -> candle_core::Result<Tensor> {
        self.convert(t, false)
    }

    /// For each row of a `rows`-row weight in Hugging Face's layout, the file's row it is,
    /// where the layout moves whole rows (`Same`, `Permuted`); `None` where it does not.
    pub(crate) fn hf_rows(self, rows: usize) -> candle_core::Result<Option<Vec<usize>>> {
        if !matches!(self, Layout::Same | Layout::Permuted(_)) {
            return Ok(None);
        }
        // The file's row numbers, laid out as the values are: exact in f32 below 2^24.
        let numbers: Vec<f32> = (0..rows).map(|r| r as f32).collect();
        let moved = self.to_hf(Tensor::from_vec(
            numbers,
            (rows, 1),
            &candle_core::Device::Cpu,
        )?)?;
        let moved: Vec<f32> = moved.flatten_all()?.to_vec1()?;
        Ok(Some(moved.into_iter().map(|r| r as usize).collect()))
    }

    /// `t`, in Hugging Face's layout, as llama.cpp's converter writes it.
    pub(crate) fn to_gguf(self, t: Tensor) -> candle_core::Result<Tensor> {
        self.convert(t, true)
    }

    /// `t` from Hugging Face's layout to the file's (`to_gguf`) or back: the rope rows'
    /// (half, pair) order swapped one way or the other, the transpose its own inverse.
    fn convert(self, t: Tensor, to_gguf: bool) -> candle_core::Result<Tensor> {
        match self {
            Layout::Same => Ok(t),
            Layout::Permuted(heads) => {
                let (rows, cols) = rows_cols(&t)?;
                let shape = t.shape().clone();
                let split = match to_gguf {
                    true => (heads, 2, rows / heads / 2, cols),
                    false => (heads, rows / heads / 2, 2, cols),
                };
                t.reshape(split)?
                    .transpose(1, 2)?
                    .contiguous()?
                    .reshape(shape)
            }
            Layout::Transposed => t.t()?.contiguous(),
            Layout::PlusOne => t.affine(1.0, if to_gguf { 1.0 } else { -1.0 }),
        }
    }
}

/// A weight's rows and columns; a bias is rows of one column.
fn rows_cols(t: &Tensor) -> candle_core::Result<(usize, usize)> {
    match t.dims() {
        [rows] => Ok((*rows, 1)),
        [rows, cols] => Ok((*rows, *cols)),
        dims => candle_core::bail!("a permuted projection of {dims:?}"),
    }
}

/// The GGUF architecture name (`general.architecture`) of `config`: Mistral's files say
/// `llama`, as llama.cpp's converter writes them.
pub(crate) fn architecture_of(config: &ModelConfig) -> &'static str {
    match config {
        ModelConfig::Gpt2(_) => "gpt2",
        ModelConfig::Decoder(c) => match c.family {
            Family::Llama | Family::Mistral => "llama",
            Family::Qwen2 => "qwen2",
            Family::Qwen3 => "qwen3",
            Family::Gemma2 => "gemma2",
        },
    }
}

/// The GGUF name and layout of the Hugging Face tensor `hf` of a model of `config`, or
/// `None` for a name the family does not have.
pub(crate) fn gguf_name(config: &ModelConfig, hf: &str) -> Option<(String, Layout)> {
    let (prefix, block) = match config {
        ModelConfig::Gpt2(_) => ("transformer.h.", gpt2_block as fn(&ModelConfig, &str) -> _),
        ModelConfig::Decoder(_) => (
            "model.layers.",
            decoder_block as fn(&ModelConfig, &str) -> _,
        ),
    };
    if let Some(rest) = hf.strip_prefix(prefix) {
        let (index, name) = rest.split_once('.')?;
        index.parse::<usize>().ok()?;
        let (gguf, layout) = block(config, name)?;
        return Some((format!("blk.{index}.{gguf}"), layout));
    }
    let gemma = matches!(config, ModelConfig::Decoder(c) if c.family == Family::Gemma2);
    let (gguf, layout) = match hf {
        "model.embed_tokens.weight" | "transformer.wte.weight" => {
            ("token_embd.weight", Layout::Same)
        }
        "transformer.wpe.weight" => ("position_embd.weight", Layout::Same),
        "model.norm.weight" if gemma => ("output_norm.weight", Layout::PlusOne),
        "model.norm.weight" | "transformer.ln_f.weight" => ("output_norm.weight", Layout::Same),
        "transformer.ln_f.bias" => ("output_norm.bias", Layout::Same),
        "lm_head.weight" => ("output.weight", Layout::Same),
        _ => return None,
    };
    Some((gguf.to_string(), layout))
}

/// A decoder block's tensor `name` (after `model.layers.N.`).
fn decoder_block(config: &ModelConfig, name: &str) -> Option<(String, Layout)> {
    let ModelConfig::Decoder(c) = config else {
        return None;
    };
    let (module, kind) = name.rsplit_once('.')?;
    let gemma = c.family == Family::Gemma2;
    let permuted = |heads| match architecture_of(config) {
        "llama" => Layout::Permuted(heads),
        _ => Layout::Same,
    };
    let norm = if gemma { Layout::PlusOne } else { Layout::Same };
    let (gguf, layout) = match module {
        "input_layernorm" => ("attn_norm", norm),
        "self_attn.q_proj" => ("attn_q", permuted(c.num_attention_heads)),
        "self_attn.k_proj" => ("attn_k", permuted(c.num_key_value_heads)),
        "self_attn.v_proj" => ("attn_v", Layout::Same),
        "self_attn.o_proj" => ("attn_output", Layout::Same),
        "self_attn.q_norm" => ("attn_q_norm", Layout::Same),
        "self_attn.k_norm" => ("attn_k_norm", Layout::Same),
        "post_attention_layernorm" if gemma => ("post_attention_norm", norm),
        "post_attention_layernorm" | "pre_feedforward_layernorm" => ("ffn_norm", norm),
        "post_feedforward_layernorm" => ("post_ffw_norm", norm),
        "mlp.gate_proj" => ("ffn_gate", Layout::Same),
        "mlp.up_proj" => ("ffn_up", Layout::Same),
        "mlp.down_proj" => ("ffn_down", Layout::Same),
        _ => return None,
    };
    Some((format!("{gguf}.{kind}"), layout))
}

/// A GPT-2 block's tensor `name` (after `transformer.h.N.`).
fn gpt2_block(_: &ModelConfig, name: &str) -> Option<(String, Layout)> {
    let (module, kind) = name.rsplit_once('.')?;
    let gguf = match module {
        "ln_1" => "attn_norm",
        "attn.c_attn" => "attn_qkv",
        "attn.c_proj" => "attn_output",
        "ln_2" => "ffn_norm",
        "mlp.c_fc" => "ffn_up",
        "mlp.c_proj" => "ffn_down",
        _ => return None,
    };
    let layout = match kind {
        "weight" if module.contains('.') => Layout::Transposed,
        _ => Layout::Same,
    };
    Some((format!("{gguf}.{kind}"), layout))
}

/// The `config.json` of the model the file `meta` reads describes (the vocabulary's size
/// from `token_embd.weight`, tied where the file has no `output.weight`).
pub(crate) fn config_json(meta: &Metadata) -> Result<Json, ModelError> {
    let arch = meta
        .str("general.architecture")?
        .ok_or_else(|| meta.error("has no general.architecture"))?;
    if !["llama", "qwen2", "qwen3", "gemma2", "gpt2"].contains(&arch) {
        return Err(meta.error(format!(
            "architecture '{arch}': wick reads GGUF files of the llama, qwen2, qwen3, gemma2 \
             and gpt2 architectures"
        )));
    }
    let tensors = &meta.content.tensor_infos;
    let vocab = match tensors.get("token_embd.weight") {
        Some(info) => info.shape.dims()[0] as u64,
        None => return Err(meta.error("has no token_embd.weight")),
    };
    let tied = !tensors.contains_key("output.weight");
    let key = |k: &str| format!("{arch}.{k}");
    let need = |k: &str| meta.required(&key(k));
    let (hidden, layers, heads) = (
        need("embedding_length")?,
        need("block_count")?,
        need("attention.head_count")?,
    );
    let context = need("context_length")?;
    if arch == "gpt2" {
        return gpt2_config(meta, vocab);
    }
    let (architecture, model_type) = match arch {
        "llama" => ("LlamaForCausalLM", "llama"),
        "qwen2" => ("Qwen2ForCausalLM", "qwen2"),
        "qwen3" => ("Qwen3ForCausalLM", "qwen3"),
        _ => ("Gemma2ForCausalLM", "gemma2"),
    };
    let kv_heads = meta.u64(&key("attention.head_count_kv"))?.unwrap_or(heads);
    let head_dim = meta
        .u64(&key("attention.key_length"))?
        .unwrap_or(hidden / heads);
    let mut config = json!({
        "architectures": [architecture],
        "model_type": model_type,
        "hidden_size": hidden,
        "intermediate_size": need("feed_forward_length")?,
        "num_hidden_layers": layers,
        "num_attention_heads": heads,
        "num_key_value_heads": kv_heads,
        "head_dim": head_dim,
        "rms_norm_eps": meta.f64(&key("attention.layer_norm_rms_epsilon"))?.unwrap_or(1e-5),
        "rope_theta": meta.f64(&key("rope.freq_base"))?.unwrap_or(10000.0),
        "max_position_embeddings": context,
        "vocab_size": vocab,
        "tie_word_embeddings": tied,
        "bos_token_id": meta.u64("tokenizer.ggml.bos_token_id")?,
        "eos_token_id": meta.u64("tokenizer.ggml.eos_token_id")?,
    });
    if let (Some("linear"), Some(factor)) = (
        meta.str(&key("rope.scaling.type"))?,
        meta.f64(&key("rope.scaling.factor"))?,
    ) {
        config["rope_scaling"] = json!({"rope_type": "linear", "factor": factor});
    }
    if arch == "gemma2" {
        gemma2_fields(meta, &mut config)?;
    }
    Ok(config)
}

/// GPT-2's `config.json` (`gpt2.*`).
fn gpt2_config(meta: &Metadata, vocab: u64) -> Result<Json, ModelError> {
    let need = |k: &str| meta.required(&format!("gpt2.{k}"));
    let context = need("context_length")?;
    Ok(json!({
        "architectures": ["GPT2LMHeadModel"], "model_type": "gpt2",
        "n_embd": need("embedding_length")?, "n_layer": need("block_count")?,
        "n_head": need("attention.head_count")?, "n_positions": context, "n_ctx": context,
        "n_inner": meta.u64("gpt2.feed_forward_length")?,
        "layer_norm_epsilon": meta.f64("gpt2.attention.layer_norm_epsilon")?.unwrap_or(1e-5),
        "vocab_size": vocab, "tie_word_embeddings": true,
        "bos_token_id": meta.u64("tokenizer.ggml.bos_token_id")?,
        "eos_token_id": meta.u64("tokenizer.ggml.eos_token_id")?,
    }))
}

/// Gemma 2's fields beyond the decoders' (`gemma2.*`): the soft caps, the sliding window,
/// and the query scale as llama.cpp takes it (the file has no key for it): the head size,
/// or for the 27B (46 blocks) the width per head, as gemma_pytorch's config.
fn gemma2_fields(meta: &Metadata, config: &mut Json) -> Result<(), ModelError> {
    let layers = config["num_hidden_layers"].as_u64();
    let (hidden, heads) = (
        config["hidden_size"].as_u64(),
        config["num_attention_heads"].as_u64(),
    );
    config["query_pre_attn_scalar"] = match (layers, hidden, heads) {
        (Some(46), Some(hidden), Some(heads)) => json!(hidden / heads),
        _ => config["head_dim"].clone(),
    };
    config["hidden_activation"] = json!("gelu_pytorch_tanh");
    for cap in ["attn_logit_softcapping", "final_logit_softcapping"] {
        config[cap] = json!(meta.f64(&format!("gemma2.{cap}"))?);
    }
    let window = meta.u64("gemma2.attention.sliding_window")?.unwrap_or(4096);
    config["sliding_window"] = json!(window);
    Ok(())
}

/// The `rope_scaling` of a Llama 3 rope whose divisors llama.cpp stored (`rope_freqs.weight`,
/// its converter's: the unscaled frequency over the scaled). The divisors fix the factor (the
/// largest) and the two wavelengths between which the rope blends, not the three fields
/// that name them (scaling all three leaves the rope as it is): with `low_freq_factor` 1,
/// Meta's, the others are those of the first candidate whose rope gives the file's divisors
/// (Meta's 4 and 8192, then other powers of two); a file whose divisors none gives is
/// refused.
pub(crate) fn llama3_rope(
    meta: &Metadata,
    config: &Json,
    divisors: &[f32],
) -> Result<Json, ModelError> {
    let theta = config["rope_theta"].as_f64().unwrap_or(10000.0);
    let dim = config["head_dim"].as_u64().unwrap_or(0) as usize;
    let factor = divisors.iter().copied().fold(1.0f32, f32::max) as f64;
    let highs = [4.0, 2.0, 8.0, 16.0];
    let originals = std::iter::once(8192).chain((7..=20).map(|k| 1usize << k));
    for original in originals {
        for high in highs {
            let rope = crate::Rope {
                theta,
                scaling: crate::RopeScaling::Llama3 {
                    factor,
                    low_freq_factor: 1.0,
                    high_freq_factor: high,
                    original_max_position_embeddings: original,
                },
            };
            let made = crate::rope::llama3_divisors(&rope, dim).expect("a Llama 3 rope");
            let close = made.len() == divisors.len()
                && (made.iter().zip(divisors)).all(|(a, b)| (a - b).abs() <= 1e-4 * b.abs());
            if close {
                return Ok(json!({
                    "rope_type": "llama3", "factor": factor, "low_freq_factor": 1.0,
                    "high_freq_factor": high, "original_max_position_embeddings": original,
                }));
            }
        }
    }
    Err(meta.error(
        "rope_freqs.weight: divisors of no Llama 3 rope wick tried (low_freq_factor 1, \
         high_freq_factor 2 to 16, original_max_position_embeddings a power of two)",
    ))
}
