//! A Hugging Face `config.json`, read into the shape of one of the families wick builds.
//!
//! Every field is accounted for: read (it sets a size), checked (it must hold the one value
//! wick computes, such as `hidden_act = "silu"`), or known to leave the math alone (token ids,
//! `transformers_version`). Any other field is an error naming it, so that a model whose
//! math wick does not reproduce (rope scaling, sliding windows) is refused, never trained
//! differently than `transformers` would.

use serde_json::{Map, Value};
use std::path::{Path, PathBuf};

/// A Llama-family model (`LlamaForCausalLM`: Llama 2 and 3, Mistral-style without a sliding
/// window, SmolLM-style).
#[derive(Debug, Clone, PartialEq)]
pub struct LlamaConfig {
    /// `vocab_size`.
    pub vocab_size: usize,
    /// `hidden_size`.
    pub hidden_size: usize,
    /// `intermediate_size`, the SiLU-gated MLP's width.
    pub intermediate_size: usize,
    /// `num_hidden_layers`.
    pub num_hidden_layers: usize,
    /// `num_attention_heads`.
    pub num_attention_heads: usize,
    /// `num_key_value_heads` (default: `num_attention_heads`).
    pub num_key_value_heads: usize,
    /// `head_dim` (default: `hidden_size / num_attention_heads`).
    pub head_dim: usize,
    /// `rms_norm_eps`.
    pub rms_norm_eps: f64,
    /// `rope_theta`, or `rope_parameters.rope_theta` (newer `transformers`).
    pub rope_theta: f64,
    /// `max_position_embeddings`.
    pub max_position_embeddings: usize,
    /// `tie_word_embeddings`: the output projection is the embedding.
    pub tie_word_embeddings: bool,
    /// `attention_bias`: biases on the q, k, v and o projections.
    pub attention_bias: bool,
    /// `mlp_bias`: biases on the gate, up and down projections.
    pub mlp_bias: bool,
    /// `initializer_range`: the standard deviation of a new model's weights.
    pub initializer_range: f64,
}

/// A GPT-2-family model (`GPT2LMHeadModel`): Conv1D weights stored `[in, out]`, `lm_head`
/// tied to `wte`.
#[derive(Debug, Clone, PartialEq)]
pub struct Gpt2Config {
    /// `vocab_size`.
    pub vocab_size: usize,
    /// `n_embd`.
    pub n_embd: usize,
    /// `n_layer`.
    pub n_layer: usize,
    /// `n_head`.
    pub n_head: usize,
    /// `n_positions`.
    pub n_positions: usize,
    /// `n_inner` (default `4 * n_embd`).
    pub n_inner: usize,
    /// `layer_norm_epsilon`.
    pub layer_norm_epsilon: f64,
    /// `initializer_range`.
    pub initializer_range: f64,
}

/// The model a `config.json` describes.
#[derive(Debug, Clone, PartialEq)]
pub enum ModelConfig {
    /// `model_type = "llama"` (or `"mistral"` without a sliding window).
    Llama(LlamaConfig),
    /// `model_type = "gpt2"`.
    Gpt2(Gpt2Config),
}

/// Why a `config.json` cannot be used.
#[derive(Debug, Clone, thiserror::Error)]
#[error("{}: {message}", path.display())]
pub struct ConfigError {
    /// The file.
    pub path: PathBuf,
    /// What is wrong, naming the field.
    pub message: String,
}

/// Fields that change nothing wick computes: token ids, generation and bookkeeping.
const NEUTRAL: &[&str] = &[
    "architectures",
    "bos_token_id",
    "eos_token_id",
    "pad_token_id",
    "dtype",
    "torch_dtype",
    "transformers_version",
    "use_cache",
    "model_type",
    "_name_or_path",
    "name_or_path",
    "initializer_range",
];

