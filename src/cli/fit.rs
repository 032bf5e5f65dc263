//! `wick fit`'s options: the effective [`FitArgs`] (defaults, then `--config`'s TOML file,
//! then the command line's flags, `fit_flags.rs`), their checks, and the learning-rate
//! schedule they describe.

use super::{name_of, AcceleratorName, DecayName};
use serde::{Deserialize, Serialize};
use std::path::PathBuf;
use wick_core::{ActivationCheckpointing, Decay, LrSchedule, OnNonFinite};
use wick_models::LoraConfig;
use wick_strategies::{FsdpSharding, FsdpSpec, Precision, StrategyKind, StrategySpec};

/// The effective options of `wick fit`: the defaults, overridden by `--config`, overridden
/// by the command line. Keys in TOML are the long options without dashes.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields, rename_all = "kebab-case")]
pub struct FitArgs {
    pub strategy: StrategyKind,
    pub sharding: FsdpSharding,
    pub group_size: usize,
    pub precision: Precision,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub auto_wrap: Option<Vec<String>>,
    pub prefetch: bool,
    pub accumulate: usize,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub clip: Option<f64>,
    /// Which wrapped units recompute their forward in backward: none, full, every:K.
    #[serde(with = "as_text")]
    pub activation_checkpointing: ActivationCheckpointing,
    /// What a step with an inf or NaN loss or gradient does: error or skip.
    #[serde(with = "as_text")]
    pub on_nonfinite: OnNonFinite,
    /// Ranks: threads (default 2), or a launcher's processes (default: as many as it started).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub devices: Option<usize>,
    pub accelerator: AcceleratorName,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub threads_per_rank: Option<usize>,
    pub max_steps: usize,
    pub seed: u64,
    pub batch_size: usize,
    pub lr: f64,
    /// `None`: a tenth of `max_steps`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub warmup_steps: Option<usize>,
    pub lr_decay: DecayName,
    /// `None`: `max_steps`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub decay_steps: Option<usize>,
    pub min_lr_ratio: f64,
    pub val_every: usize,
    pub run_name: String,
    pub log_dir: PathBuf,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub data: Option<PathBuf>,
    /// A Hugging Face model directory to fine-tune, or a config.json to pre-train.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub model: Option<PathBuf>,
    /// The model's tokenizer.json, when `model` is a config.json.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tokenizer: Option<PathBuf>,
    /// LoRA of this rank on `model` (off when `None`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub lora_rank: Option<usize>,
    pub lora_alpha: f64,
    pub lora_dropout: f64,
    pub lora_targets: Vec<String>,
    /// Tokens per window of a `model` run.
    pub seq: usize,
    pub no_progress: bool,
    /// Collectives complete where they are issued (no overlap with compute).
    pub no_overlap_comm: bool,
    pub checkpoint_dir: PathBuf,
    /// Save a checkpoint every this many steps and at the end (unless `no_checkpoints`).
    pub save_every: usize,
    /// Checkpoints written in the background while training goes on.
    pub async_save: bool,
    pub no_checkpoints: bool,
    pub keep_last: usize,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub resume: Option<PathBuf>,
}

/// A value kept in TOML as the text users type (its `Display` and `FromStr`).
mod as_text {
    use serde::{de::Error, Deserialize, Deserializer, Serializer};
    use std::fmt::Display;
    use std::str::FromStr;

    pub fn serialize<T: Display, S: Serializer>(value: &T, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(value)
    }

    pub fn deserialize<'de, T, D>(d: D) -> Result<T, D::Error>
    where
        T: FromStr,
        T::Err: Display,
        D: Deserializer<'de>,
    {
        String::deserialize(d)?.parse().map_err(D::Error::custom)
    }
}

