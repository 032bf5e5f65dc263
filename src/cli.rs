//! The `wick` program's command line: `wick fit [options]`.

use std::path::PathBuf;

/// Options of `wick fit`.
#[derive(Debug, Clone, PartialEq)]
pub struct FitArgs {
    /// Strategy name from the registry.
    pub strategy: String,
    /// Ranks: threads of this process (default 2), or, under `mpirun` / `srun`, the
    /// launcher's processes (default: as many as it started).
    pub devices: Option<usize>,
    /// Where each rank computes: `cpu`, or `cuda` (a GPU per rank; the `cuda` feature).
    pub accelerator: String,
    /// Compute threads per rank (ranks as threads); `None`: the cores shared out.
    pub threads_per_rank: Option<usize>,
    /// Optimizer steps.
    pub max_steps: usize,
    /// Seed of init and data order.
    pub seed: u64,
    /// Run name (the metrics folder).
    pub run_name: String,
    /// Where runs are logged.
    pub log_dir: PathBuf,
    /// Global batch size (sequences).
    pub batch_size: usize,
    /// AdamW learning rate.
    pub lr: f64,
    /// Validate every this many steps.
    pub val_every: usize,
    /// A text file to train on instead of the bundled corpus.
    pub data: Option<PathBuf>,
    /// Draw the progress bar (when stdout is a terminal).
    pub progress: bool,
    /// FSDP sharding strategy (with `--strategy fsdp`).
    pub sharding: String,
    /// Ranks per sharding group for `hybrid_shard`.
    pub group_size: usize,
    /// Global batches accumulated per optimizer step.
    pub accumulate: usize,
    /// Clip gradients to this global norm.
    pub clip: Option<f64>,
    /// `32`, `bf16-mixed` or `16-mixed` (fsdp's sharded modes).
    pub precision: String,
    /// fsdp auto-wrap: name prefixes of the blocks that become units of their own.
    pub auto_wrap: Option<Vec<String>>,
    /// fsdp full/hybrid sharding: gather the next unit in the background.
    pub prefetch: bool,
    /// Where checkpoints are saved (`step-N/` directories and the `last` pointer).
    pub checkpoint_dir: PathBuf,
    /// Save a checkpoint every this many steps (and at the end); `None`: never.
    pub save_every: Option<usize>,
    /// Keep only this many newest checkpoints.
    pub keep_last: usize,
    /// Resume from this checkpoint (`last`: the newest in `checkpoint_dir`).
    pub resume: Option<PathBuf>,
}

impl Default for FitArgs {
    fn default() -> Self {
        FitArgs {
            strategy: "fsdp".into(),
            devices: None,
            accelerator: "cpu".into(),
            threads_per_rank: None,
            max_steps: 400,
            seed: 0,
            run_name: "char-gpt".into(),
            log_dir: "runs".into(),
            batch_size: 32,
            lr: 3e-3,
            val_every: 100,
            data: None,
            progress: true,
            sharding: "full_shard".into(),
            group_size: 2,
            accumulate: 1,
            clip: None,
            precision: "32".into(),
            auto_wrap: None,
            prefetch: false,
            checkpoint_dir: "checkpoints".into(),
            save_every: Some(100),
            keep_last: 3,
            resume: None,
        }
    }
}

/// What the command line asks for.
#[derive(Debug, Clone, PartialEq)]
pub enum Command {
    /// Train the character GPT.
    Fit(Box<FitArgs>),
    /// Write a checkpoint's parameters as one safetensors file.
    Consolidate {
        /// The checkpoint directory (or a checkpoint root / its `last` file).
        checkpoint: PathBuf,
        /// The file to write.
        out: PathBuf,
        /// Also write the optimizer state beside it.
        with_optimizer: bool,
    },
    /// Print usage.
    Help,
}

/// Usage text.
pub const USAGE: &str = "\
usage: wick fit [options]
       wick consolidate CHECKPOINT OUT.safetensors [--with-optimizer]

fit trains a small GPT-style character model on the corpus bundled with wick (or --data
FILE), with ranks as threads on the CPU. consolidate writes a checkpoint's parameters as one
plain safetensors file under the model's own names (and, with --with-optimizer, the
optimizer state to OUT.optimizer.safetensors); CHECKPOINT may be a checkpoint directory or
a checkpoint root such as checkpoints/last.

