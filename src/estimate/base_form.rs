//! `BaseForm`: what `estimate --quantize-base` (and `--quantize-embeddings`) hold
//! quantized, and the bytes each parameter is then held in.

use crate::cli::EstimateArgs;

/// The bytes a LoRA run keeps `config`'s frozen base in: f32, but the linear weights of
/// its blocks at their stored bytes where `--quantize-base` names a form.
pub(super) fn frozen_bytes_of(
    config: &wick_models::ModelConfig,
    args: &EstimateArgs,
) -> anyhow::Result<usize> {
    let form = base_form(args)?;
    Ok(config
        .parameter_shapes()
        .into_iter()
        .map(|(name, shape)| held_bytes(&name, shape.iter().product(), form, 4))
        .sum())
}

/// What `--quantize-base` (and `--quantize-embeddings`) hold quantized, and in what form.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BaseForm {
    /// The block form.
    pub format: wick_core::BlockFormat,
    /// Whether the embedding and head are held in it too.
    pub embeddings: bool,
}

/// The block form `--quantize-base` names, checked.
pub(super) fn base_form(args: &EstimateArgs) -> anyhow::Result<Option<BaseForm>> {
    let format = (args.quantize_base.as_deref())
        .map(str::parse)
        .transpose()
        .map_err(anyhow::Error::msg)?;
    Ok(format.map(|format| BaseForm {
        format,
        embeddings: args.quantize_embeddings,
    }))
}

/// The bytes parameter `name` of `n` elements is held in: one `form` quantizes at its
/// stored bytes, anything else at `elem` bytes an element.
pub(super) fn held_bytes(name: &str, n: usize, form: Option<BaseForm>, elem: usize) -> usize {
    match form.filter(|f| wick_models::is_quantized_weight(name, f.embeddings)) {
        Some(form) => form.format.stored_len(n),
        None => n * elem,
    }
}
