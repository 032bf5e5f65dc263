//! What `wick fit`'s options mean beyond their values: their checks, the strategy, LoRA and
//! learning-rate schedule they describe, and their TOML form.

use super::{name_of, FitArgs};
use wick_core::LrSchedule;
use wick_models::{LoraConfig, QuantizedBase};
use wick_strategies::{
    Fsdp, FsdpSharding, Precision, StrategyKind, StrategyOptions, StrategySpec, Zero3,
};

impl FitArgs {
    /// What clap checks on the command line, checked again for values from a file.
    pub(super) fn check(&self) -> Result<(), String> {
        let positive = [
            ("accumulate", self.accumulate),
            ("max-steps", self.max_steps),
            ("batch-size", self.batch_size),
            ("val-every", self.val_every),
            ("seq", self.seq),
            ("keep-last", self.keep_last),
            ("group-size", self.group_size),
        ];
        if let Some((key, _)) = positive.iter().find(|(_, v)| *v == 0) {
            return Err(format!("{key} must be a positive integer, got 0"));
        }
        self.strategy_spec()?;
        if let Some(lora) = self.lora() {
            lora.check()?;
            if self.model.is_none() {
                return Err("lora-rank fine-tunes a --model; the character model has none".into());
            }
        }
        if (self.quantize_base.is_some() || self.keep_quantized) && self.lora_rank.is_none() {
            return Err("quantize-base keeps a LoRA run's frozen base: give lora-rank".into());
        }
        if self.quantize_base.is_some() && self.keep_quantized {
            return Err("keep-quantized keeps the file's blocks: give no quantize-base".into());
        }
        if self.quantize_embeddings && self.quantize_base()?.is_none() {
            return Err(
                "quantize-embeddings holds the embeddings in the base's form: give \
                 quantize-base or keep-quantized"
                    .into(),
            );
        }
        if self.objective.preference_loss().is_some() && self.model.is_none() {
            return Err(format!(
                "objective {} tunes a --model on preference pairs; the character model has none",
                name_of(self.objective)
            ));
        }
        if self.objective.preference_loss().is_some() && self.packing.is_some() {
            return Err(format!(
                "objective {} lays each prompt and completion in a row of its own: packing \
                 does not apply",
                name_of(self.objective)
            ));
        }
        if !(self.beta > 0.0 && self.beta.is_finite()) {
            return Err(format!("beta must be a positive number, got {}", self.beta));
        }
        if !(self.lr > 0.0 && self.lr.is_finite()) {
            return Err(format!("lr must be a positive number, got {}", self.lr));
        }
        if self.devices == Some(0) || self.threads_per_rank == Some(0) {
            return Err("devices and threads-per-rank must be positive".into());
        }
        self.lr_schedule().validate().map_err(|e| {
            format!(
                "learning-rate schedule (--warmup-steps {}, --lr-decay {}, --min-lr-ratio {}, \
                 --decay-steps {}): {e}",
                self.lr_schedule().warmup_steps,
                name_of(self.lr_decay),
                self.min_lr_ratio,
                self.lr_schedule().total_steps
            )
        })
    }

    /// The form QLoRA keeps the frozen base in, when `quantize_base` names one or
    /// `keep_quantized` keeps the file's.
    pub fn quantize_base(&self) -> Result<Option<QuantizedBase>, String> {
        match self.keep_quantized {
            true => Ok(Some(QuantizedBase::AsRead)),
            false => self.quantize_base.as_deref().map(str::parse).transpose(),
        }
    }

    /// The LoRA options, when `lora_rank` turns LoRA on.
    pub fn lora(&self) -> Option<LoraConfig> {
        Some(LoraConfig {
            rank: self.lora_rank?,
            alpha: self.lora_alpha,
            dropout: self.lora_dropout,
            targets: self.lora_targets.clone(),
        })
    }

    /// The strategy these options describe, or which option is not one of the chosen
    /// strategy's.
    pub fn strategy_spec(&self) -> Result<StrategySpec, String> {
        let fsdp_only = [
            ("sharding", self.sharding != FsdpSharding::default()),
            ("precision", self.precision != Precision::Full),
            ("auto-wrap", self.auto_wrap.is_some()),
        ];
        let not_its =
            |option: &str| format!("{option} is an option of fsdp, not {}", self.strategy);
        let strategy = match self.strategy {
            StrategyKind::Fsdp => StrategyOptions::Fsdp(self.fsdp().map_err(|e| e.to_string())?),
            kind => {
                if let Some((option, _)) = fsdp_only.iter().find(|(_, given)| *given) {
                    return Err(not_its(option));
                }
                match (kind, self.prefetch) {
                    (StrategyKind::Zero3, prefetch) => {
                        StrategyOptions::Zero3(Zero3::new().with_prefetch(prefetch))
                    }
                    (_, true) => {
                        return Err(format!(
                            "prefetch is an option of zero3 and fsdp, not {kind}"
                        ))
                    }
                    (kind, false) => StrategySpec::new(kind).strategy,
                }
            }
        };
        Ok(StrategySpec {
            strategy,
            activation_checkpointing: self.activation_checkpointing,
        })
    }

    /// The fsdp options these options describe, or the error of the first that does not go
    /// with its sharding (mixed precision under `no_shard`). Only `hybrid_shard` reads the
    /// group size.
    fn fsdp(&self) -> wick_core::Result<Fsdp> {
        let mut fsdp = Fsdp::new(self.sharding)
            .with_precision(self.precision)?
            .with_prefetch(self.prefetch);
        if self.sharding == FsdpSharding::HybridShard {
            fsdp = fsdp.with_group_size(self.group_size)?;
        }
        if let Some(prefixes) = &self.auto_wrap {
            fsdp = fsdp.with_auto_wrap(prefixes.clone());
        }
        Ok(fsdp)
    }

    /// The schedule of the options: warmup, then the decay until `decay-steps`.
    pub fn lr_schedule(&self) -> LrSchedule {
        let total = self.decay_steps.unwrap_or(self.max_steps);
        LrSchedule {
            warmup_steps: self.warmup_steps.unwrap_or(total / 10),
            decay: self.lr_decay,
            total_steps: total,
            min_lr_ratio: self.min_lr_ratio,
        }
    }

    /// These options as (name, value), by their TOML keys: what the loggers record as the
    /// run's options.
    pub fn options(&self) -> Vec<(String, String)> {
        let table: toml::Table = self.to_toml().parse().expect("the options parse back");
        table
            .into_iter()
            .map(|(key, value)| match value {
                toml::Value::String(s) => (key, s),
                other => (key, other.to_string()),
            })
            .collect()
    }

    /// These options as TOML, which `--config` reads back.
    pub fn to_toml(&self) -> String {
        toml::to_string(self).expect("the options serialize")
    }
}
