//! `wick fit`'s command line ([`FitFlags`]) and how it resolves into the effective
//! [`FitArgs`] over `--config`'s TOML file.

use super::{is_false, positive, positive_number, AcceleratorName, DecayName, FitArgs};
use clap::Args;
use serde::Serialize;
use std::path::PathBuf;
use wick_strategies::{FsdpSharding, Precision, StrategyKind};

/// `wick fit`'s command line: every option is optional here, so that only those given
/// override the config file. Serialized (given ones only), they are a TOML overlay.
#[derive(Debug, Default, Args, Serialize)]
#[serde(rename_all = "kebab-case")]
pub struct FitFlags {
    /// Read every option from this TOML file (keys: the long options without dashes);
    /// options on the command line override it.
    #[arg(long, value_name = "FILE")]
    #[serde(skip)]
    pub config: Option<PathBuf>,
    /// Print the effective options as TOML and exit.
    #[arg(long)]
    #[serde(skip)]
    pub print_config: bool,
    /// Distribution strategy [default: fsdp].
    #[arg(long, value_enum)]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub strategy: Option<StrategyKind>,
    /// FSDP sharding [default: full_shard].
    #[arg(long, value_enum)]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub sharding: Option<FsdpSharding>,
    /// Ranks per group for hybrid_shard [default: 2].
    #[arg(long, value_parser = positive, value_name = "N")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub group_size: Option<usize>,
    /// fsdp: units computed and gradients reduced in 16 bits [default: 32].
    #[arg(long, value_enum)]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub precision: Option<Precision>,
    /// fsdp: only blocks whose names start with one of these prefixes are units of their
    /// own (e.g. blocks.); the others share one root unit [default: every block].
    #[arg(long, value_delimiter = ',', value_name = "P,Q")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub auto_wrap: Option<Vec<String>>,
    /// zero3, fsdp full_shard/hybrid_shard: gather the next unit in the background.
    #[arg(long)]
    #[serde(skip_serializing_if = "is_false")]
    pub prefetch: bool,
    /// Global batches per optimizer step [default: 1].
    #[arg(long, value_parser = positive, value_name = "N")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub accumulate: Option<usize>,
    /// Clip gradients to this global L2 norm.
    #[arg(long, value_parser = positive_number, value_name = "X", allow_hyphen_values = true)]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub clip: Option<f64>,
    /// Recompute the forward of these wrapped units in backward instead of keeping their
    /// activations: none, full, or every:K (every K-th unit) [default: none].
    #[arg(long, value_parser = activation_checkpointing, value_name = "none|full|every:K")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub activation_checkpointing: Option<String>,
    /// A step whose loss or gradients hold inf or NaN: error (stop, naming the step, the
    /// rank and the first such parameter) or skip (on every rank, counted in metrics.csv's
    /// skipped_steps) [default: error].
    #[arg(long, value_parser = on_nonfinite, value_name = "error|skip")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub on_nonfinite: Option<String>,
    /// Ranks: threads [default: 2], or under mpirun/srun (a build with --features mpi) one
    /// per process, as many as the launcher started.
    #[arg(long, value_parser = positive, value_name = "N")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub devices: Option<usize>,
    /// cpu, or cuda: rank r on GPU r (a build with --features cuda, or cuda,nccl)
    /// [default: cpu].
    #[arg(long, value_enum)]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub accelerator: Option<AcceleratorName>,
    /// Compute threads of each CPU rank, a thread or a launcher's process [default: the
    /// cores shared out between threads; a process uses all its host's].
    #[arg(long, value_parser = positive, value_name = "N")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub threads_per_rank: Option<usize>,
    /// Optimizer steps [default: 400].
    #[arg(long, value_parser = positive, value_name = "N")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_steps: Option<usize>,
    /// Seed of init and data order [default: 0].
    #[arg(long, value_name = "N")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub seed: Option<u64>,
    /// Global batch size, a multiple of --devices [default: 32].
    #[arg(long, value_parser = positive, value_name = "N")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub batch_size: Option<usize>,
    /// AdamW peak learning rate (after warmup) [default: 0.01].
    #[arg(long, value_parser = positive_number, value_name = "X", allow_hyphen_values = true)]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub lr: Option<f64>,
    /// Steps of linear learning-rate warmup [default: a tenth of --decay-steps].
    #[arg(long, value_name = "N")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub warmup_steps: Option<usize>,
    /// How the rate falls after warmup, reaching --min-lr-ratio at --decay-steps [default:
    /// cosine].
    #[arg(long, value_enum)]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub lr_decay: Option<DecayName>,
    /// The step at which the decay reaches its floor (the rate stays there after it)
    /// [default: --max-steps].
    #[arg(long, value_parser = positive, value_name = "N")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub decay_steps: Option<usize>,
    /// The floor of the decay, as a fraction of --lr [default: 0.1].
    #[arg(long, value_name = "X")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub min_lr_ratio: Option<f64>,
    /// Validate every N steps [default: 100].
    #[arg(long, value_parser = positive, value_name = "N")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub val_every: Option<usize>,
    /// Metrics go to <log dir>/<run name>/metrics.csv; a new run never reuses another's
    /// directory, taking <run name>-v1, -v2, ... instead [default: char-gpt].
    #[arg(long, value_name = "NAME")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub run_name: Option<String>,
    /// [default: runs]
    #[arg(long, value_name = "DIR")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub log_dir: Option<PathBuf>,
    /// Train on this UTF-8 text instead of the bundled corpus; with --model, the token file
    /// `wick prepare` wrote.
    #[arg(long, value_name = "FILE")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub data: Option<PathBuf>,
    /// Fine-tune this Hugging Face model directory (config.json, model.safetensors,
    /// tokenizer.json), or pre-train a new model of this config.json, on --data's tokens
    /// [default: the bundled character model].
    #[arg(long, value_name = "DIR")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub model: Option<PathBuf>,
    /// The tokenizer.json of a --model config.json (a model directory has its own).
    #[arg(long, value_name = "FILE", requires = "model")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tokenizer: Option<PathBuf>,
    /// Fine-tune --model with LoRA of this rank: its weights frozen (no gradient, no
    /// optimizer state), adapters beside the --lora-targets layers the only parameters
    /// trained and saved.
    #[arg(long, value_parser = positive, value_name = "R", requires = "model")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub lora_rank: Option<usize>,
    /// LoRA's alpha: the update is scaled by alpha / rank [default: 8, PEFT's].
    #[arg(long, value_parser = positive_number, value_name = "A", requires = "lora_rank")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub lora_alpha: Option<f64>,
    /// The dropout of each adapter's input in training [default: 0].
    #[arg(long, value_name = "P", requires = "lora_rank")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub lora_dropout: Option<f64>,
    /// The adapted layers of each block, of q_proj, k_proj, v_proj, o_proj, gate_proj,
    /// up_proj, down_proj [default: q_proj,v_proj, PEFT's].
    #[arg(
        long,
        value_delimiter = ',',
        value_name = "L,M",
        requires = "lora_rank"
    )]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub lora_targets: Option<Vec<String>>,
    /// Tokens per window with --model [default: 128].
    #[arg(long, value_parser = positive, value_name = "N")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub seq: Option<usize>,
    /// No progress bar.
    #[arg(long)]
    #[serde(skip_serializing_if = "is_false")]
    pub no_progress: bool,
    /// Complete every collective where it is issued instead of overlapping gradient
    /// reductions and prefetched gathers with compute (same numbers; for measuring what
    /// overlap hides, comm_wait_s in metrics.csv).
    #[arg(long)]
    #[serde(skip_serializing_if = "is_false")]
    pub no_overlap_comm: bool,
    /// Where checkpoints go: D/step-N/ and D/last; a new run never saves into a D that
    /// holds another run's, taking D-v1, -v2, ... instead [default: checkpoints].
    #[arg(long, value_name = "D")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub checkpoint_dir: Option<PathBuf>,
    /// Save a checkpoint every N steps and at the end, keeping the newest --keep-last
    /// [default: 100].
    #[arg(long, value_parser = positive, value_name = "N")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub save_every: Option<usize>,
    /// Write checkpoints in the background while training goes on (each rank's state is
    /// copied to host memory at the step, then written by a thread of its own).
    #[arg(long)]
    #[serde(skip_serializing_if = "is_false")]
    pub async_save: bool,
    /// Save no checkpoints.
    #[arg(long, conflicts_with = "save_every")]
    #[serde(skip_serializing_if = "is_false")]
    pub no_checkpoints: bool,
    /// Keep the K newest checkpoints, deleting older ones of this run [default: 3].
    #[arg(long, value_parser = positive, value_name = "K")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub keep_last: Option<usize>,
    /// Continue from checkpoint C, 'last' for the newest in --checkpoint-dir, or 'auto':
    /// 'last' when --checkpoint-dir has one, a fresh start otherwise (the one command of a
    /// requeued job). At any --devices; raise --max-steps to train further.
    #[arg(long, value_name = "C")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub resume: Option<PathBuf>,
}

