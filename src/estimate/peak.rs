//! The peak resident set of a rank's training step, predicted from a decoder's shape: the
//! model state the strategies' formulas give, the activations backward keeps, the largest
//! transients beside them, and the process's own base.
//!
//! What a step holds at its peak, the larger of two high points, each beside every kept
//! activation:
//! - the activations: wick's layers are Candle ops, and Candle's graph keeps every op's
//!   inputs until backward has passed it, so a token keeps, in each layer, every tensor
//!   one of the layer's ops reads ([`Widths::kept_per_token_layer`]). Recomputed layers
//!   keep only their inputs, and the layer being recomputed its whole graph;
//! - where the strategy shards the parameters, the units it gathers: the one running and
//!   the one prefetched beside it (zero3, fsdp's full_shard and hybrid_shard), or every one
//!   from its forward to the end of backward (shard_grad_op); and, when the whole model
//!   trains, one unit's gathered gradient; the embedding (tied to the head or not) is
//!   gathered whole for the output projection, with its gradient when it trains (as its
//!   stored blocks where QLoRA quantizes the embeddings);
//! - in a layer's backward, the gradients of the MLP's gate, up and their product, which
//!   Candle holds at once; under QLoRA, the largest base weight of a layer decoded to f32
//!   inside the op that reads it;
//! - one chunk of the fused loss's logits (wick-nn's bound: 8 Mi elements), and over a
//!   quantized head a decoded slice of its rows beside it;
//! - the runtime: the program, its libraries, tokenizer and data ([`RUNTIME_BASE`], once a
//!   process, whatever its ranks).

use super::BaseForm;
use crate::cli::EstimateArgs;
use std::fmt::Write;
use wick_core::StateBytes;
use wick_models::ModelConfig;

/// The resident set of a `wick fit` process beside its model and batches: 100 MiB,
/// measured (`/usr/bin/time -v wick fit --model tests/fixtures/hf/llama --seq 64
/// --batch-size 2 --devices 2 --strategy fsdp`, a model of 0.1M parameters, peaked at
/// 100.3 MB on 2026-12-06).
pub const RUNTIME_BASE: usize = 100 << 20;

/// The fused loss's largest chunk of logits, in bytes (wick-nn's `CHUNK_ELEMENTS` of f32).
const LOSS_CHUNK: usize = (8 << 20) * 4;

/// A decoder's sizes, as its layers' activations see them.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Widths {
    /// Decoder layers.
    pub layers: usize,
    /// The residual stream's width.
    pub hidden: usize,
    /// The queries' width (heads x head_dim).
    pub queries: usize,
    /// The keys' width, and the values' (key/value heads x head_dim).
    pub keys: usize,
    /// The MLP's inner width.
    pub intermediate: usize,
    /// Gemma's norms after each sublayer.
    pub post_norms: bool,
    /// The vocabulary.
    pub vocab: usize,
    /// Whether the head is the embedding's weight (one tensor, one gradient).
    pub tied: bool,
    /// Elements of the largest decoder layer, the unit a sharded strategy gathers.
    pub layer_params: usize,
    /// That layer's bytes as a sharded strategy gathers it: in the compute dtype, but a
    /// quantized base's linear weights at their stored bytes (decoded inside each op).
    pub layer_bytes: usize,
    /// The largest of the layer's weights a quantized base decodes inside an op, in f32
    /// (0 without one): it lives beside the op's inputs while the op runs.
    pub decoded_bytes: usize,
    /// The output head's table (the embedding's, tied) as a sharded strategy gathers it:
    /// in the compute dtype, or at its stored bytes where the embeddings are quantized.
    pub head_bytes: usize,
    /// Whether the head's table is quantized: decoded a slice of rows at a time, a
    /// slice's logits beside it, never whole.
    pub head_quantized: bool,
}

