//! The decoder families wick builds on one code path: Llama (2, 3.x, SmolLM2), Mistral,
//! Qwen2/2.5, Qwen3 and Gemma 2, read from their `config.json` with `transformers`'
//! defaults for each `model_type`.

use super::fields::Fields;
use super::rope::{rope, Rope};
use super::ConfigError;
use serde_json::Value;

/// Which `model_type` a [`DecoderConfig`] was read as: it decides the defaults, and for
/// Gemma 2 the layer's shape (norms around each sublayer, `1 + w` norms, scaled
/// embeddings).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Family {
    /// `llama`: Llama 2 and 3.x, SmolLM2.
    Llama,
    /// `mistral`.
    Mistral,
    /// `qwen2`: Qwen2 and Qwen2.5.
    Qwen2,
    /// `qwen3`.
    Qwen3,
    /// `gemma2`.
    Gemma2,
}

/// The gated MLP's activation: `silu(gate) * up` or `gelu_tanh(gate) * up`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Activation {
    /// `silu`.
    Silu,
    /// `gelu_pytorch_tanh` (Gemma 2).
    GeluTanh,
}

/// A decoder-only model of one of the [`Family`]s: embeddings, layers of RMS-normed
/// grouped-query attention with rotary positions and a gated MLP, a final norm and the
/// output projection (or the embedding again, when tied).
#[derive(Debug, Clone, PartialEq)]
pub struct DecoderConfig {
    /// The `model_type`.
    pub family: Family,
    /// `vocab_size`.
    pub vocab_size: usize,
    /// `hidden_size`.
    pub hidden_size: usize,
    /// `intermediate_size`, the gated MLP's width.
    pub intermediate_size: usize,
    /// `num_hidden_layers`.
    pub num_hidden_layers: usize,
    /// `num_attention_heads`.
    pub num_attention_heads: usize,
    /// `num_key_value_heads` (default: `num_attention_heads`).
    pub num_key_value_heads: usize,
    /// `head_dim` (default `hidden_size / num_attention_heads`; 128 for Qwen3, 256 for
    /// Gemma 2).
    pub head_dim: usize,
    /// `rms_norm_eps`.
    pub rms_norm_eps: f64,
    /// `rope_theta` and `rope_scaling`/`rope_parameters`.
    pub rope: Rope,
    /// `max_position_embeddings`.
    pub max_position_embeddings: usize,
    /// `tie_word_embeddings`: the output projection is the embedding.
    pub tie_word_embeddings: bool,
    /// Biases on q, k and v (`attention_bias`; always on Qwen2).
    pub qkv_bias: bool,
    /// A bias on o (`attention_bias`; never on Qwen2).
    pub o_bias: bool,
    /// `mlp_bias`: biases on the gate, up and down projections.
    pub mlp_bias: bool,
    /// Qwen3's RMS norms of each query and key head (`q_norm`, `k_norm`).
    pub qk_norm: bool,
    /// The window of each layer's attention: `None` for full causal attention, the
    /// `sliding_window` for a sliding layer (Mistral: every layer; Qwen2: from
    /// `max_window_layers` on when `use_sliding_window`; Gemma 2: every other; or as
    /// `layer_types` says).
    pub layer_windows: Vec<Option<usize>>,
    /// The MLP's activation (`hidden_act`, Gemma's `hidden_activation`).
    pub activation: Activation,
    /// The attention scores' scale: `1/sqrt(head_dim)`, or Gemma 2's
    /// `query_pre_attn_scalar^-0.5`.
    pub attention_scale: f64,
    /// Gemma 2's `attn_logit_softcapping`.
    pub attn_logit_softcapping: Option<f64>,
    /// Gemma 2's `final_logit_softcapping`.
    pub final_logit_softcapping: Option<f64>,
    /// `initializer_range`: the standard deviation of a new model's weights.
    pub initializer_range: f64,
}

impl DecoderConfig {
    /// Gemma's layer: `1 + w` norms, the embedding times `sqrt(hidden_size)`, a norm after
    /// each sublayer as well as before.
    pub fn is_gemma(&self) -> bool {
        self.family == Family::Gemma2
    }

    /// The longest sequence the model takes: `max_position_embeddings`, or `factor` times
    /// it under a dynamic rope (which rescales past it).
    pub fn max_positions(&self) -> usize {
        match self.rope.scaling {
            super::RopeScaling::Dynamic { factor } => {
                (self.max_position_embeddings as f64 * factor) as usize
            }
            _ => self.max_position_embeddings,
        }
    }

