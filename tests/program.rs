//! The `wick` program as a user runs it: `wick fit` with its output going to a pipe.

use std::path::Path;
use std::process::Command;

/// `wick fit` for a few steps into `dir`; returns its standard output.
fn fit(dir: &Path, extra: &[&str]) -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_wick"))
        .args([
            "fit",
            "--max-steps",
            "4",
            "--val-every",
            "2",
            "--no-checkpoints",
        ])
        .arg("--log-dir")
        .arg(dir.join("runs"))
        .args(extra)
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