options:
  --strategy NAME     distribution strategy: one of STRATEGIES (default fsdp)
  --sharding NAME     fsdp sharding: one of SHARDINGS (default full_shard)
  --group-size N      ranks per group for hybrid_shard (default 2)
  --precision P       32, bf16-mixed or 16-mixed (fsdp: units computed, gradients reduced in 16 bits)
  --auto-wrap P,Q     fsdp: only blocks named P..., Q... are units of their own (e.g. blocks.);
                      the others share one root unit (default: every block is a unit)
  --prefetch          fsdp full_shard/hybrid_shard: gather the next unit in the background
  --accumulate N      global batches per optimizer step (default 1)
  --clip X            clip gradients to this global L2 norm
  --devices N         ranks: threads (default 2), or under mpirun/srun (a build with
                      --features mpi) one per process, as many as the launcher started
  --accelerator A     cpu (default) or cuda: rank r on GPU r (a build with --features
                      cuda, or cuda,nccl for NCCL collectives)
  --threads-per-rank N  compute threads of each rank as a thread (default: the cores
                      shared out between the ranks)
  --max-steps N       optimizer steps (default 400)
  --seed N            seed of init and data order (default 0)
  --batch-size N      global batch size, a multiple of --devices (default 32)
  --lr X              AdamW learning rate (default 0.003)
  --val-every N       validate every N steps (default 100)
  --run-name NAME     metrics go to <log dir>/<run name>/metrics.csv (default char-gpt)
  --log-dir DIR       (default runs)
  --data FILE         train on this UTF-8 text instead of the bundled corpus
  --no-progress       no progress bar
  --checkpoint-dir D  where checkpoints go: D/step-N/ and D/last (default checkpoints)
  --save-every N      save a checkpoint every N steps and at the end (default 100)
  --no-checkpoints    save no checkpoints
  --keep-last K       keep the K newest checkpoints (default 3)
  --resume C          continue from checkpoint C, or 'last' for the newest in --checkpoint-dir
                      (at any --devices; raise --max-steps to train further)
";

fn value<T: std::str::FromStr>(
    flag: &str,
    raw: Option<&String>,
    expected: &str,
) -> Result<T, String> {
    let raw = raw.ok_or_else(|| format!("{flag} needs a value ({expected})"))?;
    raw.parse()
        .map_err(|_| format!("invalid value '{raw}' for {flag}: expected {expected}"))
}

fn positive(flag: &str, raw: Option<&String>) -> Result<usize, String> {
    match value::<usize>(flag, raw, "a positive integer")? {
        0 => Err(format!(
            "invalid value '0' for {flag}: expected a positive integer"
        )),
        n => Ok(n),
    }
}

/// Parses the arguments after the program name.
pub fn parse(args: &[String]) -> Result<Command, String> {
    let mut it = args.iter();
    match it.next().map(String::as_str) {
        None | Some("-h" | "--help" | "help") => return Ok(Command::Help),
        Some("fit") => {}
        Some("consolidate") => return parse_consolidate(it.as_slice()),
        Some(other) => {
            return Err(format!(
                "unknown command '{other}'; valid: fit, consolidate"
            ))
        }
    }
    let mut a = FitArgs::default();
    while let Some(flag) = it.next() {
        match flag.as_str() {
            "--strategy" => {
                let name: String = value(flag, it.next(), "a strategy name")?;
                wick_strategies::strategy_by_name(&name).map_err(|e| e.to_string())?;
                a.strategy = name;
            }
            "--sharding" => {
                let name: String = value(flag, it.next(), "a sharding name")?;
                wick_strategies::FsdpSharding::from_name(&name, 1).map_err(|e| e.to_string())?;
                a.sharding = name;
            }
            "--group-size" => a.group_size = positive(flag, it.next())?,
            "--precision" => {
                let p: String = value(flag, it.next(), "a precision")?;
                wick_strategies::MixedPrecision::from_name(&p).map_err(|e| e.to_string())?;
                a.precision = p;
            }
            "--accumulate" => a.accumulate = positive(flag, it.next())?,
            "--auto-wrap" => {
                let list: String = value(flag, it.next(), "comma-separated name prefixes")?;
                a.auto_wrap = Some(
                    list.split(',')
                        .filter(|p| !p.is_empty())
                        .map(String::from)
                        .collect(),
                );
            }
            "--clip" => {
                let c: f64 = value(flag, it.next(), "a positive number")?;
                if !(c > 0.0 && c.is_finite()) {
                    return Err(format!(
                        "invalid value '{c}' for --clip: expected a positive number"
                    ));
                }
                a.clip = Some(c);
            }
            "--devices" => a.devices = Some(positive(flag, it.next())?),
            "--threads-per-rank" => a.threads_per_rank = Some(positive(flag, it.next())?),
            "--accelerator" => {
                a.accelerator = value(flag, it.next(), "cpu or cuda")?;
                if !matches!(a.accelerator.as_str(), "cpu" | "cuda") {
                    return Err(format!(
                        "invalid value '{}' for --accelerator: expected cpu or cuda",
                        a.accelerator
                    ));
                }
            }
            "--max-steps" => a.max_steps = positive(flag, it.next())?,
            "--seed" => a.seed = value(flag, it.next(), "a non-negative integer")?,
            "--batch-size" => a.batch_size = positive(flag, it.next())?,
            "--lr" => {
                a.lr = value(flag, it.next(), "a positive number")?;
                if !(a.lr > 0.0 && a.lr.is_finite()) {
                    return Err(format!(
                        "invalid value '{}' for --lr: expected a positive number",
                        a.lr
                    ));
                }
            }
            "--val-every" => a.val_every = positive(flag, it.next())?,
            "--run-name" => a.run_name = value(flag, it.next(), "a name")?,
            "--log-dir" => a.log_dir = value(flag, it.next(), "a directory")?,
            "--data" => a.data = Some(value(flag, it.next(), "a file")?),
            "--no-progress" => a.progress = false,
            "--checkpoint-dir" => a.checkpoint_dir = value(flag, it.next(), "a directory")?,
            "--save-every" => a.save_every = Some(positive(flag, it.next())?),
            "--no-checkpoints" => a.save_every = None,
            "--keep-last" => a.keep_last = positive(flag, it.next())?,
            "--resume" => a.resume = Some(value(flag, it.next(), "a checkpoint or 'last'")?),
            "--prefetch" => a.prefetch = true,
            "-h" | "--help" => return Ok(Command::Help),
            other => {
                return Err(format!(
                    "unknown option '{other}'; run 'wick --help' for the list"
                ))
            }
        }
    }
    if a.resume.as_deref() == Some(std::path::Path::new("last")) {
        a.resume = Some(a.checkpoint_dir.join(wick_trainer::checkpoint::LAST_FILE));
    }
    Ok(Command::Fit(Box::new(a)))
}

