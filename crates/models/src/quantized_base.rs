//! QLoRA's frozen base: which of a model's parameters are born quantized
//! ([`is_base_linear_weight`], and on request [`is_embedding_weight`]), in what form
//! ([`QuantizedBase`]: a [`BlockFormat`], or the blocks the weights hold), and the file that
//! records both in a checkpoint ([`QuantizedBaseRecord`]).

use std::sync::Arc;
use wick_core::{BlockFormat, WeightSource};

/// The form QLoRA keeps a frozen base's linear weights in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum QuantizedBase {
    /// Quantized to this form as each weight is made.
    In(BlockFormat),
    /// As the weights hold them: a GGUF file's own blocks, taken as they are, each weight
    /// in its file's type (a weight the file holds in f32, f16 or bf16 stays dense).
    AsRead,
}

/// The form each parameter is born quantized in, by full name.
pub(crate) type FormatOf = Arc<dyn Fn(&str) -> Option<BlockFormat> + Send + Sync>;

impl QuantizedBase {
    /// Its name on the command line and in [`QUANTIZED_BASE_FILE`]: the format's, or
    /// `as-read`.
    pub fn name(self) -> &'static str {
        match self {
            QuantizedBase::In(format) => format.name(),
            QuantizedBase::AsRead => "as-read",
        }
    }

    /// The form each base linear weight (and with `embeddings`, the token embedding and
    /// output head) of a model whose weights are `weights` is born in.
    pub(crate) fn format_of(
        self,
        weights: Option<Arc<dyn WeightSource>>,
        embeddings: bool,
    ) -> FormatOf {
        let picked = move |name: &str| is_quantized_weight(name, embeddings);
        match self {
            QuantizedBase::In(format) => Arc::new(move |name: &str| picked(name).then_some(format)),
            QuantizedBase::AsRead => Arc::new(move |name: &str| {
                let weights = weights.as_ref()?;
                picked(name).then(|| weights.block_format(name)).flatten()
            }),
        }
    }
}

impl From<BlockFormat> for QuantizedBase {
    fn from(format: BlockFormat) -> Self {
        QuantizedBase::In(format)
    }
}

impl std::str::FromStr for QuantizedBase {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "as-read" => Ok(QuantizedBase::AsRead),
            format => format.parse().map(QuantizedBase::In),
        }
    }
}

/// The attachment of a QLoRA run's checkpoints that records its base's form and whether
/// its embeddings were quantized too ([`QuantizedBaseRecord`]), so that a validation, a
/// sample or a merged export read the base as the run trained over it.
pub const QUANTIZED_BASE_FILE: &str = "quantized_base.txt";

/// What [`QUANTIZED_BASE_FILE`] records: the base's form ([`QuantizedBase::name`]), then
/// ` embeddings` where the token embedding and output head were quantized too.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QuantizedBaseRecord {
    /// The form of the base.
    pub form: QuantizedBase,
    /// Whether the embeddings were held in it too ([`is_embedding_weight`]).
    pub embeddings: bool,
}

impl std::fmt::Display for QuantizedBaseRecord {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.form.name())?;
        if self.embeddings {
            f.write_str(" embeddings")?;
        }
        Ok(())
    }
}

impl std::str::FromStr for QuantizedBaseRecord {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let mut words = s.split_whitespace();
        let form = words.next().unwrap_or_default().parse()?;
        let embeddings = match (words.next(), words.next()) {
            (None, _) => false,
            (Some("embeddings"), None) => true,
            _ => return Err(format!("{s:?} is not a form, then `embeddings` or nothing")),
        };
        Ok(QuantizedBaseRecord { form, embeddings })
    }
}

/// Whether QLoRA holds the parameter `name` quantized: a base linear weight, or with
/// `embeddings` the token embedding or output head too.
pub fn is_quantized_weight(name: &str, embeddings: bool) -> bool {
    is_base_linear_weight(name) || (embeddings && is_embedding_weight(name))
}

/// Whether the parameter `name` is the token embedding or the output head
/// (`model.embed_tokens.weight`, `lm_head.weight`): quantized under QLoRA only when asked
/// ([`crate::CausalLm::with_quantized_embeddings`]).
pub fn is_embedding_weight(name: &str) -> bool {
    matches!(name, "model.embed_tokens.weight" | "lm_head.weight")
}

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
        for form in [QuantizedBase::In(BlockFormat::Q4K), QuantizedBase::AsRead] {
            assert_eq!(form.name().parse::<QuantizedBase>(), Ok(form));
        }
        assert!("q8_1".parse::<QuantizedBase>().is_err());
        for embeddings in [false, true] {
            let record = QuantizedBaseRecord {
                form: QuantizedBase::In(BlockFormat::Nf4),
                embeddings,
            };
            assert_eq!(record.to_string().parse(), Ok(record));
        }
        assert!("nf4 heads".parse::<QuantizedBaseRecord>().is_err());
    }
}