/// `--activation-checkpointing`'s value, checked where it was typed.
fn activation_checkpointing(text: &str) -> Result<String, String> {
    text.parse::<wick_core::ActivationCheckpointing>()
        .map(|ac| ac.to_string())
        .map_err(|e| e.to_string())
}

/// `--on-nonfinite`'s value, checked where it was typed.
fn on_nonfinite(text: &str) -> Result<String, String> {
    text.parse::<wick_core::OnNonFinite>()
        .map(|p| p.to_string())
        .map_err(|e| e.to_string())
}

impl FitFlags {
    /// The effective options: defaults, then `--config`'s file, then the command line.
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
        let overlay = toml::Table::try_from(self).map_err(|e| e.to_string())?;
        table.extend(overlay);
        // A model run is named after its model unless named.
        if let (Some(model), false) = (
            table.get("model").and_then(|m| m.as_str()),
            table.contains_key("run-name"),
        ) {
            // `dir` or `dir/config.json` names the run `dir`; `tiny.json` names it `tiny`.
            let path = std::path::Path::new(model);
            let named = match path.file_name().and_then(|n| n.to_str()) {
                Some("config.json") => path.parent().and_then(|p| p.file_name()),
                _ if path.extension().is_some_and(|e| e == "json") => path.file_stem(),
                _ => path.file_name(),
            };
            let name = named.map(|n| n.to_string_lossy().to_string());
            if let Some(name) = name.filter(|n| !n.is_empty()) {
                table.insert("run-name".into(), name.into());
            }
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
