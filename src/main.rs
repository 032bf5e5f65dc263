//! The `wick` program: `wick fit` trains the bundled character GPT (or, with `--model`, a
//! Hugging Face model on a token file that `wick prepare` wrote), `wick consolidate` turns a
//! checkpoint into one safetensors file and `wick export` into a Hugging Face directory,
//! `wick inspect` shows a checkpoint, `wick sample` generates text from one, `wick estimate`
//! says what each strategy holds per rank. `wick --help` lists them.

// Functions of at most 80 lines (clippy.toml), in library code; tests may run longer.
#![warn(clippy::too_many_lines)]

mod char_corpus;
mod char_gpt;
mod chat;
mod cli;
mod estimate;
mod evaluation;
mod example_files;
mod export;
mod generator;
mod gguf_export;
mod hf_files;
mod hf_model;
mod inspect;
mod loss_plot;
mod main_job;
mod model_export;
mod preference_fit;
mod prepare;
mod program_trainer;
mod sample;
mod token_shards;

use cli::{name_of, Command};
use std::process::ExitCode;

/// The exit status of a fit stopped by SIGTERM, SIGINT or SIGUSR1 after saving its step:
/// sysexits' EX_TEMPFAIL, "try again later", so a requeue script can tell it from a failure.
const EXIT_INTERRUPTED: u8 = 75;

fn main() -> ExitCode {
    // Rust ignores SIGPIPE, so a closed pipe turns the next print into a panic.
    // SAFETY: runs first, before any thread exists; SIG_DFL is a valid action for SIGPIPE.
    #[cfg(unix)]
    unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_DFL);
    }
    // The program's own process-wide settings for CPU training (Candle's element-wise pool,
    // glibc's malloc thresholds), each unless the user set it; the library makes none.
    // SAFETY: still the only thread, so nothing else reads or writes the environment.
    unsafe { wick_accelerator::tune_host_process() };
    // The library crates print nothing; their warnings, notes and summary come through here.
    wick::TerminalLog::install();
    let command = cli::parse_from(std::env::args_os()).unwrap_or_else(|e| e.exit());
    match run(command) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => match e.downcast_ref::<wick_trainer::TrainerError>() {
            Some(stop @ wick_trainer::TrainerError::Interrupted { .. }) => {
                // One write, so that the ranks' lines under a launcher do not interleave.
                let line =
                    format!("stopped: {stop}; the same command with --resume auto continues\n");
                let _ = std::io::Write::write_all(&mut std::io::stderr(), line.as_bytes());
                ExitCode::from(EXIT_INTERRUPTED)
            }
            _ => {
                eprintln!("error: {e:#}");
                ExitCode::FAILURE
            }
        },
    }
}