/// GPT-2 fields of its sequence-classification and summary heads, which a causal LM lacks.
const GPT2_HEADS: &[&str] = &[
    "summary_activation",
    "summary_first_dropout",
    "summary_proj_to_labels",
    "summary_type",
    "summary_use_proj",
    "task_specific_params",
    "n_ctx",
];

/// The fields of one config, taken as they are read; what is left at the end is refused.
struct Fields {
    path: PathBuf,
    map: Map<String, Value>,
}

impl Fields {
    fn error(&self, message: String) -> ConfigError {
        ConfigError {
            path: self.path.clone(),
            message,
        }
    }

    fn take(&mut self, key: &str) -> Option<Value> {
        self.map.remove(key).filter(|v| !v.is_null())
    }

    fn usize(&mut self, key: &str) -> Result<Option<usize>, ConfigError> {
        match self.take(key) {
            None => Ok(None),
            Some(v) => v
                .as_u64()
                .filter(|&n| n > 0)
                .map(|n| Some(n as usize))
                .ok_or_else(|| {
                    self.error(format!("field '{key}' must be a positive integer, got {v}"))
                }),
        }
    }

    fn required(&mut self, key: &str) -> Result<usize, ConfigError> {
        self.usize(key)?
            .ok_or_else(|| self.error(format!("field '{key}' is missing")))
    }

    fn float(&mut self, key: &str) -> Result<Option<f64>, ConfigError> {
        match self.take(key) {
            None => Ok(None),
            Some(v) => v
                .as_f64()
                .map(Some)
                .ok_or_else(|| self.error(format!("field '{key}' must be a number, got {v}"))),
        }
    }

    fn bool(&mut self, key: &str, default: bool) -> Result<bool, ConfigError> {
        match self.take(key) {
            None => Ok(default),
            Some(Value::Bool(b)) => Ok(b),
            Some(v) => Err(self.error(format!("field '{key}' must be true or false, got {v}"))),
        }
    }

    /// A field that must hold `want` when present (`want` also when absent).
    fn expect(&mut self, key: &str, want: &Value, why: &str) -> Result<(), ConfigError> {
        match self.take(key) {
            Some(v) if v != *want => Err(self.error(format!(
                "field '{key}' is {v}; wick supports only {want} ({why})"
            ))),
            _ => Ok(()),
        }
    }

    /// A dropout rate. wick trains without dropout, which changes training (not the
    /// forward at evaluation, where `transformers` applies none either): said once, on
    /// standard error, rather than refused, since published GPT-2 checkpoints set 0.1.
    fn dropout(&mut self, key: &str) -> Result<(), ConfigError> {
        if let Some(p) = self.float(key)?.filter(|&p| p != 0.0) {
            eprintln!(
                "note: {}: field '{key}' is {p}; wick trains without dropout",
                self.path.display()
            );
        }
        Ok(())
    }

    /// Refuses whatever was not read.
    fn finish(mut self, ignored: &[&str]) -> Result<(), ConfigError> {
        for key in NEUTRAL.iter().chain(ignored) {
            self.map.remove(*key);
        }
        match self.map.keys().next() {
            None => Ok(()),
            Some(key) => Err(self.error(format!(
                "field '{key}' is not supported by wick (it may change the model's math); \
                 remove it if it does not"
            ))),
        }
    }
}

impl ModelConfig {
    /// Reads and checks `config.json` at `path`.
    pub fn from_file(path: impl AsRef<Path>) -> Result<Self, ConfigError> {
        let path = path.as_ref();
        let text = std::fs::read_to_string(path).map_err(|e| ConfigError {
            path: path.to_path_buf(),
            message: e.to_string(),
        })?;
        Self::from_json(&text, path)
    }