impl Widths {
    /// The widths of `config`, its layers gathered in `compute_bytes` an element but what
    /// `form` quantizes at its stored bytes; `None` for GPT-2, whose layers are not
    /// modelled.
    pub fn of(
        config: &ModelConfig,
        form: Option<BaseForm>,
        compute_bytes: usize,
    ) -> Option<Widths> {
        let ModelConfig::Decoder(c) = config else {
            return None;
        };
        // Every layer has the same shapes: the first one's parameters.
        let first: Vec<(String, usize)> = config
            .parameter_shapes()
            .into_iter()
            .filter(|(name, _)| name.starts_with("model.layers.0."))
            .map(|(name, shape)| (name, shape.iter().product()))
            .collect();
        let layer_params = first.iter().map(|(_, n)| n).sum();
        let head = c.vocab_size * c.hidden_size;
        let layer_bytes = first
            .iter()
            .map(|(name, n)| super::held_bytes(name, *n, form, compute_bytes))
            .sum();
        Some(Widths {
            layers: c.num_hidden_layers,
            hidden: c.hidden_size,
            queries: c.num_attention_heads * c.head_dim,
            keys: c.num_key_value_heads * c.head_dim,
            intermediate: c.intermediate_size,
            post_norms: first
                .iter()
                .any(|(name, _)| name.contains("post_feedforward_layernorm")),
            vocab: c.vocab_size,
            tied: c.tie_word_embeddings,
            layer_params,
            layer_bytes,
            decoded_bytes: (first.iter())
                .filter(|(name, n)| super::held_bytes(name, *n, form, 4) < n * 4)
                .map(|(_, n)| n * 4)
                .max()
                .unwrap_or(0),
            head_bytes: super::held_bytes("lm_head.weight", head, form, compute_bytes),
            head_quantized: form.is_some_and(|f| f.embeddings),
        })
    }

    /// The elements a token keeps in one layer whose graph backward keeps: the tensors the
    /// layer's ops read. Of the residual's width: the layer's input, its norm, the output
    /// projection's result, the sum after attention, its norm, the MLP's result (and, with
    /// Gemma's norms, the two sublayers' outputs before them); of the queries' width: the
    /// projection, its rotation, attention's merged output; of the keys' width: the key
    /// and value projections and the keys' rotation; of the MLP's: gate, up and their
    /// product.
    pub fn kept_per_token_layer(&self) -> usize {
        let norms = if self.post_norms { 2 } else { 0 };
        (6 + norms) * self.hidden + 3 * self.queries + 3 * self.keys + 3 * self.intermediate
    }
}

/// What a step asks of memory beside the model.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Step {
    /// A rank's tokens a micro-batch (sequence x batch size / ranks).
    pub tokens: usize,
    /// How many layers recompute their forward in backward (activation checkpointing).
    pub recomputed_layers: usize,
    /// Whether the whole model trains (not LoRA's adapters alone): the head and the
    /// embedding have gradients.
    pub full: bool,
    /// Bytes an activation or gathered element takes (4 in f32, 2 under a 16-bit policy).
    pub compute_bytes: usize,
}

/// A rank's predicted peak, by what holds it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Peak {
    /// Parameters, gradients and optimizer state (the strategy's formulas).
    pub state: usize,
    /// What backward keeps of the forward.
    pub activations: usize,
    /// Gathered units, the head's weight and gradient, the loss's chunk.
    pub transient: usize,
}

impl Peak {
    /// The rank's whole peak, without the process's base.
    pub fn rank(&self) -> usize {
        self.state + self.activations + self.transient
    }

    /// A process of `ranks` such ranks (threads) with the runtime's base.
    pub fn process(&self, ranks: usize) -> usize {
        RUNTIME_BASE + ranks * self.rank()
    }
}

/// What a strategy gathers of the parameters it keeps as shards.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Gathers {
    /// Nothing: the parameters are whole on every rank (ddp, zero1, zero2, no_shard).
    Nothing,
    /// The unit that runs, one at a time (zero3, full_shard, hybrid_shard, without
    /// `--prefetch`).
    Unit,
    /// Every unit, kept gathered from its forward to the end of backward (shard_grad_op).
    Everything,
}

