//! The `wick` program as a user runs it: `wick fit` with its output going to a pipe, run
//! again and resumed as the README and the guide do.

use std::path::Path;
use std::process::Command;

/// `wick fit` for a few steps into `dir` without checkpoints; returns its standard output.
fn fit(dir: &Path, extra: &[&str]) -> String {
    fit_saving(
        dir,
        &[&["--max-steps", "4", "--no-checkpoints"], extra].concat(),
    )
}

/// `wick fit` logging into `dir/runs` and saving into `dir/ck`; returns its standard
/// output.
fn fit_saving(dir: &Path, extra: &[&str]) -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_wick"))
        .args(["fit", "--val-every", "2"])
        .arg("--log-dir")
        .arg(dir.join("runs"))
        .arg("--checkpoint-dir")
        .arg(dir.join("ck"))
        .args(extra)
        .current_dir(dir)
        .output()
        .expect("wick runs");
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "wick fit failed:\n{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    stdout
}

/// With standard output a pipe, no bar is drawn (progress is on by default): no carriage
/// returns or escape sequences reach the pipe. The run writes the metrics CSV with its
/// seven columns and the loss plot beside it.
#[test]
fn fit_into_a_pipe_writes_metrics_and_plot_without_bars() {
    let dir = tempfile::tempdir().unwrap();
    let stdout = fit(dir.path(), &[]);
    assert!(
        !stdout.contains('\r') && !stdout.contains('\x1b'),
        "terminal control characters in piped output:\n{stdout:?}"
    );
    let run = dir.path().join("runs/char-gpt");
    assert!(stdout.contains(&format!("plot: {}", run.join("loss.png").display())));

    let csv = std::fs::read_to_string(run.join("metrics.csv")).unwrap();
    let mut lines = csv.lines();
    assert_eq!(
        lines.next(),
        Some("step,epoch,train_loss,val_loss,lr,tokens_per_s,epoch_time_s")
    );
    let rows: Vec<Vec<&str>> = lines.map(|l| l.split(',').collect()).collect();
    assert_eq!(rows.len(), 4);
    for (i, row) in rows.iter().enumerate() {
        assert_eq!(row.len(), 7, "{row:?}");
        assert_eq!(row[0], (i + 1).to_string());
        // Validation every 2 steps.
        assert_eq!(row[3].is_empty(), i % 2 == 0, "{row:?}");
        let tokens_per_s: f64 = row[5].parse().unwrap();
        assert!(tokens_per_s > 0.0, "{row:?}");
    }

    let png = std::fs::read(run.join("loss.png")).unwrap();
    assert_eq!(&png[..8], b"\x89PNG\r\n\x1a\n");
    assert!(png.len() > 5_000, "{} bytes", png.len());
}

/// The steps of a run's metrics file.
fn steps(csv: &Path) -> Vec<usize> {
    std::fs::read_to_string(csv)
        .unwrap()
        .lines()
        .skip(1)
        .map(|l| l.split(',').next().unwrap().parse().unwrap())
        .collect()
}

/// The README's sequence: fit, then `--resume last` further; and the guide's: the same fit
/// run twice. A second run keeps the first's metrics and checkpoints; a resumed one
/// continues its own, and its plot covers the whole run.
#[test]
fn a_second_run_keeps_the_first_and_a_resumed_run_continues_its_metrics() {
    let dir = tempfile::tempdir().unwrap();
    let (runs, ck) = (dir.path().join("runs"), dir.path().join("ck"));
    let first = fit_saving(dir.path(), &["--save-every", "2", "--max-steps", "4"]);
    assert!(
        first.contains(&format!("checkpoints: {}", ck.display())),
        "{first}"
    );
    let second = fit_saving(dir.path(), &["--save-every", "2", "--max-steps", "2"]);
    let second_run = runs.join("char-gpt-v1");
    assert!(
        second.contains(&format!(
            "metrics: {}",
            second_run.join("metrics.csv").display()
        )) && second.contains(&format!("checkpoints: {}-v1", ck.display())),
        "{second}"
    );
    assert_eq!(steps(&runs.join("char-gpt/metrics.csv")), [1, 2, 3, 4]);
    assert_eq!(steps(&second_run.join("metrics.csv")), [1, 2]);
    assert_eq!(
        std::fs::read_to_string(ck.join("last")).unwrap(),
        "step-00000004"
    );

    let resumed = fit_saving(dir.path(), &["--resume", "last", "--max-steps", "6"]);
    assert!(
        resumed.contains(&format!(
            "metrics: {}",
            runs.join("char-gpt/metrics.csv").display()
        )),
        "{resumed}"
    );
    assert_eq!(
        steps(&runs.join("char-gpt/metrics.csv")),
        [1, 2, 3, 4, 5, 6]
    );
    assert_eq!(
        std::fs::read_to_string(ck.join("last")).unwrap(),
        "step-00000006"
    );
    assert!(
        std::fs::metadata(runs.join("char-gpt/loss.png"))
            .unwrap()
            .len()
            > 5_000
    );
}