    /// Every parameter's Hugging Face name and shape, in the order wick creates them.
    pub(crate) fn parameter_shapes(&self, out: &mut Vec<(String, Vec<usize>)>) {
        let (h, q, kv) = (
            self.hidden_size,
            self.num_attention_heads * self.head_dim,
            self.num_key_value_heads * self.head_dim,
        );
        out.push(("model.embed_tokens.weight".into(), vec![self.vocab_size, h]));
        for i in 0..self.num_hidden_layers {
            let p = |n: &str| format!("model.layers.{i}.{n}");
            out.push((p("input_layernorm.weight"), vec![h]));
            for (name, o, inp, bias) in [
                ("self_attn.q_proj", q, h, self.qkv_bias),
                ("self_attn.k_proj", kv, h, self.qkv_bias),
                ("self_attn.v_proj", kv, h, self.qkv_bias),
                ("self_attn.o_proj", h, q, self.o_bias),
            ] {
                out.push((p(&format!("{name}.weight")), vec![o, inp]));
                if bias {
                    out.push((p(&format!("{name}.bias")), vec![o]));
                }
            }
            if self.qk_norm {
                out.push((p("self_attn.q_norm.weight"), vec![self.head_dim]));
                out.push((p("self_attn.k_norm.weight"), vec![self.head_dim]));
            }
            out.push((p("post_attention_layernorm.weight"), vec![h]));
            if self.is_gemma() {
                out.push((p("pre_feedforward_layernorm.weight"), vec![h]));
            }
            let m = self.intermediate_size;
            for (name, o, inp) in [
                ("mlp.gate_proj", m, h),
                ("mlp.up_proj", m, h),
                ("mlp.down_proj", h, m),
            ] {
                out.push((p(&format!("{name}.weight")), vec![o, inp]));
                if self.mlp_bias {
                    out.push((p(&format!("{name}.bias")), vec![o]));
                }
            }
            if self.is_gemma() {
                out.push((p("post_feedforward_layernorm.weight"), vec![h]));
            }
        }
        out.push(("model.norm.weight".into(), vec![h]));
        if !self.tie_word_embeddings {
            out.push(("lm_head.weight".into(), vec![self.vocab_size, h]));
        }
    }
}

