//! Signals as a scheduler sends them: the run saves the step it finished and `--resume
//! auto` continues it; a second signal ends it at once with `last` whole.

use crate::{fit_saving, steps};
use std::path::Path;
use std::process::Command;

/// The first `columns` columns of every line of a metrics file.
fn columns(csv: &Path, columns: usize) -> Vec<String> {
    std::fs::read_to_string(csv)
        .unwrap()
        .lines()
        .map(|l| l.split(',').take(columns).collect::<Vec<_>>().join(","))
        .collect()
}

/// SIGTERM mid-fit (ranks as threads): the run finishes its step, saves it and exits with
/// status 75; the same command with `--resume auto` continues it, and the run ends with
/// the metrics and the checkpoint, bit for bit, of a run never stopped.
#[test]
fn sigterm_saves_the_step_and_resume_auto_ends_as_an_uninterrupted_run() {
    const STEPS: usize = 120;
    let dir = tempfile::tempdir().unwrap();
    let max_steps = STEPS.to_string();
    let args = [
        "--max-steps",
        &max_steps,
        "--save-every",
        "1000",
        "--resume",
        "auto",
    ];
    let straight = dir.path().join("straight");
    std::fs::create_dir_all(&straight).unwrap();
    fit_saving(&straight, &args);

    let stopped = dir.path().join("stopped");
    std::fs::create_dir_all(&stopped).unwrap();
    let child = Command::new(env!("CARGO_BIN_EXE_wick"))
        .args(["fit", "--val-every", "2", "--log-dir"])
        .arg(stopped.join("runs"))
        .arg("--checkpoint-dir")
        .arg(stopped.join("ck"))
        .args(args)
        .current_dir(&stopped)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("wick runs");
    let csv = stopped.join("runs/char-gpt/metrics.csv");
    let start = std::time::Instant::now();
    while !csv.exists() || steps_written(&csv) < 5 {
        assert!(start.elapsed().as_secs() < 600, "no progress");
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    // SAFETY: a plain kill(2) of our own child.
    assert_eq!(unsafe { libc::kill(child.id() as i32, libc::SIGTERM) }, 0);
    let out = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(75), "{stderr}");
    let last = std::fs::read_to_string(stopped.join("ck/last")).unwrap();
    let at: usize = last.trim_start_matches("step-").parse().unwrap();
    assert!((5..STEPS).contains(&at), "stopped at {at}");
    assert!(
        stderr.contains(&format!(
            "stopped: interrupted by SIGTERM after step {at}; saved {}",
            stopped.join("ck").join(&last).display()
        )),
        "{stderr}"
    );
    assert_eq!(steps(&csv).last(), Some(&at));

    fit_saving(&stopped, &args);
    let deterministic = 6;
    assert_eq!(
        columns(&csv, deterministic),
        columns(&straight.join("runs/char-gpt/metrics.csv"), deterministic)
    );
    let final_dir = format!("ck/step-{STEPS:08}");
    for file in ["rank-0.safetensors", "rank-1.safetensors"] {
        assert_eq!(
            std::fs::read(stopped.join(&final_dir).join(file)).unwrap(),
            std::fs::read(straight.join(&final_dir).join(file)).unwrap(),
            "{file}"
        );
    }
}

/// The rows of a metrics file written so far.
fn steps_written(csv: &Path) -> usize {
    std::fs::read_to_string(csv).map_or(0, |t| t.lines().count().saturating_sub(1))
}

/// A second signal while the first is being handled ends the run at once, with status
/// 128 plus the signal, and `last` still names a whole checkpoint. The steps are slow (a
/// batch of 512, about a second), so both signals arrive inside one step.
#[test]
fn a_second_signal_ends_the_run_at_once_and_last_stays_whole() {
    let dir = tempfile::tempdir().unwrap();
    let child = Command::new(env!("CARGO_BIN_EXE_wick"))
        .args([
            "fit",
            "--no-progress",
            "--max-steps",
            "1000",
            "--save-every",
            "2",
        ])
        .args(["--batch-size", "512", "--val-every", "1000", "--async-save"])
        .args(["--log-dir", "runs", "--checkpoint-dir", "ck"])
        .current_dir(dir.path())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("wick runs");
    let start = std::time::Instant::now();
    while !dir.path().join("ck/last").exists() {
        assert!(start.elapsed().as_secs() < 600, "no checkpoint");
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    let pid = child.id() as i32;
    // SAFETY: plain kill(2)s of our own child. Two SIGTERMs pending at once merge into
    // one, which on a loaded machine (a process not scheduled for a while) happens after
    // any fixed pause, so the second goes only once the first has been taken.
    assert_eq!(unsafe { libc::kill(pid, libc::SIGTERM) }, 0);
    wait_until_taken(pid, libc::SIGTERM);
    assert_eq!(unsafe { libc::kill(pid, libc::SIGTERM) }, 0);
    let out = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(128 + libc::SIGTERM), "{stderr}");
    assert!(!stderr.contains("stopped:"), "{stderr}");
    let inspect = Command::new(env!("CARGO_BIN_EXE_wick"))
        .args(["inspect", "ck/last"])
        .current_dir(dir.path())
        .output()
        .unwrap();
    assert!(
        inspect.status.success(),
        "{}",
        String::from_utf8_lossy(&inspect.stderr)
    );
}

/// Waits until no thread of process `pid` has `signal` pending any longer: a handler has
/// taken it. Reads Linux's `/proc/PID/status`; elsewhere it pauses 30 ms instead.
fn wait_until_taken(pid: i32, signal: i32) {
    let path = format!("/proc/{pid}/status");
    if !Path::new(&path).exists() {
        std::thread::sleep(std::time::Duration::from_millis(30));
        return;
    }
    let bit = 1u64 << (signal - 1);
    // The process's pending set (ShdPnd) and its main thread's (SigPnd), in hex.
    let pending = |status: String| {
        status
            .lines()
            .filter_map(|l| l.strip_prefix("ShdPnd:").or(l.strip_prefix("SigPnd:")))
            .any(|mask| u64::from_str_radix(mask.trim(), 16).is_ok_and(|m| m & bit != 0))
    };
    let start = std::time::Instant::now();
    while std::fs::read_to_string(&path).is_ok_and(pending) {
        assert!(start.elapsed().as_secs() < 300, "signal {signal} not taken");
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
}
