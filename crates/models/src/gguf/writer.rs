//! Writes a model as llama.cpp's GGUF: `{arch}.*` metadata from the config, the tokenizer as
//! `tokenizer.ggml.*` ([`super::vocab`]), and every tensor under llama.cpp's name in its
//! layout ([`Layout::to_gguf`]), in the type asked for (Candle's `quantized` module
//! quantizes); and a LoRA run's adapters as llama.cpp's GGUF LoRA adapter, which
//! `llama-cli --lora` applies over the base model's GGUF.

use super::architecture::{architecture_of, gguf_name, Layout};
use crate::{Family, ModelConfig, ModelError, RopeScaling, TextTokenizer};
use candle_core::quantized::gguf_file::{self, Value};
use candle_core::quantized::{GgmlDType, QTensor};
use candle_core::Tensor;
use std::collections::HashMap;
use std::path::Path;

/// The type a GGUF export stores its weight matrices in (vectors stay f32, as llama.cpp
/// keeps norms and biases).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GgufType {
    /// 32-bit floats: the weights as they are.
    F32,
    /// IEEE half precision.
    F16,
    /// bfloat16.
    Bf16,
    /// 8 bits per weight in blocks of 32 with an f16 scale.
    Q8_0,
    /// The 4-bit K-quant (blocks of 256; a matrix whose rows do not divide into them is
    /// written Q8_0, or f16 where rows do not divide into 32).
    Q4K,
    /// The 6-bit K-quant (the same fallbacks).
    Q6K,
}

impl GgufType {
    /// Candle's type for a matrix of rows `cols` long.
    fn for_matrix(self, cols: usize) -> GgmlDType {
        let wanted = match self {
            GgufType::F32 => GgmlDType::F32,
            GgufType::F16 => GgmlDType::F16,
            GgufType::Bf16 => GgmlDType::BF16,
            GgufType::Q8_0 => GgmlDType::Q8_0,
            GgufType::Q4K => GgmlDType::Q4K,
            GgufType::Q6K => GgmlDType::Q6K,
        };
        [wanted, GgmlDType::Q8_0, GgmlDType::F16]
            .into_iter()
            .find(|t| cols.is_multiple_of(t.block_size()))
            .expect("f16's blocks are single values")
    }

    /// llama.cpp's `general.file_type` (`llama_ftype`).
    fn file_type(self) -> u32 {
        match self {
            GgufType::F32 => 0,
            GgufType::F16 => 1,
            GgufType::Q8_0 => 7,
            GgufType::Q4K => 15,
            GgufType::Q6K => 18,
            GgufType::Bf16 => 32,
        }
    }
}

/// What a GGUF export holds beside the weights.
pub struct GgufExport<'a> {
    /// The model's config.
    pub config: &'a ModelConfig,
    /// `general.name`.
    pub name: &'a str,
    /// The tokenizer, written as `tokenizer.ggml.*`.
    pub tokenizer: &'a TextTokenizer,
    /// The BOS id (`tokenizer_config.json`'s token, or `config.json`'s id); where the
    /// tokenizer adds a BOS itself, that one.
    pub bos: Option<u32>,
    /// The EOS id, the same way.
    pub eos: Option<u32>,
    /// The chat template.
    pub chat_template: Option<&'a str>,
}