impl Default for FitArgs {
    fn default() -> Self {
        FitArgs {
            strategy: StrategyKind::Fsdp,
            sharding: FsdpSharding::FullShard,
            group_size: 2,
            precision: Precision::Full,
            auto_wrap: None,
            prefetch: false,
            accumulate: 1,
            clip: None,
            activation_checkpointing: ActivationCheckpointing::None,
            on_nonfinite: OnNonFinite::Error,
            devices: None,
            accelerator: AcceleratorName::Cpu,
            threads_per_rank: None,
            max_steps: 400,
            seed: 0,
            batch_size: 32,
            lr: 1e-2,
            warmup_steps: None,
            lr_decay: DecayName::Cosine,
            decay_steps: None,
            min_lr_ratio: 0.1,
            val_every: 100,
            run_name: "char-gpt".into(),
            log_dir: "runs".into(),
            data: None,
            model: None,
            tokenizer: None,
            lora_rank: None,
            lora_alpha: LoraConfig::default().alpha,
            lora_dropout: LoraConfig::default().dropout,
            lora_targets: LoraConfig::default().targets,
            seq: 128,
            no_progress: false,
            no_overlap_comm: false,
            checkpoint_dir: "checkpoints".into(),
            save_every: 100,
            async_save: false,
            no_checkpoints: false,
            keep_last: 3,
            resume: None,
        }
    }
}

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
        ];
        if let Some((key, _)) = positive.iter().find(|(_, v)| *v == 0) {
            return Err(format!("{key} must be a positive integer, got 0"));
        }
        self.strategy_spec()?.build().map_err(|e| e.to_string())?;
        if let Some(lora) = self.lora() {
            lora.check()?;
            if self.model.is_none() {
                return Err("lora-rank fine-tunes a --model; the character model has none".into());
            }
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
        let spec = match self.strategy {
            StrategyKind::Fsdp => StrategySpec::Fsdp(FsdpSpec {
                sharding: self.sharding,
                group_size: self.group_size,
                precision: self.precision,
                prefetch: self.prefetch,
                auto_wrap: self.auto_wrap.clone(),
                activation_checkpointing: self.activation_checkpointing,
            }),
            kind => {
                if let Some((option, _)) = fsdp_only.iter().find(|(_, given)| *given) {
                    return Err(not_its(option));
                }
                match (kind, self.prefetch) {
                    (StrategyKind::Zero3, prefetch) => StrategySpec::Zero3 {
                        prefetch,
                        activation_checkpointing: self.activation_checkpointing,
                    },
                    (_, true) => {
                        return Err(format!(
                            "prefetch is an option of zero3 and fsdp, not {kind}"
                        ))
                    }
                    (kind, false) => StrategySpec::new(kind)
                        .with_activation_checkpointing(self.activation_checkpointing),
                }
            }
        };
        Ok(spec)
    }

    /// The schedule of the options: warmup, then the decay until `decay-steps`.
    pub fn lr_schedule(&self) -> LrSchedule {
        let total = self.decay_steps.unwrap_or(self.max_steps);
        let decay = match self.lr_decay {
            DecayName::Cosine => Decay::Cosine,
            DecayName::Linear => Decay::Linear,
            DecayName::Constant => Decay::Constant,
        };
        LrSchedule {
            warmup_steps: self.warmup_steps.unwrap_or(total / 10),
            decay,
            total_steps: total,
            min_lr_ratio: self.min_lr_ratio,
        }
    }

    /// These options as TOML, which `--config` reads back.
    pub fn to_toml(&self) -> String {
        toml::to_string(self).expect("the options serialize")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cli::{Cli, Command};
    use clap::Parser;

    fn parse(s: &str) -> Result<Command, String> {
        Cli::try_parse_from(std::iter::once("wick").chain(s.split_whitespace()))
            .map(|c| c.command)
            .map_err(|e| e.to_string())
    }

    fn fit(s: &str) -> Result<FitArgs, String> {
        match parse(s)? {
            Command::Fit(flags) => flags.resolve(),
            other => panic!("{other:?}"),
        }
    }

    /// A file holding `text`, removed when dropped.
    fn temp_file(text: &str) -> tempfile::NamedTempFile {
        let file = tempfile::NamedTempFile::new().unwrap();
        std::fs::write(file.path(), text).unwrap();
        file
    }

    #[test]
    fn defaults_and_overrides() {
        assert_eq!(fit("fit").unwrap(), FitArgs::default());
        let a =
            fit("fit --strategy single --devices 1 --max-steps 5 --seed 9 --threads-per-rank 3")
                .unwrap();
        assert_eq!(
            (
                a.strategy,
                a.devices,
                a.max_steps,
                a.seed,
                a.threads_per_rank
            ),
            (StrategyKind::Single, Some(1), 5, 9, Some(3))
        );
        let a =
            fit("fit --no-progress --no-checkpoints --auto-wrap blocks.,head --prefetch").unwrap();
        assert_eq!(
            (a.no_progress, a.no_checkpoints, a.prefetch),
            (true, true, true)
        );
        assert_eq!(a.auto_wrap, Some(vec!["blocks.".into(), "head".into()]));
        for (flag, ac) in [
            ("full", ActivationCheckpointing::Full),
            ("every:3", ActivationCheckpointing::Every(3)),
        ] {
            let a = fit(&format!("fit --activation-checkpointing {flag}")).unwrap();
            assert_eq!(a.activation_checkpointing, ac);
        }
        let e = fit("fit --activation-checkpointing every:0").unwrap_err();
        assert!(e.contains("every:K") && e.contains("'every:0'"), "{e}");
        let a = fit("fit --model m --lora-rank 16 --lora-alpha 32 --lora-targets q_proj,up_proj")
            .unwrap();
        let lora = a.lora().unwrap();
        assert_eq!((lora.rank, lora.alpha, lora.dropout), (16, 32.0, 0.0));
        assert_eq!(lora.targets, ["q_proj", "up_proj"]);
        let e = fit("fit --model m --lora-rank 4 --lora-targets c_attn").unwrap_err();
        assert!(e.contains("c_attn") && e.contains("q_proj"), "{e}");
        let e = fit("fit --model m --lora-rank 4 --lora-dropout 1").unwrap_err();
        assert!(e.contains("--lora-dropout 1"), "{e}");
        assert!(fit("fit --lora-rank 4").is_err(), "LoRA without --model");
        let a = fit("fit --checkpoint-dir ck --resume last").unwrap();
        assert_eq!(a.resume, Some(PathBuf::from("ck/last")));
        let Command::Consolidate { with_optimizer, .. } =
            parse("consolidate ck/last out.safetensors --with-optimizer").unwrap()
        else {
            panic!()
        };
        assert!(with_optimizer);
    }

    #[test]
    fn the_toml_keys_are_exactly_the_long_options_without_dashes() {
        use clap::CommandFactory;
        let cli = Cli::command();
        let fit = cli.find_subcommand("fit").unwrap();
        let mut options: Vec<&str> = fit
            .get_arguments()
            .filter_map(|a| a.get_long())
            .filter(|l| !["config", "print-config"].contains(l))
            .collect();
        options.sort();
        // Every optional value given, so that every key is printed.
        let all = FitArgs {
            auto_wrap: Some(vec!["blocks.".into()]),
            clip: Some(1.0),
            devices: Some(2),
            threads_per_rank: Some(1),
            warmup_steps: Some(1),
            decay_steps: Some(9),
            data: Some("text.txt".into()),
            model: Some("model".into()),
            tokenizer: Some("tokenizer.json".into()),
            lora_rank: Some(16),
            resume: Some("ck".into()),
            ..FitArgs::default()
        };
        let table: toml::Table = all.to_toml().parse().unwrap();
        let mut keys: Vec<&str> = table.keys().map(String::as_str).collect();
        keys.sort();
        assert_eq!(keys, options);
    }

    #[test]
    fn a_config_file_is_overridden_by_the_command_line() {
        let file =
            temp_file("strategy = \"zero3\"\nmax-steps = 50\nlr = 0.01\nno-progress = true\n");
        let a = fit(&format!(
            "fit --config {} --max-steps 7",
            file.path().display()
        ))
        .unwrap();
        assert_eq!(
            (a.strategy, a.max_steps, a.lr, a.no_progress),
            (StrategyKind::Zero3, 7, 0.01, true)
        );
    }

    #[test]
    fn print_config_round_trips() {
        let a = fit(
            "fit --strategy fsdp --sharding shard_grad_op --clip 0.5 --precision bf16-mixed \
             --devices 4",
        )
        .unwrap();
        let file = temp_file(&a.to_toml());
        let b = fit(&format!("fit --config {}", file.path().display())).unwrap();
        assert_eq!(a, b);
        assert!(
            a.to_toml().contains("precision = \"bf16-mixed\""),
            "{}",
            a.to_toml()
        );
    }

    #[test]
    fn options_that_do_not_go_together_are_refused_by_name() {
        for (line, refusal) in [
            (
                "fit --strategy zero2 --precision bf16-mixed",
                "precision is an option of fsdp, not zero2",
            ),
            (
                "fit --strategy ddp --sharding no_shard",
                "sharding is an option of fsdp, not ddp",
            ),
            (
                "fit --strategy ddp --prefetch",
                "prefetch is an option of zero3 and fsdp, not ddp",
            ),
        ] {
            let program = fit(line).unwrap_err();
            assert!(program.contains(refusal), "{line}: {program}");
        }
        // What the types let through, the library refuses when it builds the strategy.
        let spec = StrategySpec::Fsdp(FsdpSpec {
            sharding: FsdpSharding::NoShard,
            precision: Precision::F16Mixed,
            ..FsdpSpec::default()
        });
        let library = spec.build().err().unwrap().to_string();
        let program = fit("fit --sharding no_shard --precision 16-mixed").unwrap_err();
        assert!(program.contains(&library), "{program} / {library}");
    }

    #[test]
    fn bad_input_gets_one_clear_error() {
        let e = parse("fit --strategy zero9").unwrap_err();
        assert!(
            e.contains("'zero9'") && e.contains("single, ddp, zero1, zero2, zero3, fsdp"),
            "{e}"
        );
        let e = parse("fit --sharding half").unwrap_err();
        assert!(
            e.contains("full_shard, shard_grad_op, no_shard, hybrid_shard"),
            "{e}"
        );
        let e = parse("fit --precision 8").unwrap_err();
        assert!(e.contains("32, bf16-mixed, 16-mixed"), "{e}");
        let e = parse("fit --accelerator tpu").unwrap_err();
        assert!(e.contains("cpu, cuda"), "{e}");
        let e = parse("fit --devices two").unwrap_err();
        assert!(
            e.contains("'two'") && e.contains("--devices") && e.contains("positive integer"),
            "{e}"
        );
        assert!(parse("fit --max-steps 0")
            .unwrap_err()
            .contains("positive integer"));
        assert!(parse("fit --lr -1")
            .unwrap_err()
            .contains("positive number"));
        assert!(parse("fit --frobnicate")
            .unwrap_err()
            .contains("'--frobnicate'"));
        assert!(parse("train").unwrap_err().contains("'train'"));
        assert!(parse("consolidate only-one").unwrap_err().contains("<OUT>"));
        assert!(parse("fit --save-every 5 --no-checkpoints").is_err());
        // The same checks hold for a config file, naming it.
        let file = temp_file("max-steps = 0\n");
        let name = file.path().display().to_string();
        let e = fit(&format!("fit --config {name}")).unwrap_err();
        assert!(
            e.contains(&name) && e.contains("max-steps must be a positive integer"),
            "{e}"
        );
        std::fs::write(file.path(), "strategy = \"zero9\"\n").unwrap();
        let e = fit(&format!("fit --config {name}")).unwrap_err();
        assert!(e.contains(&name) && e.contains("zero9"), "{e}");
        std::fs::write(file.path(), "max_steps = 3\n").unwrap();
        let e = fit(&format!("fit --config {}", file.path().display())).unwrap_err();
        assert!(e.contains("unknown field `max_steps`"), "{e}");
        let e = fit("fit --config /nonexistent/run.toml").unwrap_err();
        assert!(e.contains("/nonexistent/run.toml"), "{e}");
    }

    #[test]
    fn the_learning_rate_schedule_options() {
        let a = fit("fit").unwrap();
        assert_eq!(
            a.lr_schedule(),
            LrSchedule::warmup_cosine(40, 400, 0.1),
            "the main job's default: a tenth of the steps warming up, cosine to a tenth"
        );
        let a =
            fit("fit --max-steps 100 --warmup-steps 5 --lr-decay linear --min-lr-ratio 0").unwrap();
        assert_eq!(a.lr_schedule(), LrSchedule::warmup_linear(5, 100, 0.0));
        let a = fit("fit --lr-decay constant --warmup-steps 0").unwrap();
        assert_eq!(a.lr_schedule().factor(0), 1.0);
        let e = fit("fit --max-steps 20 --warmup-steps 50").unwrap_err();
        assert!(
            e.contains("--warmup-steps 50") && e.contains("--decay-steps 20"),
            "{e}"
        );
        // The decay's horizon apart from the run's length: a 6-step run follows the first
        // 6 steps of a 12-step one.
        let a = fit("fit --max-steps 6 --decay-steps 12").unwrap();
        assert_eq!(a.lr_schedule(), LrSchedule::warmup_cosine(1, 12, 0.1));
        let e = fit("fit --min-lr-ratio 2").unwrap_err();
        assert!(e.contains("min_lr_ratio"), "{e}");
    }
}
