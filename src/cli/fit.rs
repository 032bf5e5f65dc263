//! `wick fit`'s options: one struct, [`FitArgs`], that is at once the command line (clap,
//! whose defaults are the defaults), the TOML file `--config` reads (serde, keys the long
//! options without dashes) and the effective options the run reads. [`FitCommand`] adds
//! `--config` and `--print-config` and resolves the three layers: defaults, then the file,
//! then the flags the command line gave.

use super::{positive, positive_number};
use clap::{Args, FromArgMatches, Parser};
use serde::{Deserialize, Serialize};
use std::path::PathBuf;
use wick::accelerator::DeviceKind;
use wick::core::Decay;
use wick_core::{ActivationCheckpointing, BlockFormat, OnNonFinite};
use wick_models::LoraConfig;
use wick_strategies::{FsdpSharding, Precision, StrategyKind};
use wick_trainer::Logger;

/// `wick fit`'s command line: its options, and where else to read them from.
#[derive(Debug, Args)]
pub struct FitCommand {
    /// Read every option from this TOML file (keys: the long options without dashes);
    /// options on the command line override it.
    #[arg(long, value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// Print the effective options as TOML and exit.
    #[arg(long)]
    pub print_config: bool,
    #[command(flatten)]
    pub args: FitArgs,
    /// The TOML keys of the options the command line gave (filled by
    /// [`super::parse_from`]): only those override the file.
    #[arg(skip)]
    pub given: Vec<String>,
}

