//! The `wick` program: `wick fit` trains the bundled character GPT; `wick consolidate`
//! turns a checkpoint into one safetensors file.

use std::process::ExitCode;
use wick::cli::{parse, Command, USAGE};

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let command = match parse(&args) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::from(2);
        }
    };
    match command {
        Command::Help => {
            print!(
                "{}",
                USAGE
                    .replace("STRATEGIES", &wick::strategies::STRATEGY_NAMES.join(", "))
                    .replace(
                        "SHARDINGS",
                        &wick::strategies::FsdpSharding::NAMES.join(", ")
                    )
            );
            ExitCode::SUCCESS
        }
        Command::Consolidate { .. } if launched_many() => {
            eprintln!(
                "error: wick consolidate writes one file from one process; run it without mpirun or srun"
            );
            ExitCode::FAILURE
        }
        Command::Consolidate {
            checkpoint,
            out,
            with_optimizer,
        } => match wick::trainer::checkpoint::resolve_checkpoint(&checkpoint)
            .and_then(|dir| wick::trainer::consolidate(dir, &out, with_optimizer))
        {
            Ok(files) => {
                for f in files {
                    println!("wrote {}", f.display());
                }
                ExitCode::SUCCESS
            }
            Err(e) => {
                eprintln!("error: {e}");
                ExitCode::FAILURE
            }
        },
        Command::Fit(a) => match wick::fit_job::run(&a) {
            Ok(r) if !r.is_global_zero => ExitCode::SUCCESS,
            Ok(r) => {
                println!(
                    "trained {} steps with {} on {} device(s): {} parameters, train_loss {:.4} -> {:.4} (ratio {:.3}){}",
                    a.max_steps,
                    a.strategy,
                    r.devices,
                    r.parameters,
                    r.first_train_loss,
                    r.last_train_loss,
                    r.last_train_loss / r.first_train_loss,
                    r.val_loss.map(|v| format!(", val_loss {v:.4}")).unwrap_or_default()
                );
                if let Some(p) = r.metrics_csv {
                    println!("metrics: {}", p.display());
                }
                ExitCode::SUCCESS
            }
            Err(e) => {
                eprintln!("error: {e:#}");
                ExitCode::FAILURE
            }
        },
    }
}

/// Whether a launcher started more than this one process (or its variables are unreadable).
fn launched_many() -> bool {
    match wick::accelerator::LaunchEnv::detect() {
        Ok(None) => false,
        Ok(Some(launch)) => launch.world_size != Some(1),
        Err(_) => true,
    }
}
