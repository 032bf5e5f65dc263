//! The `wick` program as a user runs it: `wick fit` with its output going to a pipe, run
//! again and resumed as the README and the guide do; `signals.rs` stops it as a scheduler does.

use std::path::Path;
use std::process::Command;

mod datasets;
mod generation;
mod gguf;
mod instruction;
mod lora;
mod preference;
#[cfg(unix)]
mod signals;

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
        Some(
            "step,epoch,train_loss,val_loss,lr,skipped_steps,tokens_per_s,epoch_time_s,comm_wait_s,\
             grad_norm,peak_memory_gib,mfu"
        )
    );
    let rows: Vec<Vec<&str>> = lines.map(|l| l.split(',').collect()).collect();
    assert_eq!(rows.len(), 4);
    for (i, row) in rows.iter().enumerate() {
        assert_eq!(row.len(), 12, "{row:?}");
        let grad_norm: f64 = row[9].parse().unwrap();
        let peak_gib: f64 = row[10].parse().unwrap();
        // The character GPT gives its FLOPs: a utilisation between none and all of the peak.
        let mfu: f64 = row[11].parse().unwrap();
        assert!(grad_norm > 0.0 && peak_gib > 0.0, "{row:?}");
        assert!(mfu > 0.0 && mfu < 1.0, "{row:?}");
        assert_eq!(row[0], (i + 1).to_string());
        // Validation every 2 steps.
        assert_eq!(row[3].is_empty(), i % 2 == 0, "{row:?}");
        assert_eq!(row[5], "0", "no step skipped: {row:?}");
        let tokens_per_s: f64 = row[6].parse().unwrap();
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

/// `wick` with `args` in `dir`; its exit status, standard output and standard error.
fn wick(dir: &Path, args: &[&str]) -> (bool, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_wick"))
        .args(args)
        .current_dir(dir)
        .output()
        .expect("wick runs");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// A model directory in `dir` with the chat fixture's tokenizer and template and the Llama
/// fixture's weights (tests/fixtures/gguf/chat-llama.gguf holds the same, as GGUF).
fn chat_llama(dir: &Path) -> std::path::PathBuf {
    let model = dir.join("chat-llama");
    std::fs::create_dir_all(&model).unwrap();
    let (llama, chat) = (hf_fixture("llama"), hf_fixture("chat_v5"));
    let files = [
        (&llama, "config.json"),
        (&llama, "model.safetensors"),
        (&chat, "tokenizer.json"),
        (&chat, "tokenizer_config.json"),
        (&chat, "chat_template.jinja"),
    ];
    for (from, f) in files {
        std::fs::copy(Path::new(from).join(f), model.join(f)).unwrap();
    }
    model
}

fn hf_fixture(family: &str) -> String {
    format!("{}/tests/fixtures/hf/{family}", env!("CARGO_MANIFEST_DIR"))
}

/// `wick prepare` of the repository's licenses with `model`'s tokenizer into
/// `dir/tokens.safetensors`.
fn prepare(dir: &Path, model: &str) -> (bool, String, String) {
    let tokenizer = format!("{model}/tokenizer.json");
    let corpus = format!("{}/data/licenses.txt", env!("CARGO_MANIFEST_DIR"));
    wick(
        dir,
        &[
            "prepare",
            "--tokenizer",
            &tokenizer,
            "--output",
            "tokens.safetensors",
            &corpus,
        ],
    )
}

/// `wick validate CK` (or `wick validate --model DIR`) on `dir/tokens.safetensors` in
/// windows of 32 at `devices` ranks of `strategy`: the loss it prints, checked against the
/// perplexity it prints beside it.
fn val_loss(dir: &Path, evaluated: &[&str], devices: &str, strategy: &str) -> f64 {
    let mut args = vec!["validate"];
    args.extend_from_slice(evaluated);
    let (ok, out, err) = wick(
        dir,
        &[
            &args[..],
            &[
                "--data",
                "tokens.safetensors",
                "--seq",
                "32",
                "--devices",
                devices,
                "--strategy",
                strategy,
            ],
        ]
        .concat(),
    );
    assert!(ok, "{out}{err}");
    let value = |key: &str| -> f64 {
        let line = out.lines().find_map(|l| l.strip_prefix(key)).unwrap();
        line.trim().parse().unwrap()
    };
    let (loss, perplexity) = (value("val_loss "), value("perplexity "));
    assert!((perplexity / loss.exp() - 1.0).abs() < 1e-3, "{out}");
    loss
}

/// Names, shapes and dtypes of a safetensors file's tensors.
fn tensors(path: &Path) -> Vec<(String, Vec<usize>, String)> {
    let bytes = std::fs::read(path).unwrap();
    let (_, meta) = safetensors::SafeTensors::read_metadata(&bytes).unwrap();
    let mut out: Vec<_> = meta
        .tensors()
        .into_iter()
        .map(|(n, i)| (n, i.shape.clone(), format!("{:?}", i.dtype)))
        .collect();
    out.sort();
    out
}

/// The guide's fine-tuning sequence on the tiny fixture models: prepare, fit (resumed
/// bit-identically), validate at another world size, sample, export with the source's
/// tensors, estimate.
#[test]
fn a_hugging_face_model_is_prepared_for_fine_tuned_validated_sampled_and_exported() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    for family in ["llama", "gpt2"] {
        let model = hf_fixture(family);
        let (ok, out, err) = prepare(d, &model);
        assert!(ok && out.contains("validation tokens"), "{out}{err}");
        let fit = |steps: &str, extra: &[&str]| {
            let mut args = vec![
                "fit",
                "--model",
                &model,
                "--data",
                "tokens.safetensors",
                "--seq",
                "32",
                "--batch-size",
                "4",
                "--max-steps",
                steps,
                "--val-every",
                "2",
                "--save-every",
                "2",
                "--no-progress",
                "--run-name",
                family,
                "--checkpoint-dir",
                family,
            ];
            args.extend_from_slice(extra);
            let (ok, out, err) = wick(d, &args);
            assert!(ok, "{out}{err}");
            out
        };
        fit("4", &[]);
        let csv = d.join(format!("runs/{family}/metrics.csv"));
        let first: Vec<String> = std::fs::read_to_string(&csv)
            .unwrap()
            .lines()
            .map(|l| l.split(',').take(3).collect::<Vec<_>>().join(","))
            .collect();
        // The run again from step 2, under another strategy at the same world size: steps 3
        // and 4 give the same losses.
        fit(
            "4",
            &[
                "--resume",
                &format!("{family}/step-00000002"),
                "--strategy",
                "zero3",
            ],
        );
        let again: Vec<String> = std::fs::read_to_string(&csv)
            .unwrap()
            .lines()
            .map(|l| l.split(',').take(3).collect::<Vec<_>>().join(","))
            .collect();
        assert_eq!(first, again, "{family}: a resumed run differs");

        let ck = format!("{family}/last");
        let val = |devices, strategy| val_loss(d, &[&ck], devices, strategy);
        let (one, three) = (val("1", "single"), val("2", "fsdp"));
        assert!((one - three).abs() < 1e-5, "{family}: {one} vs {three}");
        // The model as it was, before the fit: the same loss at any world size, and not the
        // fitted one.
        let base = |devices, strategy| val_loss(d, &["--model", &model], devices, strategy);
        let (base_one, base_two) = (base("1", "single"), base("2", "zero3"));
        assert!(
            (base_one - base_two).abs() < 1e-5,
            "{family}: {base_one} vs {base_two}"
        );
        assert!(
            (base_one - one).abs() > 1e-4,
            "{family}: the fit moved nothing: {one}"
        );
        let (ok, out, err) = wick(
            d,
            &[
                "sample", &ck, "--prompt", "The ", "--tokens", "8", "--seed", "3",
            ],
        );
        assert!(ok && out.starts_with("The "), "{out}{err}");

        let exported = format!("{family}-hf");
        let (ok, out, err) = wick(d, &["export", &ck, &exported]);
        assert!(ok, "{out}{err}");
        assert_eq!(
            tensors(&d.join(&exported).join("model.safetensors")),
            tensors(&Path::new(&model).join("model.safetensors")),
            "{family}: the exported tensors are not the source model's"
        );
        for f in ["config.json", "tokenizer.json", "generation_config.json"] {
            assert_eq!(
                std::fs::read(d.join(&exported).join(f)).unwrap(),
                std::fs::read(Path::new(&model).join(f)).unwrap(),
                "{family}: {f}"
            );
        }
        // The source has no tokenizer_config.json: the export writes one, naming the
        // special tokens of config.json's ids (0 in the fixtures), as transformers saves it.
        let written = std::fs::read(d.join(&exported).join("tokenizer_config.json")).unwrap();
        let written: serde_json::Value = serde_json::from_slice(&written).unwrap();
        let tokenizer =
            wick::models::TextTokenizer::from_file(format!("{model}/tokenizer.json")).unwrap();
        let first = tokenizer.id_to_token(0).unwrap();
        assert_eq!(written["eos_token"], first.as_str(), "{family}: {written}");
        assert_eq!(written["bos_token"], first.as_str(), "{family}: {written}");
        let (ok, _, err) = wick(d, &["export", &ck, &exported]);
        assert!(!ok && err.contains("not empty"), "{err}");
        std::fs::remove_file(d.join("tokens.safetensors")).unwrap();
    }
}

/// Token files that do not fit the model are refused before training, naming the file,
/// and nothing is written.
#[test]
fn token_files_that_do_not_fit_the_model_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let llama = hf_fixture("llama");
    let corpus = format!("{}/data/licenses.txt", env!("CARGO_MANIFEST_DIR"));
    // Another tokenizer: the same BPE with one merge fewer.
    let mut json: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(format!("{llama}/tokenizer.json")).unwrap())
            .unwrap();
    json["model"]["merges"].as_array_mut().unwrap().pop();
    std::fs::write(d.join("other.json"), json.to_string()).unwrap();
    let (ok, out, err) = wick(
        d,
        &[
            "prepare",
            "--tokenizer",
            "other.json",
            "--output",
            "other.safetensors",
            &corpus,
        ],
    );
    assert!(ok, "{out}{err}");
    let fit = |data: &str, seq: &str| {
        let (ok, out, err) = wick(
            d,
            &[
                "fit",
                "--model",
                &llama,
                "--data",
                data,
                "--seq",
                seq,
                "--max-steps",
                "2",
                "--no-progress",
            ],
        );
        assert!(!ok, "{out}");
        assert!(
            !d.join("runs").exists() && !d.join("checkpoints").exists(),
            "{err}"
        );
        err
    };
    let e = fit("other.safetensors", "32");
    assert!(
        e.contains("other.safetensors") && e.contains("another tokenizer"),
        "{e}"
    );
    // Too few tokens for one window.
    std::fs::write(d.join("short.txt"), "The end.").unwrap();
    let tokenizer = format!("{llama}/tokenizer.json");
    let (ok, out, err) = wick(
        d,
        &[
            "prepare",
            "--tokenizer",
            &tokenizer,
            "--output",
            "short.safetensors",
            "--val-fraction",
            "0",
            "short.txt",
        ],
    );
    assert!(ok, "{out}{err}");
    let e = fit("short.safetensors", "32");
    assert!(
        e.contains("short.safetensors") && e.contains("too few for one window"),
        "{e}"
    );
    // A vocabulary larger than the model's: the same tokenizer's ids, recorded as larger.
    let ids: Vec<u32> = (0..200).map(|i| i % 300).collect();
    let hash = wick::models::TextTokenizer::from_file(&tokenizer)
        .unwrap()
        .hash();
    wick::trainer::write_token_file(&d.join("wide.safetensors"), &ids, &ids, &hash, 70_000)
        .unwrap();
    let e = fit("wide.safetensors", "32");
    assert!(
        e.contains("wide.safetensors")
            && e.contains("70000 ids, more than the model's vocabulary of 384"),
        "{e}"
    );
    // A text file that cannot be read writes no token file.
    let (ok, _, err) = wick(
        d,
        &[
            "prepare",
            "--tokenizer",
            &tokenizer,
            "--output",
            "none.safetensors",
            "missing.txt",
        ],
    );
    assert!(
        !ok && err.contains("missing.txt") && !d.join("none.safetensors").exists(),
        "{err}"
    );
}

