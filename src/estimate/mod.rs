//! `wick estimate`: model-state bytes per rank for each strategy, from the ZeRO formulas
//! wick's strategies meet (AdamW: 4 bytes of parameter, 4 of gradient and 8 of state per
//! element, each either whole on every rank or sharded over W), and the largest unit that
//! full_shard gathers: "will it fit?" before trying, as DeepSpeed's estimators answer.
//! With `--seq`, each rank's peak resident set beside it ([`peak`]).

mod base_form;
mod peak;

pub use base_form::BaseForm;
use base_form::{base_form, frozen_bytes_of, held_bytes};

use crate::char_gpt::{CharGpt, GptConfig};
use crate::cli::EstimateArgs;
use crate::main_job::configure_on_one_cpu;
use std::collections::BTreeMap;
use std::fmt::Write;
use wick_core::{StateBytes, Strategy};
use wick_strategies::{Fsdp, FsdpSharding, StrategyKind, StrategySpec};

/// The strategies estimated, by the names `wick fit` takes: every one of several ranks,
/// fsdp with each sharding but hybrid_shard (whose bytes depend on its groups).
fn strategies() -> Vec<(String, Box<dyn Strategy>)> {
    let mut all: Vec<(String, Box<dyn Strategy>)> = StrategyKind::ALL
        .into_iter()
        .filter(|k| !matches!(k, StrategyKind::Single | StrategyKind::Fsdp))
        .map(|k| (k.to_string(), StrategySpec::new(k).build()))
        .collect();
    for sharding in FsdpSharding::ALL {
        if sharding != FsdpSharding::HybridShard {
            all.push((format!("fsdp {sharding}"), Fsdp::new(sharding).build()));
        }
    }
    all
}

/// Every strategy's bytes per rank for `params` trainable elements beside `frozen_bytes`
/// of frozen parameters (4 an element, or a quantized base's stored blocks) at `world`
/// ranks.
pub fn rows(params: usize, frozen_bytes: usize, world: usize) -> Vec<(String, StateBytes)> {
    strategies()
        .into_iter()
        .map(|(name, s)| {
            let sharding = s.sharding();
            let mut bytes = sharding.adamw_formula_with_frozen(params, 0, world);
            bytes.params += match sharding.params {
                true => frozen_bytes / world,
                false => frozen_bytes,
            };
            (name, bytes)
        })
        .collect()
}

/// The main job's model's units (`embed`, `blocks.i`, `head`) and their element counts,
/// from the model itself, created on one CPU rank.
pub fn model_units(config: GptConfig) -> anyhow::Result<BTreeMap<String, usize>> {
    let strategy = configure_on_one_cpu(&mut CharGpt::new(config, 1e-3))?;
    let mut units = BTreeMap::new();
    for (name, shape) in strategy.parameter_shapes() {
        let parts: Vec<&str> = name.split('.').collect();
        let unit = match parts.as_slice() {
            ["blocks", i, ..] => format!("blocks.{i}"),
            [first, ..] => first.to_string(),
            [] => String::new(),
        };
        *units.entry(unit).or_insert(0) += shape.elem_count();
    }
    Ok(units)
}

/// The LoRA options `--lora-rank` and `--lora-targets` describe, checked.
fn lora(args: &EstimateArgs) -> anyhow::Result<Option<wick_models::LoraConfig>> {
    let Some(rank) = args.lora_rank else {
        return Ok(None);
    };
    let mut lora = wick_models::LoraConfig::new(rank);
    if let Some(targets) = &args.lora_targets {
        lora.targets = targets.clone();
    }
    lora.check().map_err(anyhow::Error::msg)?;
    Ok(Some(lora))
}

fn mib(bytes: usize) -> String {
    format!("{:.2} MiB", bytes as f64 / (1 << 20) as f64)
}

/// What `wick estimate` counts of a model.
struct Counted {
    /// The parameters that train.
    params: usize,
    /// The frozen ones (LoRA's base).
    frozen: usize,
    /// The bytes they are kept in: 4 an element, a quantized base's blocks less.
    frozen_bytes: usize,
    /// The largest unit and its elements (unknown from `--params` alone).
    largest: Option<(String, usize)>,
    /// The model's config, where `--model` gave one.
    config: Option<wick_models::ModelConfig>,
}