    /// Reads and checks a `config.json` text (`path` names it in errors).
    pub fn from_json(text: &str, path: &Path) -> Result<Self, ConfigError> {
        let error = |message: String| ConfigError {
            path: path.to_path_buf(),
            message,
        };
        let map = match serde_json::from_str(text) {
            Ok(Value::Object(map)) => map,
            Ok(_) => return Err(error("not a JSON object".into())),
            Err(e) => return Err(error(format!("not JSON: {e}"))),
        };
        let fields = Fields {
            path: path.to_path_buf(),
            map,
        };
        let model_type = fields
            .map
            .get("model_type")
            .and_then(Value::as_str)
            .map(str::to_string);
        match model_type.as_deref() {
            Some("llama") | Some("mistral") => llama(fields).map(ModelConfig::Llama),
            Some("gpt2") => gpt2(fields).map(ModelConfig::Gpt2),
            Some(other) => Err(error(format!(
                "model_type '{other}' is not a family wick builds (llama, mistral, gpt2)"
            ))),
            None => Err(error("field 'model_type' is missing".into())),
        }
    }

    /// The vocabulary size.
    pub fn vocab_size(&self) -> usize {
        match self {
            ModelConfig::Llama(c) => c.vocab_size,
            ModelConfig::Gpt2(c) => c.vocab_size,
        }
    }

    /// The longest sequence the model takes.
    pub fn max_positions(&self) -> usize {
        match self {
            ModelConfig::Llama(c) => c.max_position_embeddings,
            ModelConfig::Gpt2(c) => c.n_positions,
        }
    }

    /// The number of scalar parameters.
    pub fn num_parameters(&self) -> usize {
        self.parameter_shapes()
            .iter()
            .map(|(_, s)| s.iter().product::<usize>())
            .sum()
    }

    /// The units wick wraps (one per decoder block; the embeddings, final norm and head on
    /// their own) and their element counts, in creation order.
    pub fn unit_sizes(&self) -> Vec<(String, usize)> {
        let mut units: Vec<(String, usize)> = Vec::new();
        for (name, shape) in self.parameter_shapes() {
            let parts: Vec<&str> = name.split('.').collect();
            // `model.layers.3.mlp.up_proj.weight` is in `model.layers.3`; `lm_head.weight`
            // in `lm_head`.
            let unit = match parts.as_slice() {
                [a, b @ ("layers" | "h"), i, ..] => format!("{a}.{b}.{i}"),
                [rest @ .., _] => rest.join("."),
                [] => String::new(),
            };
            let n: usize = shape.iter().product();
            match units.last_mut() {
                Some((u, total)) if *u == unit => *total += n,
                _ => units.push((unit, n)),
            }
        }
        units
    }

