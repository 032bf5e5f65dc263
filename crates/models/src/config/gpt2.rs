//! GPT-2 (`GPT2LMHeadModel`), read from its `config.json`.

use super::fields::Fields;
use super::ConfigError;
use serde_json::Value;

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

impl Gpt2Config {
    /// Every parameter's Hugging Face name and shape, in the order wick creates them.
    pub(crate) fn parameter_shapes(&self, out: &mut Vec<(String, Vec<usize>)>) {
        let c = self;
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

pub(crate) fn gpt2(mut f: Fields) -> Result<(Gpt2Config, Vec<String>), ConfigError> {
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
    let unknown = f.unknown_fields(GPT2_HEADS);
    let config = Gpt2Config {
        vocab_size,
        n_embd,
        n_layer,
        n_head,
        n_positions,
        n_inner,
        layer_norm_epsilon,
        initializer_range,
    };
    Ok((config, unknown))
}
