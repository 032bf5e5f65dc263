//! The `wick` program's command line (clap): `fit`, `consolidate`, `inspect`, `estimate`.
//!
//! `wick fit --config run.toml` reads every option of `fit` from a TOML file whose keys are
//! the long options without their dashes (`max-steps = 400`); options given on the command
//! line override the file, and `--print-config` prints the effective options as TOML and
//! exits, as LightningCLI's `--config` and `--print_config` do.

use clap::{Args, CommandFactory, FromArgMatches, Parser, Subcommand, ValueEnum};

mod fit;
mod fit_options;
#[cfg(test)]
mod fit_tests;
pub use fit::{FitArgs, FitCommand};
use std::path::PathBuf;
use wick_strategies::{Precision, StrategyKind};

/// wick: Lightning-style training with sharded data parallelism for Candle.
#[derive(Debug, Parser)]
#[command(name = "wick", version)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

/// What the command line asks for.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Train a small GPT-style character model on the corpus bundled with wick (or --data),
    /// with ranks as threads (or processes under mpirun/srun, or GPUs).
    Fit(Box<FitCommand>),
    /// Write a checkpoint's parameters as one plain safetensors file under the model's names
    /// (and, with --with-optimizer, the optimizer state to OUT.optimizer.safetensors).
    Consolidate {
        /// A checkpoint directory, or a checkpoint root such as checkpoints/last.
        checkpoint: PathBuf,
        /// The safetensors file to write.
        out: PathBuf,
        /// Also write the optimizer state.
        #[arg(long)]
        with_optimizer: bool,
    },
    /// Print a checkpoint's step, strategy, world size, optimizer, metrics and file sizes,
    /// after checking it whole (a damaged checkpoint gets the errors loading it would).
    Inspect {
        /// A checkpoint directory, or a checkpoint root such as checkpoints/last.
        checkpoint: PathBuf,
        /// Also list every parameter's name, shape and dtype.
        #[arg(long)]
        tensors: bool,
    },
    /// A checkpoint's model (of any world size), or a Hugging Face model directory as it is
    /// (--model), evaluated on held-out data at these --devices and --strategy: prints
    /// val_loss and perplexity.
    Validate(EvalArgs),
    /// The same pass through `test_step`: prints test_loss.
    Test(EvalArgs),
    /// Generate text from a checkpoint (of any world size) or a Hugging Face model directory,
    /// streamed as it comes: a continuation of --prompt, or the answer to --chat MESSAGE.
    Sample(SampleArgs),
    /// A conversation on the terminal with a chat model (a checkpoint of a `fit --model` run,
    /// or a model directory): each line typed is a user message, answered as it is
    /// generated; an empty input (Ctrl-D) ends it.
    Chat(ChatArgs),
    /// Model-state bytes per rank for each strategy (parameters, gradients, AdamW state) and
    /// the largest unit held under full_shard: will it fit at W ranks?
    Estimate(EstimateArgs),
    /// Tokenize text files (one document each) into a token file for `wick fit --model`,
    /// holding out a fraction for validation.
    Prepare(PrepareArgs),
    /// Write a checkpoint of a `fit --model` run as a Hugging Face model directory that
    /// transformers loads: config.json, model.safetensors, tokenizer.json, and the
    /// tokenizer_config.json, chat_template.jinja and generation_config.json a chat model
    /// needs (as the source had them, or made as save_pretrained makes them); or, with
    /// --gguf, as a llama.cpp GGUF file. With --model, a model as it is, converted.
    Export {
        /// CHECKPOINT OUT: the checkpoint (a directory, or a root such as checkpoints/last)
        /// and the directory to write (it must not hold a model already), or with --gguf
        /// the file. With --model, OUT alone.
        #[arg(value_name = "[CHECKPOINT] OUT", num_args = 1..=2, required = true)]
        paths: Vec<PathBuf>,
        /// Instead of a checkpoint, a model as it is, converted: a Hugging Face directory
        /// or a GGUF file, written as a directory (or with --gguf as a GGUF file).
        #[arg(long, value_name = "DIR|FILE.gguf", conflicts_with_all = ["adapter", "merge"])]
        model: Option<PathBuf>,
        /// A LoRA run's checkpoint: write its adapters as PEFT does (adapter_config.json,
        /// adapter_model.safetensors), for peft.PeftModel.from_pretrained over the base.
        #[arg(long, conflicts_with = "merge")]
        adapter: bool,
        /// A LoRA run's checkpoint: write the base model with the adapters merged into its
        /// weights (W + alpha/r B A), a model directory transformers loads alone.
        #[arg(long)]
        merge: bool,
        /// Write OUT as one llama.cpp GGUF file: the model (merged, with --merge) with its
        /// tokenizer, chat template and config in llama.cpp's metadata; with --adapter,
        /// llama.cpp's LoRA adapter (llama-cli --lora).
        #[arg(long)]
        gguf: bool,
        /// The type of a GGUF's weight matrices (vectors stay f32); a K-quant falls back
        /// to q8_0 for a matrix whose rows do not divide into its blocks of 256.
        #[arg(long, value_enum, default_value_t = GgufQuant::F32, requires = "gguf")]
        quant: GgufQuant,
    },
}

