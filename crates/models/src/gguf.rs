//! llama.cpp's GGUF files as a model's source: the config from the `llama.*` metadata, and
//! the weights dequantized to f32 on load by Candle's `quantized` module (every type it
//! reads), under Hugging Face's names, the query and key rows put back in Hugging Face's
//! order (llama.cpp's converter permutes them within each head for its rope).
//!
//! So far the `llama` architecture (Llama 2 and 3.x, SmolLM2, Mistral's files say `llama`
//! too); another is refused by name. The tokenizer in the file is not read yet.

use crate::ModelError;
use candle_core::quantized::gguf_file::{Content, Value};
use candle_core::{Device, Shape, Tensor};
use serde_json::json;
use std::collections::HashMap;
use std::ops::Range;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use wick_core::WeightSource;

/// A GGUF file, its metadata read, its tensors read when asked for.
pub struct GgufWeights {
    path: PathBuf,
    content: Content,
    /// Hugging Face name -> (GGUF name, heads whose rows llama.cpp permuted).
    names: HashMap<String, (String, Option<usize>)>,
    /// The last tensor read whole (a sharded load reads one tensor in slices, one after
    /// another).
    last: Mutex<Option<WholeTensor>>,
}

/// A tensor read whole, under its Hugging Face name.
struct WholeTensor {
    name: String,
    dims: Vec<usize>,
    values: Vec<f32>,
}

/// The metadata value `key`, as an unsigned integer.
fn meta_u64(content: &Content, key: &str) -> Option<u64> {
    content
        .metadata
        .get(key)
        .and_then(|v| v.to_u64().ok().or_else(|| v.to_u32().ok().map(u64::from)))
}

/// The metadata value `key`, as a float.
fn meta_f64(content: &Content, key: &str) -> Option<f64> {
    let value = content.metadata.get(key)?;
    value
        .to_f32()
        .map(f64::from)
        .or_else(|_| value.to_f64())
        .ok()
}

impl GgufWeights {
    /// The file at `path`, with the `config.json` text of the model its metadata describes.
    pub fn open(path: &Path) -> Result<(Self, String), ModelError> {
        let bad = |message: String| ModelError::Missing {
            path: path.to_path_buf(),
            message,
        };
        let mut file = std::fs::File::open(path).map_err(|e| bad(format!("cannot open: {e}")))?;
        let content = Content::read(&mut file).map_err(|e| bad(format!("not a GGUF file: {e}")))?;
        let arch = match content.metadata.get("general.architecture") {
            Some(Value::String(a)) => a.clone(),
            _ => return Err(bad("has no general.architecture".into())),
        };
        if arch != "llama" {
            return Err(bad(format!(
                "architecture '{arch}': wick reads GGUF files of the llama architecture so far"
            )));
        }
        let key = |k: &str| format!("{arch}.{k}");
        let need =
            |k: &str| meta_u64(&content, &key(k)).ok_or_else(|| bad(format!("has no {}", key(k))));
        let (hidden, layers, heads) = (
            need("embedding_length")?,
            need("block_count")?,
            need("attention.head_count")?,
        );
        let kv_heads = meta_u64(&content, &key("attention.head_count_kv")).unwrap_or(heads);
        let head_dim = meta_u64(&content, &key("attention.key_length")).unwrap_or(hidden / heads);
        let vocab = match content.tensor_infos.get("token_embd.weight") {
            Some(info) => info.shape.dims()[0] as u64,
            None => return Err(bad("has no token_embd.weight".into())),
        };
        let tied = !content.tensor_infos.contains_key("output.weight");
        let config = json!({
            "architectures": ["LlamaForCausalLM"],
            "model_type": "llama",
            "hidden_size": hidden,
            "intermediate_size": need("feed_forward_length")?,
            "num_hidden_layers": layers,
            "num_attention_heads": heads,
            "num_key_value_heads": kv_heads,
            "head_dim": head_dim,
            "rms_norm_eps": meta_f64(&content, &key("attention.layer_norm_rms_epsilon")).unwrap_or(1e-5),
            "rope_theta": meta_f64(&content, &key("rope.freq_base")).unwrap_or(10000.0),
            "max_position_embeddings": need("context_length")?,
            "vocab_size": vocab,
            "tie_word_embeddings": tied,
            "bos_token_id": meta_u64(&content, "tokenizer.ggml.bos_token_id"),
            "eos_token_id": meta_u64(&content, "tokenizer.ggml.eos_token_id"),
        });
        let names = llama_names(layers as usize, heads as usize, kv_heads as usize, tied);
        let weights = GgufWeights {
            path: path.to_path_buf(),
            content,
            names,
            last: Mutex::new(None),
        };
        Ok((
            weights,
            serde_json::to_string_pretty(&config).expect("JSON serializes"),
        ))
    }