/// `fit --model CONFIG.json` pre-trains a new model of that shape, born sharded with wick's
/// counter-based init: the same losses at one rank and as fsdp at two, and an export with
/// the Hugging Face model's tensor names, shapes and dtypes.
#[test]
fn a_config_json_pre_trains_a_new_model_of_its_shape() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let model = hf_fixture("llama");
    let (ok, out, err) = prepare(d, &model);
    assert!(ok, "{out}{err}");
    let config = format!("{model}/config.json");
    let tokenizer = format!("{model}/tokenizer.json");
    let losses = |devices: &str, strategy: &str, name: &str| {
        let (ok, out, err) = wick(
            d,
            &[
                "fit",
                "--model",
                &config,
                "--tokenizer",
                &tokenizer,
                "--data",
                "tokens.safetensors",
                "--seq",
                "16",
                "--batch-size",
                "4",
                "--max-steps",
                "3",
                "--val-every",
                "3",
                "--save-every",
                "3",
                "--no-progress",
                "--devices",
                devices,
                "--strategy",
                strategy,
                "--run-name",
                name,
                "--checkpoint-dir",
                name,
            ],
        );
        assert!(ok, "{out}{err}");
        std::fs::read_to_string(d.join(format!("runs/{name}/metrics.csv")))
            .unwrap()
            .lines()
            .skip(1)
            .map(|l| l.split(',').nth(2).unwrap().parse::<f64>().unwrap())
            .collect::<Vec<_>>()
    };
    let (one, two) = (losses("1", "single", "one"), losses("2", "fsdp", "two"));
    assert_eq!(one.len(), 3);
    for (a, b) in one.iter().zip(&two) {
        assert!((a - b).abs() < 1e-5, "single {one:?} against fsdp {two:?}");
    }
    let (ok, out, err) = wick(d, &["export", "two/last", "two-hf"]);
    assert!(ok, "{out}{err}");
    assert_eq!(
        tensors(&d.join("two-hf/model.safetensors")),
        tensors(&Path::new(&model).join("model.safetensors")),
    );
}