fn parse_consolidate(args: &[String]) -> Result<Command, String> {
    let with_optimizer = args.iter().any(|a| a == "--with-optimizer");
    let paths: Vec<&String> = args.iter().filter(|a| *a != "--with-optimizer").collect();
    match paths.as_slice() {
        [checkpoint, out] if !checkpoint.starts_with("--") && !out.starts_with("--") => {
            Ok(Command::Consolidate {
                checkpoint: PathBuf::from(checkpoint),
                out: PathBuf::from(out),
                with_optimizer,
            })
        }
        _ => Err("usage: wick consolidate CHECKPOINT OUT.safetensors [--with-optimizer]".into()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(s: &str) -> Vec<String> {
        s.split_whitespace().map(String::from).collect()
    }

    #[test]
    fn defaults_and_overrides() {
        assert_eq!(parse(&args("fit")).unwrap(), Command::Fit(Box::default()));
        let Command::Fit(a) = parse(&args(
            "fit --strategy single --devices 1 --max-steps 5 --seed 9 --threads-per-rank 3",
        ))
        .unwrap() else {
            panic!()
        };
        assert_eq!(
            (a.strategy.as_str(), a.devices, a.max_steps, a.seed),
            ("single", Some(1), 5, 9)
        );
        assert_eq!(a.threads_per_rank, Some(3));
    }

    #[test]
    fn checkpoint_options() {
        let Command::Fit(a) = parse(&args("fit --checkpoint-dir ck --resume last")).unwrap() else {
            panic!()
        };
        assert_eq!(a.resume, Some(PathBuf::from("ck/last")));
        assert_eq!(
            parse(&args(
                "consolidate ck/last out.safetensors --with-optimizer"
            ))
            .unwrap(),
            Command::Consolidate {
                checkpoint: "ck/last".into(),
                out: "out.safetensors".into(),
                with_optimizer: true
            }
        );
    }

    #[test]
    fn bad_values_are_one_line_errors_that_say_what_is_valid() {
        let e = parse(&args("fit --strategy zero9")).unwrap_err();
        assert!(
            e.contains("unknown strategy 'zero9'") && e.contains("single, ddp"),
            "{e}"
        );
        let e = parse(&args("fit --devices two")).unwrap_err();
        assert_eq!(
            e,
            "invalid value 'two' for --devices: expected a positive integer"
        );
        let e = parse(&args("fit --accelerator tpu")).unwrap_err();
        assert_eq!(
            e,
            "invalid value 'tpu' for --accelerator: expected cpu or cuda"
        );
        let e = parse(&args("fit --max-steps 0")).unwrap_err();
        assert!(e.contains("expected a positive integer"), "{e}");
        assert!(parse(&args("fit --frobnicate"))
            .unwrap_err()
            .contains("unknown option '--frobnicate'"));
        assert!(parse(&args("train")).unwrap_err().contains("valid: fit"));
        assert!(parse(&args("consolidate only-one"))
            .unwrap_err()
            .contains("usage: wick consolidate"));
        assert!(!parse(&args("fit --lr -1")).unwrap_err().contains('\n'));
        let e = parse(&args("fit --sharding half")).unwrap_err();
        assert!(
            e.contains("unknown sharding 'half'") && e.contains("full_shard"),
            "{e}"
        );
        assert!(parse(&args("fit --precision bf16-mixed")).is_ok());
        let e = parse(&args("fit --precision 8")).unwrap_err();
        assert!(
            e.contains("unknown precision '8'") && e.contains("bf16-mixed"),
            "{e}"
        );
    }
}
