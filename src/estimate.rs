//! `wick estimate`: model-state bytes per rank for each strategy, from the ZeRO formulas
//! wick's strategies meet (AdamW: 4 bytes of parameter, 4 of gradient and 8 of state per
//! element, each either whole on every rank or sharded over W), and the largest unit that
//! full_shard gathers: "will it fit?" before trying, as DeepSpeed's estimators answer.

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

/// Every strategy's bytes per rank for `params` trainable and `frozen` frozen elements at
/// `world` ranks.
pub fn rows(params: usize, frozen: usize, world: usize) -> Vec<(String, StateBytes)> {
    strategies()
        .into_iter()
        .map(|(name, s)| {
            let bytes = s
                .sharding()
                .adamw_formula_with_frozen(params, frozen, world);
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
    /// The largest unit and its elements (unknown from `--params` alone).
    largest: Option<(String, usize)>,
}

/// What `args` asks about, counted.
fn counted(args: &EstimateArgs) -> anyhow::Result<Counted> {
    let mut frozen = 0;
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
            match lora(args)? {
                Some(lora) => {
                    frozen = base;
                    let adapters = lora.adapter_shapes(&config);
                    let count = adapters
                        .iter()
                        .map(|(_, s)| s.iter().product::<usize>())
                        .sum();
                    (count, largest)
                }
                None => (base, largest),
            }
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
        largest,
    })
}

/// The report `wick estimate` prints.
pub fn report(args: &EstimateArgs) -> anyhow::Result<String> {
    let Counted {
        params,
        frozen,
        largest,
    } = counted(args)?;
    let w = args.world;
    let mut out = String::new();
    let frozen_text = match frozen {
        0 => String::new(),
        n => format!(" (LoRA adapters) beside {n} frozen ones"),
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
    for (strategy, r) in rows(params, frozen, w) {
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
            let _ = writeln!(
                out,
                "largest unit under full_shard: {unit}, {n} elements, {} gathered in {} (a rank \
                 holds up to three such units beside its shards)",
                mib(n * elem),
                args.precision
            );
        }
        None => {
            let _ = writeln!(out, "largest unit: not known from --params alone");
        }
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

    #[test]
    fn a_hugging_face_model_is_estimated_from_its_config() {
        let fixture =
            std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/hf/llama");
        let args = EstimateArgs {
            params: None,
            model: Some(fixture),
            world: 4,
            precision: wick_strategies::Precision::Full,
            d_model: 64,
            n_layer: 2,
            n_head: 4,
            vocab: 85,
            block: 64,
            lora_rank: None,
            lora_targets: None,
        };
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
        let ddp = rows(adapters, total, 4)
            .into_iter()
            .find(|(n, _)| n == "ddp")
            .unwrap()
            .1;
        assert_eq!(
            (ddp.params, ddp.grads, ddp.optimizer),
            (4 * (adapters + total), 4 * adapters, 8 * adapters)
        );
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
            let mut trainer = Trainer::builder()
                .devices(world)
                .strategy(strategy)
                .max_steps(1)
                .no_logger()
                .progress(false)
                .model_summary(false)
                .build()
                .unwrap();
            let mut model = Attached::new(CharGpt::new(CONFIG, 1e-3));
            trainer.fit(&mut model, &data, None).unwrap();
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