/// The options of `wick fit`, from the command line, a TOML file, or both.
#[derive(Debug, Clone, PartialEq, Args, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields, rename_all = "kebab-case")]
pub struct FitArgs {
    /// Distribution strategy.
    #[arg(long, value_enum, default_value_t = StrategyKind::Fsdp)]
    pub strategy: StrategyKind,
    /// FSDP sharding.
    #[arg(long, value_enum, default_value_t = FsdpSharding::FullShard)]
    pub sharding: FsdpSharding,
    /// Ranks per group for hybrid_shard.
    #[arg(long, value_parser = positive, value_name = "N", default_value_t = 2)]
    pub group_size: usize,
    /// fsdp: units computed and gradients reduced in 16 bits.
    #[arg(long, value_enum, default_value_t = Precision::Full)]
    pub precision: Precision,
    /// fsdp: only blocks whose names start with one of these prefixes are units of their
    /// own (e.g. blocks.); the others share one root unit [default: every block].
    #[arg(long, value_delimiter = ',', value_name = "P,Q")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub auto_wrap: Option<Vec<String>>,
    /// zero3, fsdp full_shard/hybrid_shard: gather the next unit in the background.
    #[arg(long)]
    pub prefetch: bool,
    /// Global batches per optimizer step.
    #[arg(long, value_parser = positive, value_name = "N", default_value_t = 1)]
    pub accumulate: usize,
    /// Clip gradients to this global L2 norm.
    #[arg(long, value_parser = positive_number, value_name = "X", allow_hyphen_values = true)]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub clip: Option<f64>,
    /// Recompute the forward of these wrapped units in backward instead of keeping their
    /// activations: none, full, or every:K (every K-th unit).
    #[arg(long, value_name = "none|full|every:K", default_value_t = ActivationCheckpointing::None)]
    #[serde(with = "as_text")]
    pub activation_checkpointing: ActivationCheckpointing,
    /// A step whose loss or gradients hold inf or NaN: error (stop, naming the step, the
    /// rank and the first such parameter) or skip (on every rank, counted in metrics.csv's
    /// skipped_steps).
    #[arg(long, value_name = "error|skip", default_value_t = OnNonFinite::Error)]
    #[serde(with = "as_text")]
    pub on_nonfinite: OnNonFinite,
    /// Ranks: threads [default: 2], or under mpirun/srun (a build with --features mpi) one
    /// per process, as many as the launcher started.
    #[arg(long, value_parser = positive, value_name = "N")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub devices: Option<usize>,
    /// cpu, or cuda: rank r on GPU r (a build with --features cuda, or cuda,nccl).
    #[arg(long, value_enum, default_value_t = DeviceKind::Cpu)]
    pub accelerator: DeviceKind,
    /// Compute threads of each CPU rank, a thread or a launcher's process [default: the
    /// cores shared out between threads; a process uses all its host's].
    #[arg(long, value_parser = positive, value_name = "N")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub threads_per_rank: Option<usize>,
    /// How long, in milliseconds, the idle compute threads of a CPU rank with more than one
    /// keep looking for work before they nap, as OpenMP's do between parallel regions
    /// [default: 5; 0: they sleep at once, as rayon's do].
    #[arg(long, value_name = "MS")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub worker_spin_ms: Option<u64>,
    /// Optimizer steps.
    #[arg(long, value_parser = positive, value_name = "N", default_value_t = 400)]
    pub max_steps: usize,
    /// Seed of init and data order.
    #[arg(long, value_name = "N", default_value_t = 0)]
    pub seed: u64,
    /// Global batch size, a multiple of --devices.
    #[arg(long, value_parser = positive, value_name = "N", default_value_t = 32)]
    pub batch_size: usize,
    /// AdamW peak learning rate (after warmup) [default: by what the run trains: 1e-2 a new
    /// model, 2e-5 a --model fine-tuned whole, 1e-6 tuned whole by preference, 2e-4 its
    /// LoRA adapters (TRL's and PEFT's)].
    #[arg(long, value_parser = positive_number, value_name = "X", allow_hyphen_values = true, default_value_t = RunKind::New.default_lr(), hide_default_value = true)]
    pub lr: f64,
    /// Steps of linear learning-rate warmup [default: a tenth of --decay-steps for a new
    /// model, none fine-tuning a --model (transformers' and TRL's)].
    #[arg(long, value_name = "N")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub warmup_steps: Option<usize>,
    /// How the rate falls after warmup, reaching --min-lr-ratio at --decay-steps.
    #[arg(long, value_enum, default_value_t = Decay::Cosine)]
    pub lr_decay: Decay,
    /// The step at which the decay reaches its floor (the rate stays there after it)
    /// [default: --max-steps].
    #[arg(long, value_parser = positive, value_name = "N")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub decay_steps: Option<usize>,
    /// The floor of the decay, as a fraction of --lr.
    #[arg(long, value_name = "X", default_value_t = 0.1)]
    pub min_lr_ratio: f64,
    /// Validate every N steps.
    #[arg(long, value_parser = positive, value_name = "N", default_value_t = 100)]
    pub val_every: usize,
    /// Metrics go to <log dir>/<run name>/metrics.csv; a new run never reuses another's
    /// directory, taking <run name>-v1, -v2, ... instead (a --model run is named after its
    /// model).
    #[arg(long, value_name = "NAME", default_value = "char-gpt")]
    pub run_name: String,
    /// Where each run's directory goes.
    #[arg(long, value_name = "DIR", default_value = "runs")]
    pub log_dir: PathBuf,
    /// Where rank 0 logs each step: any of csv (<run>/metrics.csv), tensorboard (event
    /// files in <run>/; `tensorboard --logdir <log dir>`), mlflow (a tracking server's run).
    #[arg(long, value_delimiter = ',', value_name = "L,M", default_values_t = Logger::DEFAULT.to_vec())]
    pub logger: Vec<Logger>,
    /// The MLflow tracking server of --logger mlflow, http://host:port [default:
    /// MLFLOW_TRACKING_URI].
    #[arg(long, value_name = "URI")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub mlflow_uri: Option<String>,
    /// Train on this UTF-8 text instead of the bundled corpus; with --model, the token file
    /// `wick prepare` wrote.
    #[arg(long, value_name = "FILE")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub data: Option<PathBuf>,
    /// Fine-tune this Hugging Face model directory (config.json, model.safetensors,
    /// tokenizer.json) or llama.cpp GGUF file, or pre-train a new model of this
    /// config.json, on --data's tokens [default: the bundled character model].
    #[arg(long, value_name = "DIR|FILE.gguf")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub model: Option<PathBuf>,
    /// The tokenizer.json (or GGUF file) of a --model config.json (a model directory or
    /// GGUF file has its own).
    #[arg(long, value_name = "FILE", requires = "model")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tokenizer: Option<PathBuf>,
    /// Fine-tune --model with LoRA of this rank: its weights frozen (no gradient, no
    /// optimizer state), adapters beside the --lora-targets layers the only parameters
    /// trained and saved.
    #[arg(long, value_parser = positive, value_name = "R", requires = "model")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub lora_rank: Option<usize>,
    /// LoRA's alpha: the update is scaled by alpha / rank (PEFT's default).
    #[arg(long, value_parser = positive_number, value_name = "A", requires = "lora_rank", default_value_t = LoraConfig::default().alpha)]
    pub lora_alpha: f64,
    /// The dropout of each adapter's input in training.
    #[arg(long, value_name = "P", requires = "lora_rank", default_value_t = LoraConfig::default().dropout)]
    pub lora_dropout: f64,
    /// The adapted layers of each block, of q_proj, k_proj, v_proj, o_proj, gate_proj,
    /// up_proj, down_proj (PEFT's default).
    #[arg(
        long,
        value_delimiter = ',',
        value_name = "L,M",
        requires = "lora_rank",
        default_values_t = LoraConfig::default().targets
    )]
    pub lora_targets: Vec<String>,
    /// QLoRA: the frozen base's linear weights born and kept in this form (nf4: NF4 with
    /// double quantization, as bitsandbytes stores it; q8_0, q4_k, q6_k and llama.cpp's
    /// other block types), decoded inside each layer in forward and again in backward.
    /// Kept whole by single, ddp, zero1 and zero2, sharded by whole blocks by zero3 and fsdp.
    #[arg(long, value_name = "FORM", requires = "lora_rank", value_parser = BlockFormat::ALL.map(BlockFormat::name))]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub quantize_base: Option<String>,
    /// QLoRA over a quantized GGUF --model: its linear weights kept in the file's own
    /// blocks, as they are (each in its own type; one the file holds in f32, f16 or bf16
    /// stays dense), rather than dequantized.
    #[arg(long, requires = "lora_rank", conflicts_with = "quantize_base")]
    pub keep_quantized: bool,
    /// QLoRA: the token embedding and output head held in the base's form too (with
    /// --keep-quantized, in the file's own blocks), sharded by whole blocks, their rows
    /// decoded as tokens look them up and, as the output head, a slice at a time: for a
    /// large vocabulary (Llama 3's is a fifth of a 1B model), in place of an f32 table that
    /// fsdp gathers whole.
    #[arg(long, requires = "lora_rank")]
    pub quantize_embeddings: bool,
    /// Tokens per window with --model.
    #[arg(long, value_parser = positive, value_name = "N", default_value_t = 128)]
    pub seq: usize,
    /// How the token file's documents are laid into windows with --model: whole examples,
    /// each attending to itself only with its positions restarting (documents), the tokens
    /// one after another (concat), or one example per window (padded) [default: documents
    /// for instruction data, concat for plain text].
    #[arg(long, value_enum, value_name = "HOW")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub packing: Option<super::PackingArg>,
    /// What the loss is: sft (next-token cross-entropy), or, on a preference token file
    /// (`wick prepare` of prompt/chosen/rejected rows), dpo (DPO's sigmoid loss) or ipo,
    /// against --model as it starts (under LoRA, the model with its adapters off).
    #[arg(long, value_enum, value_name = "sft|dpo|ipo", default_value_t = super::ObjectiveArg::Sft)]
    pub objective: super::ObjectiveArg,
    /// dpo and ipo: how far the policy may move from the reference (DPO's β, IPO's τ;
    /// TRL's default).
    #[arg(long, value_parser = positive_number, value_name = "B", default_value_t = 0.1)]
    pub beta: f64,
    /// No progress bar.
    #[arg(long)]
    pub no_progress: bool,
    /// Complete every collective where it is issued instead of overlapping gradient
    /// reductions and prefetched gathers with compute (same numbers; for measuring what
    /// overlap hides, comm_wait_s in metrics.csv).
    #[arg(long)]
    pub no_overlap_comm: bool,
    /// Where checkpoints go: D/step-N/ and D/last; a new run never saves into a D that
    /// holds another run's, taking D-v1, -v2, ... instead.
    #[arg(long, value_name = "D", default_value = "checkpoints")]
    pub checkpoint_dir: PathBuf,
    /// Save a checkpoint every N steps and at the end, keeping the newest --keep-last.
    #[arg(long, value_parser = positive, value_name = "N", default_value_t = 100)]
    pub save_every: usize,
    /// Write checkpoints in the background while training goes on (each rank's state is
    /// copied to host memory at the step, then written by a thread of its own).
    #[arg(long)]
    pub async_save: bool,
    /// Save no checkpoints.
    #[arg(long, conflicts_with = "save_every")]
    pub no_checkpoints: bool,
    /// Keep the K newest checkpoints, deleting older ones of this run.
    #[arg(long, value_parser = positive, value_name = "K", default_value_t = 3)]
    pub keep_last: usize,
    /// Continue from checkpoint C, 'last' for the newest in --checkpoint-dir, or 'auto':
    /// 'last' when --checkpoint-dir has one, a fresh start otherwise (the one command of a
    /// requeued job). At any --devices; raise --max-steps to train further.
    #[arg(long, value_name = "C")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub resume: Option<PathBuf>,
}