/// The attention heads of a decoder of `family` `hidden_size` wide: query heads, key/value
/// heads (dividing them) and the head width (even, for rotary embeddings).
fn heads(
    f: &mut Fields,
    family: Family,
    hidden_size: usize,
) -> Result<(usize, usize, usize), ConfigError> {
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
    let default_head_dim = match family {
        Family::Qwen3 => Some(128),
        Family::Gemma2 => Some(256),
        _ if hidden_size.is_multiple_of(num_attention_heads) => {
            Some(hidden_size / num_attention_heads)
        }
        _ => None,
    };
    let head_dim = match f.usize("head_dim")?.or(default_head_dim) {
        Some(d) => d,
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
    Ok((num_attention_heads, num_key_value_heads, head_dim))
}

/// The fields that change the math in ways wick does not build, refused by name unless they
/// hold the value wick computes with; attention dropout is said, not refused.
fn refuse_unbuilt(f: &mut Fields) -> Result<(), ConfigError> {
    f.expect("pretraining_tp", &1.into(), "the exact linear layers")?;
    f.expect("rope_interleaved", &false.into(), "rotate_half pairs")?;
    f.expect("use_mrope", &false.into(), "one-dimensional positions")?;
    f.expect(
        "use_bidirectional_attention",
        &false.into(),
        "causal attention",
    )?;
    f.dropout("attention_dropout")?;
    Ok(())
}

/// Reads a decoder of `family` from `f`.
pub(crate) fn decoder(
    mut f: Fields,
    family: Family,
) -> Result<(DecoderConfig, Vec<String>), ConfigError> {
    let gemma = family == Family::Gemma2;
    let vocab_size = f.required("vocab_size")?;
    let hidden_size = f.required("hidden_size")?;
    let intermediate_size = f.required("intermediate_size")?;
    let num_hidden_layers = f.required("num_hidden_layers")?;
    let (num_attention_heads, num_key_value_heads, head_dim) = heads(&mut f, family, hidden_size)?;
    let rms_norm_eps = f.float("rms_norm_eps")?.unwrap_or(1e-6);
    let max_position_embeddings = f.usize("max_position_embeddings")?.unwrap_or(match family {
        Family::Llama => 2048,
        Family::Mistral => 131_072,
        Family::Qwen2 | Family::Qwen3 => 32_768,
        Family::Gemma2 => 8192,
    });
    let rope = rope(&mut f, max_position_embeddings)?;
    let tie_word_embeddings = f.bool("tie_word_embeddings", gemma)?;
    let attention_bias = f.bool("attention_bias", false)?;
    let (qkv_bias, o_bias) = match family {
        Family::Qwen2 => (true, false),
        _ => (attention_bias, attention_bias),
    };
    let mlp_bias = f.bool("mlp_bias", false)?;
    let initializer_range = f
        .map
        .get("initializer_range")
        .and_then(Value::as_f64)
        .unwrap_or(0.02);
    let activation = activation(&mut f, gemma)?;
    refuse_unbuilt(&mut f)?;
    let layer_windows = windows(&mut f, family, num_hidden_layers)?;
    let (attention_scale, attn_logit_softcapping, final_logit_softcapping) = match gemma {
        true => (
            f.float("query_pre_attn_scalar")?
                .unwrap_or(256.0)
                .powf(-0.5),
            f.float("attn_logit_softcapping")?,
            f.float("final_logit_softcapping")?,
        ),
        false => ((head_dim as f64).powf(-0.5), None, None),
    };
    let unknown = f.unknown_fields(&[]);
    let config = DecoderConfig {
        family,
        vocab_size,
        hidden_size,
        intermediate_size,
        num_hidden_layers,
        num_attention_heads,
        num_key_value_heads,
        head_dim,
        rms_norm_eps,
        rope,
        max_position_embeddings,
        tie_word_embeddings,
        qkv_bias,
        o_bias,
        mlp_bias,
        qk_norm: family == Family::Qwen3,
        layer_windows,
        activation,
        attention_scale,
        attn_logit_softcapping,
        final_logit_softcapping,
        initializer_range,
    };
    Ok((config, unknown))
}

/// `hidden_act` (and Gemma's `hidden_activation`, which wins): SiLU, or GELU's tanh form.
fn activation(f: &mut Fields, gemma: bool) -> Result<Activation, ConfigError> {
    let act = f.take("hidden_act");
    let act = f.take("hidden_activation").or(act);
    let name = act.as_ref().and_then(Value::as_str);
    match (name, gemma) {
        (None, false) | (Some("silu" | "swish"), _) => Ok(Activation::Silu),
        (None, true) | (Some("gelu_pytorch_tanh"), _) => Ok(Activation::GeluTanh),
        _ => Err(f.error(format!(
            "field 'hidden_act' is {}; wick builds \"silu\" and \"gelu_pytorch_tanh\"",
            act.unwrap_or(Value::Null)
        ))),
    }
}

/// Each layer's attention window, from `layer_types` where the config has it, and as
/// `transformers` fills it in for the family where it does not.
fn windows(
    f: &mut Fields,
    family: Family,
    layers: usize,
) -> Result<Vec<Option<usize>>, ConfigError> {
    let window = f.usize("sliding_window")?;
    let use_sliding = f.bool("use_sliding_window", false)?;
    let max_window_layers = f.usize("max_window_layers")?;
    let window = match family {
        // Qwen's window counts only under `use_sliding_window`.
        Family::Qwen2 | Family::Qwen3 => window.filter(|_| use_sliding),
        Family::Mistral | Family::Gemma2 => window.or(Some(4096)),
        Family::Llama => {
            if let Some(w) = window {
                return Err(f.error(format!(
                    "field 'sliding_window' is {w}; a Llama's attention is full (a Mistral's \
                     config says model_type \"mistral\")"
                )));
            }
            None
        }
    };
    let types: Option<Vec<bool>> = match f.take("layer_types") {
        None => None,
        Some(Value::Array(types)) if types.len() == layers => Some(
            types
                .iter()
                .map(|t| match t.as_str() {
                    Some("sliding_attention") => Ok(true),
                    Some("full_attention") => Ok(false),
                    _ => Err(f.error(format!(
                        "field 'layer_types' holds {t}; wick builds \"full_attention\" and \
                         \"sliding_attention\""
                    ))),
                })
                .collect::<Result<_, _>>()?,
        ),
        Some(v) => {
            return Err(f.error(format!(
                "field 'layer_types' must list one type for each of the {layers} layers, got {v}"
            )))
        }
    };
    let sliding = |i: usize| match (family, &types) {
        // Mistral slides every layer whatever `layer_types` says (its attention reads only
        // `sliding_window`).
        (Family::Mistral, _) => true,
        (_, Some(types)) => types[i],
        (Family::Qwen2 | Family::Qwen3, None) => i >= max_window_layers.unwrap_or(28),
        (Family::Gemma2, None) => i.is_multiple_of(2),
        (Family::Llama, None) => false,
    };
    Ok((0..layers).map(|i| window.filter(|_| sliding(i))).collect())
}