/// `export --quant`'s types.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum GgufQuant {
    /// 32-bit floats.
    F32,
    /// Half precision.
    F16,
    /// bfloat16.
    Bf16,
    /// 8 bits, blocks of 32.
    #[value(name = "q8_0")]
    Q8_0,
    /// 4-bit K-quant.
    #[value(name = "q4_k")]
    Q4K,
    /// 6-bit K-quant.
    #[value(name = "q6_k")]
    Q6K,
}

impl From<GgufQuant> for wick_models::GgufType {
    fn from(q: GgufQuant) -> Self {
        match q {
            GgufQuant::F32 => Self::F32,
            GgufQuant::F16 => Self::F16,
            GgufQuant::Bf16 => Self::Bf16,
            GgufQuant::Q8_0 => Self::Q8_0,
            GgufQuant::Q4K => Self::Q4K,
            GgufQuant::Q6K => Self::Q6K,
        }
    }
}

/// `wick prepare`'s options.
#[derive(Debug, Args)]
pub struct PrepareArgs {
    /// The tokenizer.json to tokenize with (the model's), or a GGUF file whose tokenizer
    /// to use.
    #[arg(long, value_name = "TOKENIZER_JSON|FILE.gguf")]
    pub tokenizer: PathBuf,
    /// The token file to write (safetensors); with --tokens-per-file, the directory of
    /// token files to write.
    #[arg(long, value_name = "TOKENS")]
    pub output: PathBuf,
    /// Write the corpus as several token files of about N tokens each (whole documents),
    /// in the --output directory, each with its own held-out part; `fit --data DIR` takes
    /// them as one.
    #[arg(long, value_parser = positive, value_name = "N")]
    pub tokens_per_file: Option<usize>,
    /// The fraction of the tokens held out for validation (the end of the last documents).
    #[arg(long, default_value_t = 0.1, value_name = "F")]
    pub val_fraction: f64,
    /// No progress bar.
    #[arg(long)]
    pub no_progress: bool,
    /// `text`: each file is a document. `jsonl`: instruction data, each row of a JSON Lines
    /// file (or of a Parquet file, named *.parquet) an example in the --schema, and the loss
    /// counts only the completion's and the assistant's tokens.
    #[arg(long, value_enum, default_value_t = DataFormat::Text)]
    pub format: DataFormat,
    /// The columns of an example: found from each row's (`messages`, then
    /// `conversations`, `instruction`/`output`, `prompt`/`completion`, `text`), or named.
    #[arg(long, value_enum, default_value_t = SchemaArg::Auto)]
    pub schema: SchemaArg,
    /// Interleave the files by these weights, one per file: each next example from file i
    /// with probability w_i / sum(w), until a file drawn has none left (datasets'
    /// interleave_datasets, first_exhausted).
    #[arg(long, value_delimiter = ',', value_name = "W,W,...")]
    pub mix: Option<Vec<f64>>,
    /// The seed of --mix's draws.
    #[arg(long, default_value_t = 0, value_name = "N")]
    pub seed: u64,
    /// The chat template that renders `messages`: a chat_template.jinja, or a
    /// tokenizer_config.json or GGUF file that holds one [default: --tokenizer's
    /// directory's chat_template.jinja, else its tokenizer_config.json's, or a GGUF
    /// --tokenizer's own, if any].
    #[arg(long, value_name = "FILE")]
    pub chat_template: Option<PathBuf>,
    /// UTF-8 text files, one document each, joined by the tokenizer's end-of-text token;
    /// with --format jsonl, JSON Lines or Parquet files.
    #[arg(required = true, value_name = "TEXT")]
    pub texts: Vec<PathBuf>,
}