/// The peak of a rank holding `state` under a strategy that gathers as `gathers` says:
/// the larger of the step's two high points, each beside every kept activation. At the
/// loss, the output projection's weight (the embedding's, gathered where sharded) and one
/// chunk of logits, and, when the whole model trains, the embedding's gradients; in a
/// layer's backward, the gathered layer (its gradient too when it trains), the largest
/// weight a quantized base decodes, the gradients of the MLP's three widest tensors, and,
/// where it
/// recomputes, its graph made again.
pub fn peak(widths: &Widths, step: &Step, state: &StateBytes, gathers: Gathers) -> Peak {
    let w = widths;
    let cb = step.compute_bytes;
    let per_layer = step.tokens * w.kept_per_token_layer() * cb;
    // A recomputed layer keeps its input only.
    let recomputed = step.recomputed_layers.min(w.layers);
    let activations =
        (w.layers - recomputed) * per_layer + recomputed * step.tokens * w.hidden * cb;
    let embedding = w.vocab * w.hidden;
    // Untied, the head and the embedding are two tensors, each with its gradient.
    let embeddings = if w.tied { 1 } else { 2 };
    let sharded = gathers != Gathers::Nothing;
    let sharded_and_trained = usize::from(sharded && step.full);
    // A quantized table is decoded a slice at a time: a slice of it beside a slice of
    // logits (within the chunk).
    let slice = usize::from(w.head_quantized) * wick_nn::SLICE_ELEMENTS * 4;
    let at_loss = LOSS_CHUNK
        + slice
        + usize::from(sharded) * w.head_bytes
        + sharded_and_trained * embeddings * embedding * 4;
    let gathered_layers = match gathers {
        Gathers::Nothing => 0,
        Gathers::Unit => 1,
        Gathers::Everything => w.layers,
    };
    // Backward through the MLP holds the gradients of its three widest tensors at once:
    // the product's, then gate's and up's made from it.
    let mlp_grads = 3 * step.tokens * w.intermediate * cb;
    let in_layer = gathered_layers * w.layer_bytes
        + w.decoded_bytes
        + mlp_grads
        + sharded_and_trained * w.layer_params * 4
        + usize::from(recomputed > 0) * per_layer;
    Peak {
        state: state.total(),
        activations,
        transient: at_loss.max(in_layer),
    }
}