/// What `args` asks about, counted.
fn counted(args: &EstimateArgs) -> anyhow::Result<Counted> {
    let (mut frozen, mut frozen_bytes, mut model_config) = (0, 0, None);
    let (params, largest) = match (&args.model, args.params) {
        (Some(model), _) => {
            let config = match (model.is_dir(), wick_models::is_gguf(model)) {
                (true, _) => wick_models::ModelConfig::from_file(model.join("config.json"))?,
                (false, true) => {
                    let gguf = wick_models::GgufModel::open(model)?;
                    wick_models::ModelConfig::from_json(&gguf.config, model)?
                }
                (false, false) => wick_models::ModelConfig::from_file(model)?,
            };
            let units = config.unit_sizes();
            // The first of the largest (max_by_key keeps the last).
            let largest = units.iter().rev().max_by_key(|(_, n)| *n).cloned();
            let base: usize = units.iter().map(|(_, n)| n).sum();
            let counts = match lora(args)? {
                Some(lora) => {
                    frozen = base;
                    frozen_bytes = frozen_bytes_of(&config, args)?;
                    let adapters = lora.adapter_shapes(&config);
                    let count = adapters
                        .iter()
                        .map(|(_, s)| s.iter().product::<usize>())
                        .sum();
                    (count, largest)
                }
                None => (base, largest),
            };
            model_config = Some(config);
            counts
        }
        (None, Some(n)) => (n, None),
        (None, None) => {
            let units = model_units(GptConfig {
                vocab: args.vocab,
                block: args.block,
                d_model: args.d_model,
                n_layer: args.n_layer,
                n_head: args.n_head,
            })?;
            let largest = units
                .iter()
                .max_by_key(|(_, n)| **n)
                .map(|(u, n)| (u.clone(), *n));
            (units.values().sum(), largest)
        }
    };
    Ok(Counted {
        params,
        frozen,
        frozen_bytes,
        largest,
        config: model_config,
    })
}