/// How `wick prepare` reads its files.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum DataFormat {
    /// Plain text, one document per file.
    Text,
    /// Instruction data: JSON Lines, or Parquet for files named *.parquet.
    #[value(alias = "parquet")]
    Jsonl,
}

/// `wick prepare --schema`: which columns hold an example.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum SchemaArg {
    /// Found from each row's columns.
    Auto,
    /// `text`.
    Text,
    /// `prompt` and `completion`.
    PromptCompletion,
    /// `messages`: role and content.
    Messages,
    /// ShareGPT's `conversations`: from and value.
    Sharegpt,
    /// Alpaca's `instruction`, `input` and `output`.
    Alpaca,
    /// Preference pairs: `prompt`, `chosen` and `rejected` (text or messages), for
    /// `fit --objective dpo|ipo`.
    Preference,
}

impl From<SchemaArg> for wick_models::Schema {
    fn from(s: SchemaArg) -> Self {
        match s {
            SchemaArg::Auto => Self::Auto,
            SchemaArg::Text => Self::Text,
            SchemaArg::PromptCompletion => Self::PromptCompletion,
            SchemaArg::Messages => Self::Messages,
            SchemaArg::Sharegpt => Self::ShareGpt,
            SchemaArg::Alpaca => Self::Alpaca,
            SchemaArg::Preference => Self::Preference,
        }
    }
}

/// `fit --objective`: what the loss is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum ObjectiveArg {
    /// Next-token cross-entropy over the counted targets (pre-training, supervised
    /// fine-tuning).
    Sft,
    /// DPO's sigmoid loss on a preference token file, against the model as it starts.
    Dpo,
    /// IPO's squared loss on a preference token file, against the model as it starts.
    Ipo,
}

impl ObjectiveArg {
    /// The preference loss, for dpo and ipo.
    pub fn preference_loss(self) -> Option<wick_models::PreferenceLoss> {
        match self {
            ObjectiveArg::Sft => None,
            ObjectiveArg::Dpo => Some(wick_models::PreferenceLoss::Sigmoid),
            ObjectiveArg::Ipo => Some(wick_models::PreferenceLoss::Ipo),
        }
    }
}

/// `--packing`: how a token file's documents are laid into windows.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum PackingArg {
    /// Whole examples packed into each window, none split; each attends to itself only and
    /// its positions restart (the default for instruction data).
    Documents,
    /// The tokens one after another, cut every --seq (the default for plain text).
    Concat,
    /// One example per window, the rest padding.
    Padded,
}

impl From<PackingArg> for wick_trainer::Packing {
    fn from(p: PackingArg) -> Self {
        match p {
            PackingArg::Documents => Self::Documents,
            PackingArg::Concat => Self::Concat,
            PackingArg::Padded => Self::Padded,
        }
    }
}

/// The name clap and the TOML file use for a value of one of the enums above.
pub fn name_of<T: ValueEnum>(value: T) -> String {
    value
        .to_possible_value()
        .map(|v| v.get_name().to_string())
        .unwrap_or_default()
}

/// Which model a command reads: a checkpoint, or a Hugging Face model directory or GGUF
/// file as it is.
#[derive(Debug, Args)]
pub struct ModelChoice {
    /// A checkpoint (directory, or a root such as checkpoints/last): of the main job, or of
    /// a `fit --model` run.
    #[arg(required_unless_present = "model", conflicts_with = "model")]
    pub checkpoint: Option<PathBuf>,
    /// Instead of a checkpoint, a Hugging Face model directory or a llama.cpp GGUF file, as
    /// it is (before any training).
    #[arg(long, value_name = "DIR|FILE.gguf")]
    pub model: Option<PathBuf>,
}