    /// The tensor `name` (a GGUF name) dequantized to f32, in the file's layout.
    pub fn dequantized(&self, name: &str) -> candle_core::Result<Tensor> {
        let mut file = std::fs::File::open(&self.path)?;
        self.content
            .tensor(&mut file, name, &Device::Cpu)?
            .dequantize(&Device::Cpu)
    }

    /// The Hugging Face tensor `name`, whole, in f32.
    fn whole(&self, name: &str) -> candle_core::Result<WholeTensor> {
        let Some((gguf_name, permuted)) = self.names.get(name) else {
            candle_core::bail!("{}: no tensor for {name}", self.path.display())
        };
        let mut t = self.dequantized(gguf_name)?;
        if let Some(heads) = permuted {
            // llama.cpp's rows (head, half-dim, pair) back to Hugging Face's (head, pair,
            // half-dim).
            let (out, cols) = t.dims2()?;
            let half = out / heads / 2;
            t = t
                .reshape((*heads, half, 2, cols))?
                .transpose(1, 2)?
                .contiguous()?
                .reshape((out, cols))?;
        }
        Ok(WholeTensor {
            name: name.to_string(),
            dims: t.dims().to_vec(),
            values: t.flatten_all()?.to_vec1()?,
        })
    }
}

/// Hugging Face's names of a Llama of `layers` blocks, each with its GGUF name and the
/// heads over which llama.cpp permuted its rows (query and key projections).
fn llama_names(
    layers: usize,
    heads: usize,
    kv_heads: usize,
    tied: bool,
) -> HashMap<String, (String, Option<usize>)> {
    let mut names = HashMap::new();
    let mut add = |hf: String, gguf: String, permuted: Option<usize>| {
        names.insert(hf, (gguf, permuted));
    };
    add(
        "model.embed_tokens.weight".into(),
        "token_embd.weight".into(),
        None,
    );
    add(
        "model.norm.weight".into(),
        "output_norm.weight".into(),
        None,
    );
    if !tied {
        add("lm_head.weight".into(), "output.weight".into(), None);
    }
    let per_block = [
        ("input_layernorm", "attn_norm", None),
        ("self_attn.q_proj", "attn_q", Some(heads)),
        ("self_attn.k_proj", "attn_k", Some(kv_heads)),
        ("self_attn.v_proj", "attn_v", None),
        ("self_attn.o_proj", "attn_output", None),
        ("post_attention_layernorm", "ffn_norm", None),
        ("mlp.gate_proj", "ffn_gate", None),
        ("mlp.up_proj", "ffn_up", None),
        ("mlp.down_proj", "ffn_down", None),
    ];
    for i in 0..layers {
        for (hf, gguf, permuted) in per_block {
            add(
                format!("model.layers.{i}.{hf}.weight"),
                format!("blk.{i}.{gguf}.weight"),
                permuted,
            );
        }
    }
    names
}

impl WeightSource for GgufWeights {
    fn read(
        &self,
        name: &str,
        shape: &Shape,
        range: Range<usize>,
    ) -> candle_core::Result<Vec<f32>> {
        let mut last = self.last.lock().unwrap_or_else(|e| e.into_inner());
        if last.as_ref().map(|t| t.name.as_str()) != Some(name) {
            *last = Some(self.whole(name)?);
        }
        let WholeTensor { dims, values, .. } = last.as_ref().expect("read above");
        if dims != shape.dims() || range.end > values.len() {
            candle_core::bail!(
                "{}: {name} is {dims:?}, not the {shape:?} the model asks for",
                self.path.display()
            )
        }
        Ok(values[range].to_vec())
    }
}
