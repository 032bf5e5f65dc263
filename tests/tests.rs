//! Integration tests of the whole stack (trainer, accelerator, strategies); one module per
//! capability.

mod common;

// Every strategy trains to the same parameters as one device.
mod equivalence;
// The stage order of fit, validate, test and predict, and the configure_sharded_model contract.
mod hooks;
// Failing ranks and bad input end in clear errors, never hangs.
mod failures;
// A rank failing or stalling at a drawn collective call: named, never a hang.
mod fault_injection;
// ZeRO-3: born-sharded init, collective order in backward, what it refuses.
mod zero3;
// Gradient clipping and accumulation equal their single-device meaning.
mod step_options;
// FSDP: sharding strategies, re-gather in backward, weight tying.
mod fsdp;
// Gradient collectives issued during backward, waited for in order before the step.
mod overlap;
// The small all-reduces of a step: the loss, the stop vote, a sharded gradients' verdict.
mod step_collectives;
// Checkpoints: resume, reshard, consolidate, pretrained init, keeping rules, crash safety.
mod checkpoint;
mod checkpoint_async;
// Bad checkpoint files: clear errors, never a panic, never a touched good checkpoint.
mod checkpoint_bad_input;
// Parameters without gradient: reported at the first step, or an error if asked.
mod unused_parameters;
// 16-mixed dynamic loss scaling: overflowing steps skipped on every rank, scale in checkpoints.
mod loss_scaling;
// Learning-rate schedules: the rate of each step, across strategies, through a resume.
mod lr_schedule;
// EarlyStopping: every rank stops at the same step, from the rank-averaged metric.
mod early_stopping;
// The trained module after fit: validate, predict, full_parameters in any order; bare forwards.
mod after_fit;
// Inf and NaN: an error naming step, rank and parameter, or a step skipped on every rank.
mod nonfinite;
// Preemption saves the agreed step; fit_or_resume continues bit-identically or starts fresh.
mod preemption;
// Runs never overwrite each other; outputs and data checked before training.
mod runs;
// Every model family against Hugging Face transformers (tests/fixtures/hf, tests/fixtures/configs).
mod models;
// Exact resume at any world size: the same global batches in order, packed or not.
mod data_order;
// Packed batches: each example kept to itself, equal to the examples alone, every family.
mod packing;
// Preference tuning (DPO, IPO) against TRL's DPOTrainer, full and LoRA, under every strategy.
mod dpo;
// Generation over the KV cache: greedy tokens and logits equal transformers' generate.
mod generation;
// llama.cpp's GGUF files: logits of a GGUF Llama, dequantization against the gguf package.
mod gguf;
// llama.cpp's vocabulary test cases (ignored without the vocabularies; .ci/run runs them).
mod gguf_vocab;
// A real published GGUF (ignored without it; .ci/run fetches it and runs this).
mod gguf_published;
// Published configs, refused and unknown fields, tied vocabularies that do not divide by W.
mod model_configs;
// LoRA: frozen base weights under every strategy, adapters equal to one device's, resume.
mod lora;
// QLoRA: NF4 equal to bitsandbytes', LoRA over a quantized base equal to over its values.
mod qlora;