fn run(command: Command) -> anyhow::Result<()> {
    match command {
        Command::Fit(fit) => {
            let args = fit.resolve().map_err(anyhow::Error::msg)?;
            if fit.print_config {
                print!("{}", args.to_toml());
                return Ok(());
            }
            report_fit(&args, main_job::run(&args)?);
            Ok(())
        }
        Command::Consolidate { .. } | Command::Export { .. } | Command::Prepare(_)
            if launched_many() =>
        {
            anyhow::bail!(
                "wick consolidate, export and prepare write from one process; run them without \
                 mpirun or srun"
            )
        }
        Command::Consolidate {
            checkpoint,
            out,
            with_optimizer,
        } => {
            for f in wick::trainer::consolidate(&checkpoint, &out, with_optimizer)? {
                println!("wrote {}", f.display());
            }
            Ok(())
        }
        Command::Inspect {
            checkpoint,
            tensors,
        } => {
            print!("{}", inspect::report(&checkpoint, tensors)?);
            Ok(())
        }
        Command::Validate(args) => report_eval(evaluation::Pass::Validate, &args),
        Command::Test(args) => report_eval(evaluation::Pass::Test, &args),
        Command::Sample(args) => sample::run(&args, &mut std::io::stdout().lock()),
        Command::Chat(args) => chat::run(&args, std::io::stdin().lock(), &mut std::io::stdout()),
        Command::Estimate(args) => {
            print!("{}", estimate::report(&args)?);
            Ok(())
        }
        Command::Prepare(args) => {
            println!("{}", prepare::run(&args)?);
            Ok(())
        }
        Command::Export {
            paths,
            model,
            adapter,
            merge,
            gguf,
            quant,
        } => {
            let form = match (adapter, merge) {
                (true, _) => export::ExportForm::Adapter,
                (_, true) => export::ExportForm::Merged,
                _ => export::ExportForm::Whole,
            };
            let written = match (&model, paths.as_slice()) {
                (Some(model), [out]) => model_export::run(model, out, gguf.then(|| quant.into()))?,
                (None, [checkpoint, out]) if gguf => {
                    vec![gguf_export::run(checkpoint, out, form, quant.into())?]
                }
                (None, [checkpoint, out]) => export::run(checkpoint, out, form)?,
                (Some(_), _) => anyhow::bail!("export --model MODEL OUT: OUT only, no checkpoint"),
                (None, _) => {
                    anyhow::bail!("export CHECKPOINT OUT: the checkpoint and where to write it")
                }
            };
            for f in written {
                println!("wrote {}", f.display());
            }
            Ok(())
        }
    }
}

/// What `wick fit` prints when it ends (on rank 0): the run's summary line, and where its
/// logs, plot and checkpoints went, and the command that opens the TensorBoard logs.
fn report_fit(args: &cli::FitArgs, r: program_trainer::FitReport) {
    if r.is_global_zero {
        println!(
            "trained to step {} with {} on {} device(s): {} parameters{}, train_loss {:.4} -> {:.4} (ratio {:.3}){}",
            args.max_steps,
            name_of(args.strategy),
            r.devices,
            r.parameters,
            match r.frozen_parameters {
                0 => String::new(),
                n => format!(" trained beside {n} frozen"),
            },
            r.first_train_loss,
            r.last_train_loss,
            r.last_train_loss / r.first_train_loss,
            r.val_loss.map(|v| format!(", val_loss {v:.4}")).unwrap_or_default()
        );
        for log in &r.logs {
            let name = match log.logger {
                wick_trainer::Logger::Csv => "metrics",
                logger => logger.name(),
            };
            println!("{name}: {}", log.location);
        }
        if r.logs
            .iter()
            .any(|l| l.logger == wick_trainer::Logger::TensorBoard)
        {
            println!("open with: tensorboard --logdir {}", args.log_dir.display());
        }
        if let Some(csv) = r.metrics_csv {
            // The run is trained and saved by now: a plot that cannot be drawn
            // costs nothing else.
            match loss_plot::plot_run(&csv) {
                Ok(png) => println!("plot: {}", png.display()),
                Err(e) => eprintln!("warning: no plot: {e:#}"),
            }
        }
        if let Some(dir) = r.checkpoint_dir {
            println!("checkpoints: {}", dir.display());
        }
    }
}

/// Runs `wick validate` or `wick test` and prints the loss (on rank 0).
fn report_eval(pass: evaluation::Pass, args: &cli::EvalArgs) -> anyhow::Result<()> {
    let (loss, is_global_zero) = evaluation::run(pass, args)?;
    if is_global_zero {
        // Perplexity, as the language-model harnesses report it: exp of the mean token loss.
        println!("{} {loss:.6}\nperplexity {:.4}", pass.metric(), loss.exp());
    }
    Ok(())
}

/// Whether a launcher started more than this one process (or its variables are unreadable).
fn launched_many() -> bool {
    match wick::accelerator::LaunchEnv::detect() {
        Ok(None) => false,
        Ok(Some(launch)) => launch.world_size != Some(1),
        Err(_) => true,
    }
}
