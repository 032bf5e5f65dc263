//! wick-nn: layers whose forward and backward are each one fused op with a hand-written
//! gradient, for training on Candle's CPU backend.
//!
//! Candle builds these layers from many small ops (or, for its fused `layer_norm`, with no
//! backward at all). Each op allocates and is visited by backprop; on the CPU that costs
//! more than the arithmetic. Here each layer is one [`candle_core::CustomOp1`]/`2`/`3`:
//! - [`LayerNorm`] ([`layer_norm`]): normalise, scale and shift;
//! - [`Gelu`] ([`gelu`]): the tanh approximation Candle's `Tensor::gelu` computes;
//! - [`causal_attention`] (inside [`CausalSelfAttention`]): scores, causal mask, softmax
//!   and the weighted sum, with grouped-query heads (fewer key/value heads than query
//!   heads), whose backward recomputes the probabilities instead of keeping them; with
//!   [`AttentionOptions`], a sliding window, a scale of the model's choosing and Gemma 2's
//!   soft cap ([`causal_attention_with`]); and over packed rows of several documents, each
//!   attending within itself only ([`causal_attention_in_documents`], given [`Positions`]);
//! - [`RmsNorm`] ([`rms_norm`]): Llama's root-mean-square norm with a learned scale (and
//!   Gemma's, which scales by one plus it: [`rms_norm_unit_offset`]);
//! - [`RotaryEmbedding`]: rotary position embedding in Hugging Face's rotate_half layout
//!   (at each token's own [`Positions`] in a packed batch);
//! - [`cross_entropy`]: mean negative log-likelihood from logits, over the targets that are
//!   not [`IGNORE_INDEX`];
//! - [`linear_cross_entropy`]: a language model's output projection and its loss in one
//!   op, a chunk of rows at a time, so that the whole logits never exist (16-bit inputs
//!   are multiplied in f32; on CUDA its composite makes the whole logits), and
//!   [`linear_log_probs`], each target's log-probability the same way (a preference loss's
//!   terms); [`head_score`], either over a [`LayerWeight`], a
//!   quantized one (an embedding table in blocks, tied to the head) decoded a slice of its
//!   rows at a time;
//! - [`Linear`] ([`linear`]): candle-nn's linear layer, its bias added by one op whose
//!   backward sums the bias gradient row by row;
//! - [`swiglu`]: Llama's gated activation `silu(gate) * up`;
//! - [`FrozenLinear`]: a linear layer that takes no gradient, over a [`LayerWeight`]: dense,
//!   or QLoRA's NF4 decoded inside the op in forward and again in backward (as
//!   [`lora_linear`] decodes it too).
//!
//! Their exponentials (softmax, cross-entropy, GELU's tanh, SiLU) and the norms' rows are
//! vectorised for the widest instruction set the CPU has (`vector_math.rs`), and the attention's matrix
//! products run on the GEMM Candle's matmul uses, one (batch, head) block per task.
//!
//! The fused path runs for contiguous f32 tensors on the CPU. On other devices and dtypes
//! each function falls back to the composite Candle ops of the same layer (the same
//! numbers, the usual speed) until a kernel exists. Layer norm and attention take 16-bit
//! inputs as torch's autocast does: they compute in f32 and round the output once. Layers are built from a candle-nn
//! `VarBuilder`, like candle-nn's own.

// Functions of at most 80 lines (clippy.toml), in library code; tests may run longer.
#![warn(clippy::too_many_lines)]

mod attention;
mod attention_kernel;
mod cached_attention;
mod cpu;
mod cross_entropy;
mod few_rows;
mod frozen_linear;
mod fused_op;
mod gelu;
mod gemm;
mod head_score;
mod layer_norm;
mod layer_weight;
mod linear;
mod linear_cross_entropy;
mod lora;
mod positions;
mod rms_norm;
mod rotary;
mod swiglu;
mod vector_math;

pub use attention::{
    causal_attention, causal_attention_composite, causal_attention_composite_in_documents,
    causal_attention_composite_with, causal_attention_in_documents, causal_attention_packed,
    causal_attention_with, repeat_kv, AttentionOptions, CausalSelfAttention,
};
pub use cached_attention::cached_attention;
pub use cross_entropy::{cross_entropy, cross_entropy_composite, IGNORE_INDEX};
pub use few_rows::{matmul_wt, FEW_ROWS};
pub use frozen_linear::FrozenLinear;
pub use gelu::{gelu, Gelu};
pub use head_score::{head_score, HeadScore, SLICE_ELEMENTS};
pub use layer_norm::{layer_norm, layer_norm_composite, LayerNorm};
pub use layer_weight::LayerWeight;
pub use linear::{linear, Linear};
pub use linear_cross_entropy::{
    linear_cross_entropy, linear_cross_entropy_composite, linear_log_probs,
    linear_log_probs_composite,
};
pub use lora::{lora_linear, lora_linear_composite, LoraParts};
pub use positions::Positions;
pub use rms_norm::{rms_norm, rms_norm_composite, rms_norm_unit_offset, RmsNorm};
pub use rotary::{rotary_composite, RotaryEmbedding};
pub use swiglu::{swiglu, swiglu_composite};