    /// Every parameter's Hugging Face name and shape, in the order wick creates them.
    pub fn parameter_shapes(&self) -> Vec<(String, Vec<usize>)> {
        let mut out = Vec::new();
        match self {
            ModelConfig::Llama(c) => {
                let (h, q, kv) = (
                    c.hidden_size,
                    c.num_attention_heads * c.head_dim,
                    c.num_key_value_heads * c.head_dim,
                );
                out.push(("model.embed_tokens.weight".into(), vec![c.vocab_size, h]));
                for i in 0..c.num_hidden_layers {
                    let p = |n: &str| format!("model.layers.{i}.{n}");
                    out.push((p("input_layernorm.weight"), vec![h]));
                    for (name, o, inp, bias) in [
                        ("self_attn.q_proj", q, h, c.attention_bias),
                        ("self_attn.k_proj", kv, h, c.attention_bias),
                        ("self_attn.v_proj", kv, h, c.attention_bias),
                        ("self_attn.o_proj", h, q, c.attention_bias),
                    ] {
                        out.push((p(&format!("{name}.weight")), vec![o, inp]));
                        if bias {
                            out.push((p(&format!("{name}.bias")), vec![o]));
                        }
                    }
                    out.push((p("post_attention_layernorm.weight"), vec![h]));
                    let m = c.intermediate_size;
                    for (name, o, inp) in [
                        ("mlp.gate_proj", m, h),
                        ("mlp.up_proj", m, h),
                        ("mlp.down_proj", h, m),
                    ] {
                        out.push((p(&format!("{name}.weight")), vec![o, inp]));
                        if c.mlp_bias {
                            out.push((p(&format!("{name}.bias")), vec![o]));
                        }
                    }
                }
                out.push(("model.norm.weight".into(), vec![h]));
                if !c.tie_word_embeddings {
                    out.push(("lm_head.weight".into(), vec![c.vocab_size, h]));
                }
            }
            ModelConfig::Gpt2(c) => {
                let e = c.n_embd;
                out.push(("transformer.wte.weight".into(), vec![c.vocab_size, e]));
                out.push(("transformer.wpe.weight".into(), vec![c.n_positions, e]));
                for i in 0..c.n_layer {
                    let p = |n: &str| format!("transformer.h.{i}.{n}");
                    for (name, shape) in [
                        ("ln_1.weight", vec![e]),
                        ("ln_1.bias", vec![e]),
                        ("attn.c_attn.weight", vec![e, 3 * e]),
                        ("attn.c_attn.bias", vec![3 * e]),
                        ("attn.c_proj.weight", vec![e, e]),
                        ("attn.c_proj.bias", vec![e]),
                        ("ln_2.weight", vec![e]),
                        ("ln_2.bias", vec![e]),
                        ("mlp.c_fc.weight", vec![e, c.n_inner]),
                        ("mlp.c_fc.bias", vec![c.n_inner]),
                        ("mlp.c_proj.weight", vec![c.n_inner, e]),
                        ("mlp.c_proj.bias", vec![e]),
                    ] {
                        out.push((p(name), shape));
                    }
                }
                out.push(("transformer.ln_f.weight".into(), vec![e]));
                out.push(("transformer.ln_f.bias".into(), vec![e]));
            }
        }
        out
    }
}

fn llama(mut f: Fields) -> Result<LlamaConfig, ConfigError> {
    let vocab_size = f.required("vocab_size")?;
    let hidden_size = f.required("hidden_size")?;
    let intermediate_size = f.required("intermediate_size")?;
    let num_hidden_layers = f.required("num_hidden_layers")?;
    let num_attention_heads = f.required("num_attention_heads")?;
    let num_key_value_heads = f
        .usize("num_key_value_heads")?
        .unwrap_or(num_attention_heads);
    if num_attention_heads % num_key_value_heads != 0 {
        return Err(f.error(format!(
            "field 'num_key_value_heads' ({num_key_value_heads}) must divide \
             'num_attention_heads' ({num_attention_heads})"
        )));
    }
    let head_dim = match f.usize("head_dim")? {
        Some(d) => d,
        None if hidden_size % num_attention_heads == 0 => hidden_size / num_attention_heads,
        None => {
            return Err(f.error(format!(
                "field 'hidden_size' ({hidden_size}) does not divide by 'num_attention_heads' \
                 ({num_attention_heads}) and there is no 'head_dim'"
            )))
        }
    };
    if head_dim % 2 != 0 {
        return Err(f.error(format!(
            "field 'head_dim' ({head_dim}) must be even for rotary embeddings"
        )));
    }
    let rms_norm_eps = f.float("rms_norm_eps")?.unwrap_or(1e-6);
    let rope_theta = rope_theta(&mut f)?;
    let max_position_embeddings = f.required("max_position_embeddings")?;
    let tie_word_embeddings = f.bool("tie_word_embeddings", false)?;
    let attention_bias = f.bool("attention_bias", false)?;
    let mlp_bias = f.bool("mlp_bias", false)?;
    let initializer_range = f
        .map
        .get("initializer_range")
        .and_then(Value::as_f64)
        .unwrap_or(0.02);
    f.expect("hidden_act", &"silu".into(), "the SiLU-gated MLP")?;
    f.expect("pretraining_tp", &1.into(), "the exact linear layers")?;
    f.dropout("attention_dropout")?;
    if let Some(v) = f.take("sliding_window") {
        return Err(f.error(format!(
            "field 'sliding_window' is {v}; wick's attention is full causal attention"
        )));
    }
    f.finish(&[])?;
    Ok(LlamaConfig {
        vocab_size,
        hidden_size,
        intermediate_size,
        num_hidden_layers,
        num_attention_heads,
        num_key_value_heads,
        head_dim,
        rms_norm_eps,
        rope_theta,
        max_position_embeddings,
        tie_word_embeddings,
        attention_bias,
        mlp_bias,
        initializer_range,
    })
}