/// The model a [`ModelChoice`] names.
pub enum ModelSource<'a> {
    /// A checkpoint (directory or root).
    Checkpoint(&'a std::path::Path),
    /// A Hugging Face model directory or a GGUF file.
    Model(&'a std::path::Path),
}

impl ModelChoice {
    /// The checkpoint or the model (clap lets exactly one through).
    pub fn source(&self) -> ModelSource<'_> {
        match (&self.model, &self.checkpoint) {
            (Some(model), _) => ModelSource::Model(model),
            (None, Some(checkpoint)) => ModelSource::Checkpoint(checkpoint),
            (None, None) => unreachable!("clap requires a checkpoint unless --model is given"),
        }
    }
}

/// `wick validate` and `wick test`'s options.
#[derive(Debug, Args)]
pub struct EvalArgs {
    #[command(flatten)]
    pub from: ModelChoice,
    /// Ranks: threads [default: 1], or the processes mpirun/srun started.
    #[arg(long, value_parser = positive, value_name = "N")]
    pub devices: Option<usize>,
    /// Strategy to evaluate under.
    #[arg(long, value_enum, default_value = "single")]
    pub strategy: StrategyKind,
    /// Global batch size, a multiple of --devices.
    #[arg(long, value_parser = positive, default_value_t = 32)]
    pub batch_size: usize,
    /// The text the model was trained on, if not the bundled corpus; for --model or a
    /// checkpoint of a `fit --model` run, the token file, a directory of them or a
    /// comma-separated list (their validation tokens are evaluated).
    #[arg(long, value_name = "FILE")]
    pub data: Option<PathBuf>,
    /// Tokens per window, for --model or a `fit --model` run's checkpoint.
    #[arg(long, value_parser = positive, default_value_t = 128, value_name = "N")]
    pub seq: usize,
    /// How the token file's documents are laid into windows [default: documents for
    /// instruction data, concat for plain text].
    #[arg(long, value_enum)]
    pub packing: Option<PackingArg>,
}

/// How `wick sample` and `wick chat` draw tokens and when they stop.
#[derive(Debug, Args)]
pub struct SamplingArgs {
    /// The most tokens to generate (a turn of `chat` ends earlier at an end token).
    #[arg(long, alias = "tokens", value_name = "N", default_value_t = 200)]
    pub max_new_tokens: usize,
    /// Softmax temperature; 0 picks the most likely token every time (greedy).
    #[arg(long, value_name = "T", default_value_t = 0.8)]
    pub temperature: f64,
    /// Draw only among the K most likely tokens [default: all].
    #[arg(long, value_parser = positive, value_name = "K")]
    pub top_k: Option<usize>,
    /// Draw only among the most likely tokens whose probabilities first reach P (nucleus
    /// sampling).
    #[arg(long, value_name = "P", default_value_t = 1.0)]
    pub top_p: f64,
    /// Seed of the draws: the same seed gives the same text.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
}

/// `wick sample`'s options.
#[derive(Debug, Args)]
pub struct SampleArgs {
    #[command(flatten)]
    pub from: ModelChoice,
    /// The text to continue (with the main job's model, characters of its corpus).
    #[arg(long, required_unless_present = "chat", conflicts_with = "chat")]
    pub prompt: Option<String>,
    /// A user message, rendered with the model's chat template and its generation prompt:
    /// prints the assistant's answer, which ends at an end-of-turn token.
    #[arg(long, value_name = "MESSAGE")]
    pub chat: Option<String>,
    #[command(flatten)]
    pub sampling: SamplingArgs,
    /// The main job's text, if not the bundled corpus (its vocabulary).
    #[arg(long, value_name = "FILE")]
    pub data: Option<PathBuf>,
}

/// `wick chat`'s options.
#[derive(Debug, Args)]
pub struct ChatArgs {
    #[command(flatten)]
    pub from: ModelChoice,
    /// A system message before the conversation.
    #[arg(long, value_name = "MESSAGE")]
    pub system: Option<String>,
    #[command(flatten)]
    pub sampling: SamplingArgs,
}