/// [`FitArgs`] alone, as a command line, for its defaults.
#[derive(Parser)]
struct DefaultsOnly {
    #[command(flatten)]
    args: FitArgs,
}

impl Default for FitArgs {
    /// The command line's defaults: `wick fit` with no options.
    fn default() -> Self {
        let matches = <DefaultsOnly as clap::CommandFactory>::command().get_matches_from(["fit"]);
        DefaultsOnly::from_arg_matches(&matches)
            .expect("the defaults parse")
            .args
    }
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

impl FitCommand {
    /// The effective options: defaults, then `--config`'s file, then the flags the command
    /// line gave.
    pub fn resolve(&self) -> Result<FitArgs, String> {
        let mut table = match &self.config {
            Some(path) => {
                let text = std::fs::read_to_string(path)
                    .map_err(|e| format!("--config {}: {e}", path.display()))?;
                text.parse::<toml::Table>()
                    .map_err(|e| format!("--config {}: {e}", path.display()))?
            }
            None => toml::Table::new(),
        };
        let command_line = toml::Table::try_from(&self.args).map_err(|e| e.to_string())?;
        table.extend(
            command_line
                .into_iter()
                .filter(|(key, _)| self.given.contains(key)),
        );
        // A model run is named after its model unless named.
        if let (Some(model), false) = (
            table.get("model").and_then(|m| m.as_str()),
            table.contains_key("run-name"),
        ) {
            if let Some(name) = run_name_of(std::path::Path::new(model)) {
                table.insert("run-name".into(), name.into());
            }
        }
        // The rate and warmup a run gets unless told are those its kind of run is known
        // to want.
        let kind = RunKind::of(&table);
        if !table.contains_key("lr") {
            table.insert("lr".into(), kind.default_lr().into());
        }
        if let (false, Some(steps)) = (table.contains_key("warmup-steps"), kind.default_warmup()) {
            table.insert("warmup-steps".into(), steps.into());
        }
        let where_from = match &self.config {
            Some(path) => format!("--config {}", path.display()),
            None => "the options".into(),
        };
        let mut args: FitArgs = table
            .try_into()
            .map_err(|e: toml::de::Error| format!("{where_from}: {}", e.message().trim()))?;
        args.check().map_err(|e| format!("{where_from}: {e}"))?;
        if args.resume.as_deref() == Some(std::path::Path::new("last")) {
            args.resume = Some(
                args.checkpoint_dir
                    .join(wick_trainer::checkpoint::LAST_FILE),
            );
        }
        Ok(args)
    }
}

/// What a run trains: what picks the defaults whose anchors differ between pre-training and
/// fine-tuning.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum RunKind {
    /// A new model: the character model, or a `--model` config.json.
    New,
    /// Every weight of a pretrained `--model` (a directory or a GGUF file).
    FineTune,
    /// LoRA adapters beside a pretrained `--model`'s frozen weights.
    Lora,
    /// Every weight of a pretrained `--model`, tuned on preference pairs.
    Preference,
}