impl GgufExport<'_> {
    /// Writes `tensors` (every parameter of the config, by Hugging Face name, f32) with
    /// the metadata to the GGUF file `path`, matrices in `ty`.
    pub fn write(
        &self,
        path: &Path,
        tensors: &HashMap<String, Tensor>,
        ty: GgufType,
    ) -> Result<(), ModelError> {
        let failed = |message: String| ModelError::Missing {
            path: path.to_path_buf(),
            message,
        };
        let mut meta = vec![
            (
                "general.name".to_string(),
                Value::String(self.name.to_string()),
            ),
            ("general.file_type".to_string(), Value::U32(ty.file_type())),
            ("general.quantization_version".to_string(), Value::U32(2)),
        ];
        meta.extend(model_metadata(self.config).map_err(failed)?);
        meta.extend(super::vocab::metadata(
            self.tokenizer,
            self.config.vocab_size(),
            self.bos,
            self.eos,
            self.chat_template,
            path,
        )?);
        let mut out = Vec::new();
        for (name, _) in self.config.parameter_shapes() {
            let t = tensors
                .get(&name)
                .ok_or_else(|| failed(format!("no tensor {name} to write")))?;
            let (gguf, layout) = gguf_name(self.config, &name)
                .ok_or_else(|| failed(format!("{name} has no GGUF name")))?;
            let t = layout
                .to_gguf(t.clone())
                .map_err(|e| failed(format!("{name}: {e}")))?;
            let dtype = match t.dims() {
                [_, cols] => ty.for_matrix(*cols),
                _ => GgmlDType::F32,
            };
            let q = QTensor::quantize(&t, dtype).map_err(|e| failed(format!("{name}: {e}")))?;
            out.push((gguf, q));
        }
        if let ModelConfig::Decoder(c) = self.config {
            if let Some(divisors) = crate::rope::llama3_divisors(&c.rope, c.head_dim) {
                let n = divisors.len();
                let t = Tensor::from_vec(divisors, n, &candle_core::Device::Cpu)
                    .and_then(|t| QTensor::quantize(&t, GgmlDType::F32))
                    .map_err(|e| failed(format!("rope_freqs.weight: {e}")))?;
                out.push(("rope_freqs.weight".to_string(), t));
            }
        }
        write_file(path, &meta, &out)
    }

    /// Writes a LoRA run's adapters (`adapters`: wick's names, `{layer}.lora_A.weight` and
    /// `lora_B`, f32) as llama.cpp's GGUF LoRA adapter: `{gguf weight}.lora_a` and
    /// `.lora_b`, B's rows in llama.cpp's order where the weight's are permuted, and alpha
    /// such that alpha / r is the run's scale.
    pub fn write_adapter(
        config: &ModelConfig,
        adapters: &HashMap<String, Tensor>,
        scale: f64,
        rank: usize,
        path: &Path,
    ) -> Result<(), ModelError> {
        let failed = |message: String| ModelError::Missing {
            path: path.to_path_buf(),
            message,
        };
        let meta = vec![
            (
                "general.architecture".to_string(),
                Value::String(architecture_of(config).into()),
            ),
            ("general.type".to_string(), Value::String("adapter".into())),
            ("adapter.type".to_string(), Value::String("lora".into())),
            (
                "adapter.lora.alpha".to_string(),
                Value::F32((scale * rank as f64) as f32),
            ),
        ];
        let mut names: Vec<&String> = adapters.keys().collect();
        names.sort();
        let mut out = Vec::new();
        for name in names {
            let (layer, part) = match (
                name.strip_suffix(".lora_A.weight"),
                name.strip_suffix(".lora_B.weight"),
            ) {
                (Some(layer), _) => (layer, "lora_a"),
                (_, Some(layer)) => (layer, "lora_b"),
                _ => return Err(failed(format!("{name} is not a LoRA adapter"))),
            };
            let weight = format!("{layer}.weight");
            let (gguf, layout) = gguf_name(config, &weight)
                .ok_or_else(|| failed(format!("{weight} has no GGUF name")))?;
            let mut t = adapters[name].clone();
            // B maps to the weight's rows: it takes their order; A maps from its columns.
            if part == "lora_b" && matches!(layout, Layout::Permuted(_)) {
                t = layout
                    .to_gguf(t)
                    .map_err(|e| failed(format!("{name}: {e}")))?;
            }
            let q = QTensor::quantize(&t, GgmlDType::F32)
                .map_err(|e| failed(format!("{name}: {e}")))?;
            out.push((format!("{gguf}.{part}"), q));
        }
        write_file(path, &meta, &out)
    }
}

/// Writes the GGUF file `path`.
fn write_file(
    path: &Path,
    meta: &[(String, Value)],
    tensors: &[(String, QTensor)],
) -> Result<(), ModelError> {
    let failed = |e: &dyn std::fmt::Display| ModelError::Missing {
        path: path.to_path_buf(),
        message: format!("writing: {e}"),
    };
    let meta: Vec<(&str, &Value)> = meta.iter().map(|(k, v)| (k.as_str(), v)).collect();
    let tensors: Vec<(&str, &QTensor)> = tensors.iter().map(|(k, t)| (k.as_str(), t)).collect();
    let mut file = std::io::BufWriter::new(std::fs::File::create(path).map_err(|e| failed(&e))?);
    gguf_file::write(&mut file, &meta, &tensors).map_err(|e| failed(&e))?;
    std::io::Write::flush(&mut file).map_err(|e| failed(&e))
}

