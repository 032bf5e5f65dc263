//! QLoRA's frozen base: which of a model's parameters are born quantized
//! ([`is_base_linear_weight`], in the [`wick_core::BlockFormat`] given to
//! `CausalLm::with_quantized_base`), and the file that records the form in a checkpoint.

/// The attachment of a QLoRA run's checkpoints that records its base's form (`nf4`,
/// `q8_0`, `q4_k` or `q6_k`), so that a validation, a sample or a merged export read the
/// base as the run trained over it.
pub const QUANTIZED_BASE_FILE: &str = "quantized_base.txt";

/// Whether the parameter `name` is one a quantized base keeps quantized: a decoder block's
/// linear weight (`model.layers.{i}.self_attn.q_proj.weight`, ..., `mlp.down_proj.weight`).
/// Norms, embeddings, the output head and the adapters stay f32.
pub fn is_base_linear_weight(name: &str) -> bool {
    let Some(layer) = name.strip_suffix(".weight") else {
        return false;
    };
    let module = layer.rsplit('.').next().unwrap_or_default();
    name.starts_with("model.layers.") && crate::lora::DECODER_TARGETS.contains(&module)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn picks_the_block_linear_weights_only() {
        assert!(is_base_linear_weight(
            "model.layers.3.self_attn.q_proj.weight"
        ));
        assert!(is_base_linear_weight("model.layers.0.mlp.down_proj.weight"));
        assert!(!is_base_linear_weight(
            "model.layers.0.self_attn.q_proj.bias"
        ));
        assert!(!is_base_linear_weight(
            "model.layers.0.self_attn.q_proj.lora_A.weight"
        ));
        assert!(!is_base_linear_weight(
            "model.layers.0.input_layernorm.weight"
        ));
        assert!(!is_base_linear_weight("model.embed_tokens.weight"));
        assert!(!is_base_linear_weight("lm_head.weight"));
    }
}