/// The peak resident set of each strategy's ranks at `args`' step, for `config` with
/// `counted` (trainable elements, frozen bytes).
pub(super) fn report(
    out: &mut String,
    args: &EstimateArgs,
    (seq, form): (usize, Option<BaseForm>),
    config: &wick_models::ModelConfig,
    (params, frozen_bytes): (usize, usize),
) {
    let compute_bytes = args.precision.compute_bytes();
    let Some(widths) = Widths::of(config, form, compute_bytes) else {
        let _ = writeln!(out, "peak resident set: not modelled for GPT-2's layers");
        return;
    };
    let w = args.world;
    let ac = args.activation_checkpointing;
    let step = Step {
        tokens: seq * args.batch_size / w,
        recomputed_layers: (0..widths.layers).filter(|&i| ac.recomputes(i)).count(),
        full: args.lora_rank.is_none(),
        compute_bytes,
    };
    let _ = writeln!(
        out,
        "peak resident set at --seq {seq} --batch-size {} ({} tokens a rank), \
         --activation-checkpointing {ac}, before allocator slack:",
        args.batch_size, step.tokens
    );
    let _ = writeln!(
        out,
        "{:<20} {:>12} {:>12} {:>12} {:>12} {:>16} {:>16}",
        "strategy",
        "state",
        "activations",
        "transient",
        "per rank",
        format!("{w} ranks, threads"),
        "each process"
    );
    let gib = |b: usize| format!("{:.2} GiB", b as f64 / (1u64 << 30) as f64);
    for ((name, strategy), (_, state)) in
        super::strategies()
            .iter()
            .zip(super::rows(params, frozen_bytes, w))
    {
        let gathers = match (strategy.sharding().params, name.as_str()) {
            (false, _) => Gathers::Nothing,
            (true, "fsdp shard_grad_op") => Gathers::Everything,
            (true, _) => Gathers::Unit,
        };
        let p = peak(&widths, &step, &state, gathers);
        let _ = writeln!(
            out,
            "{:<20} {:>12} {:>12} {:>12} {:>12} {:>16} {:>16}",
            name,
            gib(p.state),
            gib(p.activations),
            gib(p.transient),
            gib(p.rank()),
            gib(p.process(w)),
            gib(p.process(1))
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A rank's model state: 1 MiB of parameters.
    fn small_state() -> StateBytes {
        StateBytes {
            params: 1 << 20,
            grads: 0,
            optimizer: 0,
        }
    }

    /// A step of 1024 tokens in f32, training adapters only, `recomputed_layers` recomputed.
    fn adapters_step(recomputed_layers: usize) -> Step {
        Step {
            tokens: 1024,
            recomputed_layers,
            full: false,
            compute_bytes: 4,
        }
    }

    /// SmolLM2-135M's published config.
    fn smollm2() -> ModelConfig {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("tests/fixtures/configs/smollm2-135m.json");
        ModelConfig::from_file(path).unwrap()
    }

    #[test]
    fn a_layer_keeps_what_its_ops_read() {
        let w = Widths::of(&smollm2(), None, 4).unwrap();
        assert_eq!((w.layers, w.hidden, w.queries, w.keys), (30, 576, 576, 192));
        assert_eq!((w.intermediate, w.vocab, w.tied), (1536, 49152, true));
        // 4 x 576 x 576 attention projections' worth: q and o 576 x 576, k and v 192 x 576,
        // the MLP 3 x 576 x 1536, two norms of 576.
        assert_eq!(
            w.layer_params,
            2 * 576 * 576 + 2 * 192 * 576 + 3 * 576 * 1536 + 2 * 576
        );
        assert_eq!(
            w.kept_per_token_layer(),
            6 * 576 + 3 * 576 + 3 * 192 + 3 * 1536
        );
    }

    #[test]
    fn recomputing_keeps_layer_inputs_and_the_larger_high_point_counts() {
        let w = Widths::of(&smollm2(), None, 4).unwrap();
        let state = small_state();
        let step = adapters_step(0);
        let per_layer = 1024 * w.kept_per_token_layer() * 4;
        let embedding = 49152 * 576 * 4;
        let kept = peak(&w, &step, &state, Gathers::Unit);
        assert_eq!(kept.activations, 30 * per_layer);
        // At the loss: the gathered embedding outweighs a gathered layer.
        assert_eq!(kept.transient, LOSS_CHUNK + embedding);
        let recomputed = adapters_step(30);
        let recomputed = peak(&w, &recomputed, &state, Gathers::Unit);
        assert_eq!(recomputed.activations, 30 * 1024 * 576 * 4);
        // A strategy that keeps the parameters whole gathers nothing.
        assert_eq!(
            peak(&w, &step, &state, Gathers::Nothing).transient,
            LOSS_CHUNK
        );
        // shard_grad_op holds every layer gathered, more than the embedding, beside a
        // layer's MLP gradients.
        let whole = peak(&w, &step, &state, Gathers::Everything);
        assert_eq!(
            whole.transient,
            30 * w.layer_params * 4 + 3 * 1024 * 1536 * 4
        );
        // Training the whole model adds the tied embedding's gradient at the loss.
        let full = peak(&w, &Step { full: true, ..step }, &state, Gathers::Unit);
        assert_eq!(full.transient, LOSS_CHUNK + 2 * embedding);
        assert_eq!(state.total() + 30 * per_layer + full.transient, full.rank());
    }

    #[test]
    fn a_quantized_head_is_gathered_as_blocks_and_decoded_a_slice_at_a_time() {
        let nf4 = wick_core::BlockFormat::Nf4;
        let form = |embeddings| BaseForm {
            format: nf4,
            embeddings,
        };
        let (base, with) = (
            Widths::of(&smollm2(), Some(form(false)), 4).unwrap(),
            Widths::of(&smollm2(), Some(form(true)), 4).unwrap(),
        );
        // The layers' weights are quantized either way; the largest (the MLP's) is
        // decoded whole inside its op.
        assert_eq!(
            (base.layer_bytes, base.decoded_bytes),
            (with.layer_bytes, 576 * 1536 * 4)
        );
        assert_eq!(
            (base.head_bytes, base.head_quantized),
            (49152 * 576 * 4, false)
        );
        assert_eq!(
            (with.head_bytes, with.head_quantized),
            (nf4.stored_len(49152 * 576), true)
        );
        let state = small_state();
        let step = adapters_step(30);
        let transient = |w: &Widths, step: &Step| peak(w, step, &state, Gathers::Unit).transient;
        // Activations kept, the loss's high point counts: over an f32 table, the table
        // gathered whole; over NF4, its blocks, a decoded slice and a slice of logits.
        let kept = adapters_step(0);
        assert_eq!(transient(&base, &kept), LOSS_CHUNK + 49152 * 576 * 4);
        let quantized_loss = LOSS_CHUNK + wick_nn::SLICE_ELEMENTS * 4 + with.head_bytes;
        assert_eq!(transient(&with, &kept), quantized_loss);
        // Recomputed, a layer's backward holds more at this shape: its graph made again,
        // the MLP's gradients and the decoded weight beside its gathered blocks.
        let in_layer = with.layer_bytes
            + with.decoded_bytes
            + 3 * 1024 * 1536 * 4
            + 1024 * with.kept_per_token_layer() * 4;
        assert!(in_layer > quantized_loss);
        assert_eq!(transient(&with, &step), in_layer);
    }
}