/// `rope_theta`, from the field or from `rope_parameters` (which newer `transformers`
/// writes instead); a scaled rope (`rope_scaling`, or a `rope_type` other than default) is
/// refused.
fn rope_theta(f: &mut Fields) -> Result<f64, ConfigError> {
    if let Some(v) = f.take("rope_scaling") {
        return Err(f.error(format!(
            "field 'rope_scaling' is {v}; wick supports only unscaled rotary embeddings"
        )));
    }
    let field = f.float("rope_theta")?;
    let params = match f.take("rope_parameters") {
        None => None,
        Some(Value::Object(mut p)) => {
            if let Some(kind) = p.remove("rope_type").filter(|t| t != "default") {
                return Err(f.error(format!(
                    "field 'rope_parameters.rope_type' is {kind}; wick supports only \"default\""
                )));
            }
            let theta = p.remove("rope_theta").and_then(|t| t.as_f64());
            if let Some(key) = p.keys().next() {
                return Err(f.error(format!(
                    "field 'rope_parameters.{key}' is not supported by wick"
                )));
            }
            theta
        }
        Some(v) => {
            return Err(f.error(format!(
                "field 'rope_parameters' must be an object, got {v}"
            )))
        }
    };
    match (field, params) {
        (Some(a), Some(b)) if a != b => Err(f.error(format!(
            "'rope_theta' ({a}) and 'rope_parameters.rope_theta' ({b}) differ"
        ))),
        (Some(t), _) | (None, Some(t)) => Ok(t),
        (None, None) => Ok(10_000.0),
    }
}

fn gpt2(mut f: Fields) -> Result<Gpt2Config, ConfigError> {
    let vocab_size = f.required("vocab_size")?;
    let n_embd = f.required("n_embd")?;
    let n_layer = f.required("n_layer")?;
    let n_head = f.required("n_head")?;
    if n_embd % n_head != 0 {
        return Err(f.error(format!(
            "field 'n_embd' ({n_embd}) does not divide by 'n_head' ({n_head})"
        )));
    }
    let n_positions = f.required("n_positions")?;
    let n_inner = f.usize("n_inner")?.unwrap_or(4 * n_embd);
    let layer_norm_epsilon = f.float("layer_norm_epsilon")?.unwrap_or(1e-5);
    let initializer_range = f
        .map
        .get("initializer_range")
        .and_then(Value::as_f64)
        .unwrap_or(0.02);
    f.expect(
        "activation_function",
        &"gelu_new".into(),
        "GPT-2's tanh GELU",
    )?;
    f.expect(
        "tie_word_embeddings",
        &true.into(),
        "GPT-2 ties lm_head to wte",
    )?;
    f.expect(
        "scale_attn_weights",
        &true.into(),
        "attention scaled by 1/sqrt(head_dim)",
    )?;
    f.expect(
        "scale_attn_by_inverse_layer_idx",
        &false.into(),
        "unscaled layers",
    )?;
    f.expect(
        "reorder_and_upcast_attn",
        &false.into(),
        "wick computes attention in f32 already",
    )?;
    f.expect("add_cross_attention", &false.into(), "a decoder-only model")?;
    for dropout in ["resid_pdrop", "embd_pdrop", "attn_pdrop"] {
        f.dropout(dropout)?;
    }
    f.finish(GPT2_HEADS)?;
    Ok(Gpt2Config {
        vocab_size,
        n_embd,
        n_layer,
        n_head,
        n_positions,
        n_inner,
        layer_norm_epsilon,
        initializer_range,
    })
}