/// The `general.architecture` and `{arch}.*` metadata of `config`, as llama.cpp's
/// converter writes them; what llama.cpp's architecture cannot express is refused.
fn model_metadata(config: &ModelConfig) -> Result<Vec<(String, Value)>, String> {
    let arch = architecture_of(config);
    let key = |k: &str| format!("{arch}.{k}");
    let int = |k: &str, v: usize| (key(k), Value::U32(v as u32));
    let float = |k: &str, v: f64| (key(k), Value::F32(v as f32));
    let mut meta = vec![(
        "general.architecture".to_string(),
        Value::String(arch.into()),
    )];
    // The sizes every family writes, under its own names in `config.json`.
    let (positions, width, blocks, inner, heads) = match config {
        ModelConfig::Gpt2(g) => (g.n_positions, g.n_embd, g.n_layer, g.n_inner, g.n_head),
        ModelConfig::Decoder(c) => (
            c.max_position_embeddings,
            c.hidden_size,
            c.num_hidden_layers,
            c.intermediate_size,
            c.num_attention_heads,
        ),
    };
    meta.extend([
        int("context_length", positions),
        int("embedding_length", width),
        int("block_count", blocks),
        int("feed_forward_length", inner),
        int("attention.head_count", heads),
    ]);
    let c = match config {
        ModelConfig::Gpt2(g) => {
            meta.push(float("attention.layer_norm_epsilon", g.layer_norm_epsilon));
            return Ok(meta);
        }
        ModelConfig::Decoder(c) => c,
    };
    meta.extend([
        int("attention.head_count_kv", c.num_key_value_heads),
        int("attention.key_length", c.head_dim),
        int("attention.value_length", c.head_dim),
        int("rope.dimension_count", c.head_dim),
        float("attention.layer_norm_rms_epsilon", c.rms_norm_eps),
        float("rope.freq_base", c.rope.theta),
        int("vocab_size", c.vocab_size),
    ]);
    match &c.rope.scaling {
        RopeScaling::Default => {}
        // llama.cpp reads a Llama 3 rope from its divisors, a tensor (`write` adds it).
        RopeScaling::Llama3 { .. } => {}
        RopeScaling::Linear { factor } => meta.extend([
            (key("rope.scaling.type"), Value::String("linear".into())),
            float("rope.scaling.factor", *factor),
        ]),
        other => {
            return Err(format!(
                "the rope scaling {other:?}: wick writes GGUF files of unscaled, linear and Llama 3 ropes"
            ))
        }
    }
    check_attention_scale(c, arch)?;
    let gemma = c.family == Family::Gemma2;
    if gemma {
        let window = c
            .layer_windows
            .iter()
            .flatten()
            .next()
            .copied()
            .unwrap_or(4096);
        meta.extend([
            float(
                "attn_logit_softcapping",
                c.attn_logit_softcapping.unwrap_or(0.0),
            ),
            float(
                "final_logit_softcapping",
                c.final_logit_softcapping.unwrap_or(0.0),
            ),
            int("attention.sliding_window", window),
        ]);
    } else if let Some(window) = c.layer_windows.iter().flatten().next() {
        log::warn!("llama.cpp's {arch} has no sliding window: the GGUF attends to every position, not the last {window}");
    }
    Ok(meta)
}

/// Refuses a query scale llama.cpp's architecture has no key for: it scales by the head
/// size, Gemma 2's 27B (46 blocks) by the width per head.
fn check_attention_scale(c: &crate::DecoderConfig, arch: &str) -> Result<(), String> {
    let scaled_by = match (c.family, c.num_hidden_layers) {
        (Family::Gemma2, 46) => c.hidden_size / c.num_attention_heads,
        _ => c.head_dim,
    };
    if (c.attention_scale - 1.0 / (scaled_by as f64).sqrt()).abs() > 1e-9 {
        return Err(format!(
            "an attention scale of {} (llama.cpp's {arch} scales by 1/sqrt({scaled_by}))",
            c.attention_scale
        ));
    }
    Ok(())
}