impl RunKind {
    /// The kind of run the options in `table` (TOML keys) describe.
    fn of(table: &toml::Table) -> Self {
        let model = table.get("model").and_then(|m| m.as_str());
        match model.map(std::path::Path::new) {
            Some(model) if crate::hf_model::is_pretrained(model) => {
                let preference =
                    (table.get("objective").and_then(|o| o.as_str())).is_some_and(|o| o != "sft");
                match (table.contains_key("lora-rank"), preference) {
                    (true, _) => RunKind::Lora,
                    (false, true) => RunKind::Preference,
                    (false, false) => RunKind::FineTune,
                }
            }
            _ => RunKind::New,
        }
    }

    /// The peak learning rate of AdamW: the main job's for a new model, and TRL's
    /// `SFTConfig` (2e-5), its `DPOConfig` (1e-6) and PEFT's LoRA examples (2e-4) for
    /// fine-tuning, since a pre-training rate would wreck a trained model in a few steps.
    const fn default_lr(self) -> f64 {
        match self {
            RunKind::New => 1e-2,
            RunKind::FineTune => 2e-5,
            RunKind::Preference => 1e-6,
            RunKind::Lora => 2e-4,
        }
    }

    /// The warmup steps, where they are not the main job's tenth of the decay: none when
    /// fine-tuning, as transformers' `TrainingArguments` and TRL's `SFTConfig` default
    /// (`warmup_steps=0`, `warmup_ratio=0`): the trained weights need no gentle start.
    const fn default_warmup(self) -> Option<i64> {
        match self {
            RunKind::New => None,
            RunKind::FineTune | RunKind::Lora | RunKind::Preference => Some(0),
        }
    }
}

/// The run name of a `--model`: `dir` or `dir/config.json` names the run `dir`;
/// `tiny.json` names it `tiny`.
fn run_name_of(model: &std::path::Path) -> Option<String> {
    let named = match model.file_name().and_then(|n| n.to_str()) {
        Some("config.json") => model.parent().and_then(|p| p.file_name()),
        _ if model.extension().is_some_and(|e| e == "json") => model.file_stem(),
        _ => model.file_name(),
    };
    named
        .map(|n| n.to_string_lossy().to_string())
        .filter(|n| !n.is_empty())
}