/// `wick estimate`'s options.
#[derive(Debug, Args)]
pub struct EstimateArgs {
    /// Parameters of the model; without it, the main job's model of the sizes below.
    #[arg(long, value_parser = positive, value_name = "N", conflicts_with = "model")]
    pub params: Option<usize>,
    /// A Hugging Face model directory, or its config.json: that model's parameters and units.
    #[arg(long, value_name = "DIR")]
    pub model: Option<PathBuf>,
    /// Ranks.
    #[arg(long, value_parser = positive, value_name = "W", default_value_t = 2)]
    pub world: usize,
    /// LoRA of this rank on --model: only the adapters have gradients and optimizer state.
    #[arg(long, value_parser = positive, value_name = "R", requires = "model")]
    pub lora_rank: Option<usize>,
    /// The layers LoRA adapts [default: q_proj,v_proj].
    #[arg(
        long,
        value_delimiter = ',',
        value_name = "L,M",
        requires = "lora_rank"
    )]
    pub lora_targets: Option<Vec<String>>,
    /// QLoRA: the base's linear weights kept in this block form (as `fit --quantize-base`):
    /// counted at their stored bytes.
    #[arg(long, value_name = "FORM", requires = "lora_rank", value_parser = wick_core::BlockFormat::ALL.map(wick_core::BlockFormat::name))]
    pub quantize_base: Option<String>,
    /// QLoRA: the embedding and output head held in that form too (as `fit
    /// --quantize-embeddings`).
    #[arg(long, requires = "quantize_base")]
    pub quantize_embeddings: bool,
    /// Precision of full_shard's gathered units (and of the activations, with --seq).
    #[arg(long, value_enum, default_value = "32")]
    pub precision: Precision,
    /// Also the peak resident set of each rank, for samples of this many tokens (a decoder
    /// --model): model state, kept activations, gathered units and the runtime's base.
    #[arg(long, value_parser = positive, value_name = "N", requires = "model")]
    pub seq: Option<usize>,
    /// With --seq: samples a global batch, shared out over --world ranks.
    #[arg(long, value_parser = positive, value_name = "N", default_value_t = 32)]
    pub batch_size: usize,
    /// With --seq: the layers that recompute their forward in backward, as fit's.
    #[arg(long, value_name = "none|full|every:K", default_value_t = wick_core::ActivationCheckpointing::None)]
    pub activation_checkpointing: wick_core::ActivationCheckpointing,
    /// Main job model: width.
    #[arg(long, value_parser = positive, default_value_t = 64)]
    pub d_model: usize,
    /// Main job model: transformer blocks.
    #[arg(long, value_parser = positive, default_value_t = 2)]
    pub n_layer: usize,
    /// Main job model: attention heads.
    #[arg(long, value_parser = positive, default_value_t = 4)]
    pub n_head: usize,
    /// Main job model: vocabulary (85 for the bundled corpus).
    #[arg(long, value_parser = positive, default_value_t = 85)]
    pub vocab: usize,
    /// Main job model: context length.
    #[arg(long, value_parser = positive, default_value_t = 64)]
    pub block: usize,
}

/// The command `args` (the program's name first) give; for `fit`, with the TOML keys of
/// the options they gave, which override its `--config` file.
pub fn parse_from<I, T>(args: I) -> Result<Command, clap::Error>
where
    I: IntoIterator<Item = T>,
    T: Into<std::ffi::OsString> + Clone,
{
    let matches = Cli::command().try_get_matches_from(args)?;
    let mut command = Cli::from_arg_matches(&matches)?.command;
    if let (Command::Fit(fit), Some(given)) = (&mut command, matches.subcommand_matches("fit")) {
        fit.given = given
            .ids()
            .filter(|id| {
                given.value_source(id.as_str()) == Some(clap::parser::ValueSource::CommandLine)
            })
            .map(|id| id.as_str().replace('_', "-"))
            .collect();
    }
    Ok(command)
}

pub(crate) fn positive(s: &str) -> Result<usize, String> {
    match s.parse::<usize>() {
        Ok(n) if n > 0 => Ok(n),
        _ => Err("expected a positive integer".into()),
    }
}

pub(crate) fn positive_number(s: &str) -> Result<f64, String> {
    match s.parse::<f64>() {
        Ok(x) if x > 0.0 && x.is_finite() => Ok(x),
        _ => Err("expected a positive number".into()),
    }
}
