//! `BaseQuantization`: how QLoRA keeps a frozen base (`CausalLm::with_quantized_base`).

/// The form a LoRA model's frozen base linear weights are born in and kept in, decoded to
/// f32 inside each op that reads them. Norms, embeddings, the output head and the adapters
/// stay f32.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BaseQuantization {
    /// NF4 with double quantization, as QLoRA defines it and bitsandbytes stores it
    /// (`bnb_4bit_quant_type="nf4"`, `bnb_4bit_use_double_quant=True`): 4.13 bits a weight.
    Nf4,
}

/// The attachment of a QLoRA run's checkpoints that records its base's form (`nf4`), so
/// that a validation, a sample or a merged export read the base as the run trained over it.
pub const QUANTIZED_BASE_FILE: &str = "quantized_base.txt";

impl BaseQuantization {
    /// Its name on the command line and in [`QUANTIZED_BASE_FILE`].
    pub fn name(self) -> &'static str {
        match self {
            BaseQuantization::Nf4 => "nf4",
        }
    }

    /// The values a weight of shape `dims` holding `values` takes in this form: quantized,
    /// then decoded (what QLoRA's layers compute with, and what a merge adds to).
    pub fn round_trip(self, values: &[f32], dims: &[usize]) -> Vec<f32> {
        match self {
            BaseQuantization::Nf4 => wick_core::Nf4Tensor::quantize(values, dims).dequantize(),
        }
    }

    /// Whether the parameter `name` is one it quantizes: a decoder block's linear weight
    /// (`model.layers.{i}.self_attn.q_proj.weight`, ..., `mlp.down_proj.weight`).
    pub fn quantizes(self, name: &str) -> bool {
        let Some(layer) = name.strip_suffix(".weight") else {
            return false;
        };
        let module = layer.rsplit('.').next().unwrap_or_default();
        name.starts_with("model.layers.") && crate::lora::DECODER_TARGETS.contains(&module)
    }
}

impl std::str::FromStr for BaseQuantization {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "nf4" => Ok(BaseQuantization::Nf4),
            other => Err(format!(
                "--quantize-base {other}: wick builds nf4 (q8_0, q4_k and q6_k bases are not built yet)"
            )),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn picks_the_block_linear_weights_only() {
        let q = BaseQuantization::Nf4;
        assert!(q.quantizes("model.layers.3.self_attn.q_proj.weight"));
        assert!(q.quantizes("model.layers.0.mlp.down_proj.weight"));
        assert!(!q.quantizes("model.layers.0.self_attn.q_proj.bias"));
        assert!(!q.quantizes("model.layers.0.self_attn.q_proj.lora_A.weight"));
        assert!(!q.quantizes("model.layers.0.input_layernorm.weight"));
        assert!(!q.quantizes("model.embed_tokens.weight"));
        assert!(!q.quantizes("lm_head.weight"));
        assert!("q4_0"
            .parse::<BaseQuantization>()
            .unwrap_err()
            .contains("nf4"));
    }
}