/// The loggers from the command line: where each went is printed with the command that
/// opens TensorBoard; a log directory that cannot be written and a tracking URI that is
/// not a server are refused before training, by name; a tracking server that is down
/// leaves the run unharmed and is reported once.
#[test]
fn loggers_say_where_they_wrote_and_bad_ones_are_refused_by_name() {
    let dir = tempfile::tempdir().unwrap();
    let base = [
        "fit",
        "--max-steps",
        "2",
        "--val-every",
        "100",
        "--no-progress",
        "--no-checkpoints",
    ];
    let run = |extra: &[&str]| wick(dir.path(), &[&base[..], extra].concat());
    let (ok, out, err) = run(&["--run-name", "tb"]);
    assert!(ok, "{err}");
    assert!(out.contains("metrics: runs/tb/metrics.csv"), "{out}");
    assert!(
        out.contains("tensorboard: runs/tb/events.out.tfevents."),
        "{out}"
    );
    assert!(
        out.contains("open with: tensorboard --logdir runs"),
        "{out}"
    );

    std::fs::write(dir.path().join("a-file"), "").unwrap();
    let (ok, _, err) = run(&["--log-dir", "a-file/runs"]);
    assert!(!ok && err.contains("a-file/runs"), "{err}");
    let (ok, _, err) = run(&["--logger", "mlflow", "--mlflow-uri", "ftp://tracking"]);
    assert!(
        !ok && err.contains("mlflow-uri") && err.contains("ftp://tracking"),
        "{err}"
    );

    // A port nobody listens on.
    let port = {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        listener.local_addr().unwrap().port()
    };
    let uri = format!("http://127.0.0.1:{port}");
    let (ok, out, err) = run(&[
        "--logger",
        "csv,mlflow",
        "--mlflow-uri",
        &uri,
        "--run-name",
        "down",
    ]);
    assert!(ok, "{err}");
    assert!(out.contains("trained to step 2"), "{out}");
    assert_eq!(err.matches("training goes on").count(), 1, "{err}");
    assert!(err.contains("were not sent"), "{err}");
    // Only the loggers asked for: no TensorBoard file beside this run's metrics.
    let files: Vec<_> = std::fs::read_dir(dir.path().join("runs/down"))
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    assert!(!files.iter().any(|f| f.contains("tfevents")), "{files:?}");
}