/// The report `wick estimate` prints.
pub fn report(args: &EstimateArgs) -> anyhow::Result<String> {
    let Counted {
        params,
        frozen,
        frozen_bytes,
        largest,
        config,
    } = counted(args)?;
    let w = args.world;
    let mut out = String::new();
    let frozen_text =
        match (frozen, &args.quantize_base) {
            (0, _) => String::new(),
            (n, None) => format!(" (LoRA adapters) beside {n} frozen ones"),
            (n, Some(form)) => {
                format!(
            " (LoRA adapters) beside {n} frozen ones, the base's linear weights{} in {form} \
             ({})",
            if args.quantize_embeddings { " and embeddings" } else { "" },
            mib(frozen_bytes)
        )
            }
        };
    let _ = writeln!(
        out,
        "{params} parameters{frozen_text} at {w} rank(s), AdamW, f32 master state (per rank, \
         without padding):"
    );
    let _ = writeln!(
        out,
        "{:<20} {:>14} {:>14} {:>14} {:>14}",
        "strategy", "parameters", "gradients", "optimizer", "total"
    );
    for (strategy, r) in rows(params, frozen_bytes, w) {
        let _ = writeln!(
            out,
            "{:<20} {:>14} {:>14} {:>14} {:>14}",
            strategy,
            mib(r.params),
            mib(r.grads),
            mib(r.optimizer),
            mib(r.total())
        );
    }
    let elem = args.precision.compute_bytes();
    match largest {
        Some((unit, n)) => {
            // A quantized unit is gathered as its stored blocks.
            let gathered = match (&config, base_form(args)?) {
                (Some(config), Some(form)) => (config.parameter_shapes().into_iter())
                    .filter(|(name, _)| name.starts_with(&format!("{unit}.")))
                    .map(|(name, shape)| {
                        held_bytes(&name, shape.iter().product(), Some(form), elem)
                    })
                    .sum(),
                _ => n * elem,
            };
            let _ = writeln!(
                out,
                "largest unit under full_shard: {unit}, {n} elements, {} gathered in {} (a rank \
                 holds up to three such units beside its shards)",
                mib(gathered),
                args.precision
            );
        }
        None => {
            let _ = writeln!(out, "largest unit: not known from --params alone");
        }
    }
    if let (Some(seq), Some(config)) = (args.seq, &config) {
        peak::report(
            &mut out,
            args,
            (seq, base_form(args)?),
            config,
            (params, frozen_bytes),
        );
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::char_corpus::CharWindows;
    use wick_trainer::{Attached, DataLoader, Trainer};

    const CONFIG: GptConfig = GptConfig {
        vocab: 11,
        block: 8,
        d_model: 16,
        n_layer: 2,
        n_head: 2,
    };

    /// A trainer of one step at `world` ranks of `strategy`, quiet.
    fn one_step(world: usize, strategy: Box<dyn Strategy>) -> Trainer {
        Trainer::builder()
            .devices(world)
            .strategy(strategy)
            .max_steps(1)
            .no_logger()
            .progress(false)
            .model_summary(false)
            .build()
            .unwrap()
    }

    /// `estimate --model model --world world`.
    fn model_args(model: std::path::PathBuf, world: usize) -> EstimateArgs {
        EstimateArgs {
            params: None,
            model: Some(model),
            world,
            precision: wick_strategies::Precision::Full,
            d_model: 64,
            n_layer: 2,
            n_head: 4,
            vocab: 85,
            block: 64,
            lora_rank: None,
            lora_targets: None,
            quantize_base: None,
            quantize_embeddings: false,
            seq: None,
            batch_size: 32,
            activation_checkpointing: wick_core::ActivationCheckpointing::None,
        }
    }

    #[test]
    fn a_hugging_face_model_is_estimated_from_its_config() {
        let fixture =
            std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/hf/llama");
        let args = model_args(fixture, 4);
        let text = report(&args).unwrap();
        // 384 x 64 embedding and head, two layers of 4 x 64 x 64 - 2 x 64 x 32 attention,
        // 3 x 64 x 88 MLP and two norms, and the final norm.
        let layer = 64 * 64 * 2 + 64 * 32 * 2 + 3 * 64 * 88 + 2 * 64;
        let total = 2 * 384 * 64 + 2 * layer + 64;
        assert!(
            text.starts_with(&format!("{total} parameters at 4 rank(s)")),
            "{text}"
        );
        assert!(
            text.contains(&format!(
                "largest unit under full_shard: model.layers.0, {layer} elements"
            )),
            "{text}"
        );
        // LoRA of rank 8 on q_proj (64 -> 64) and v_proj (64 -> 32) of both layers: only
        // the adapters have gradients and AdamW state, the base weights count as parameters.
        let lora = report(&EstimateArgs {
            lora_rank: Some(8),
            ..args
        })
        .unwrap();
        let adapters = 2 * (8 * 64 + 64 * 8 + 8 * 64 + 32 * 8);
        assert!(
            lora.starts_with(&format!(
                "{adapters} parameters (LoRA adapters) beside {total} frozen ones at 4 rank(s)"
            )),
            "{lora}"
        );
        let ddp = rows(adapters, 4 * total, 4)
            .into_iter()
            .find(|(n, _)| n == "ddp")
            .unwrap()
            .1;
        assert_eq!(
            (ddp.params, ddp.grads, ddp.optimizer),
            (4 * (adapters + total), 4 * adapters, 8 * adapters)
        );
    }

    /// Windows of a fixture's reference tokens, as a dataset.
    struct Windows(candle_core::Tensor);

    impl wick_trainer::Dataset for Windows {
        type Batch = wick_core::TokenBatch;
        fn len(&self) -> usize {
            self.0.dim(0).unwrap()
        }
        fn batch(
            &self,
            idx: &[usize],
            dev: &candle_core::Device,
        ) -> candle_core::Result<Self::Batch> {
            let idx: Vec<u32> = idx.iter().map(|&i| i as u32).collect();
            let rows = self
                .0
                .index_select(&candle_core::Tensor::new(idx, dev)?, 0)?;
            let seq = rows.dim(1)? - 1;
            Ok(wick_core::TokenBatch::new(
                rows.narrow(1, 0, seq)?.contiguous()?,
                rows.narrow(1, 1, seq)?.contiguous()?,
            ))
        }
        fn tokens_per_sample(&self) -> usize {
            self.0.dim(1).unwrap() - 1
        }
    }

    /// A QLoRA run's model state per rank, as its strategy reports it, is the estimate's
    /// within 5% (the base's blocks counted at their stored bytes), whole and sharded.
    #[test]
    fn a_quantized_base_is_estimated_at_its_stored_bytes() {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/hf/qwen2");
        let reference = candle_core::safetensors::load(
            dir.join("reference.safetensors"),
            &candle_core::Device::Cpu,
        )
        .unwrap();
        let windows = reference["windows"]
            .to_dtype(candle_core::DType::U32)
            .unwrap();
        let data = DataLoader::new(Windows(windows), 4).without_shuffle();
        for form in ["nf4", "q4_k"] {
            let args = EstimateArgs {
                lora_rank: Some(4),
                quantize_base: Some(form.into()),
                ..model_args(dir.clone(), 2)
            };
            let c = counted(&args).unwrap();
            assert!(
                c.frozen_bytes < 4 * c.frozen,
                "{form}: the base is not counted smaller"
            );
            for (name, estimate) in rows(c.params, c.frozen_bytes, 2) {
                let (ddp, full) = (name == "ddp", name == "fsdp full_shard");
                if !(ddp || full) {
                    continue;
                }
                let strategy = match ddp {
                    true => StrategySpec::new(StrategyKind::Ddp).build(),
                    false => Fsdp::new(FsdpSharding::FullShard).build(),
                };
                let lm = wick_models::CausalLm::from_pretrained(&dir).unwrap();
                let lm = lm.with_lora(wick_models::LoraConfig::new(4)).unwrap();
                let lm = lm.with_quantized_base(form.parse::<wick_core::BlockFormat>().unwrap());
                let mut model = Attached::new(lm.unwrap());
                one_step(2, strategy).fit(&mut model, &data, None).unwrap();
                let held = model.state_bytes().unwrap();
                for (what, held, estimated) in [
                    ("parameters", held.params, estimate.params),
                    ("total", held.total(), estimate.total()),
                ] {
                    let off = (held as f64 / estimated as f64 - 1.0).abs();
                    assert!(
                        off <= 0.05,
                        "{form} {name} {what}: holds {held}, estimated {estimated}"
                    );
                }
            }
        }
    }

    #[test]
    fn the_formulas() {
        let bytes: Vec<StateBytes> = rows(1000, 0, 4).into_iter().map(|(_, b)| b).collect();
        let [ddp, zero1, zero2, zero3, full, ..] = &bytes[..] else {
            panic!()
        };
        assert_eq!((ddp.params, ddp.grads, ddp.optimizer), (4000, 4000, 8000));
        assert_eq!(
            (zero1.params, zero1.grads, zero1.optimizer),
            (4000, 4000, 2000)
        );
        assert_eq!(
            (zero2.params, zero2.grads, zero2.optimizer),
            (4000, 1000, 2000)
        );
        assert_eq!(zero3.total(), 4000);
        assert_eq!(full.total(), 4000);
    }

    #[test]
    fn the_estimate_agrees_with_what_the_strategies_hold() {
        let units = model_units(CONFIG).unwrap();
        let params: usize = units.values().sum();
        let ids: Vec<u32> = (0..400).map(|i| (i * 7 % 11) as u32).collect();
        let data = DataLoader::new(CharWindows::new(ids, CONFIG.block, 1), 4);
        let world = 2;
        for ((name, strategy), (_, estimate)) in
            strategies().into_iter().zip(rows(params, 0, world))
        {
            let mut model = Attached::new(CharGpt::new(CONFIG, 1e-3));
            one_step(world, strategy)
                .fit(&mut model, &data, None)
                .unwrap();
            assert_eq!(model.num_parameters(), Some(params), "{name}");
            let held = model.state_bytes().unwrap();
            // Flat shards are padded to a multiple of W per unit: at most W - 1 elements a
            // unit, in each of the 4 f32 buffers (parameter, gradient, two moments).
            let padding = units.len() * (world - 1) * 4 * 4;
            for (what, held, estimated) in [
                ("parameters", held.params, estimate.params),
                ("gradients", held.grads, estimate.grads),
                ("optimizer", held.optimizer, estimate.optimizer),
            ] {
                assert!(
                    held >= estimated && held <= estimated + padding,
                    "{name} {what}: holds {held} bytes, estimated {estimated}"
                );
            }
        }
    }
}
