//! `wick fit`'s options from the command line and TOML files: defaults, overrides, checks.

use crate::cli::{parse_from, Cli, Command, FitArgs};
use std::path::PathBuf;
use wick_core::{ActivationCheckpointing, LrSchedule};
use wick_strategies::{Fsdp, FsdpSharding, Precision, StrategyKind};

fn parse(s: &str) -> Result<Command, String> {
    parse_from(std::iter::once("wick").chain(s.split_whitespace())).map_err(|e| e.to_string())
}

fn fit(s: &str) -> Result<FitArgs, String> {
    match parse(s)? {
        Command::Fit(command) => command.resolve(),
        other => panic!("{other:?}"),
    }
}

/// A file holding `text`, removed when dropped.
fn temp_file(text: &str) -> tempfile::NamedTempFile {
    let file = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(file.path(), text).unwrap();
    file
}

#[test]
fn the_worker_spin_is_the_accelerators_unless_given_and_may_be_zero() {
    assert_eq!(fit("fit").unwrap().worker_spin_ms, None);
    assert_eq!(
        fit("fit --worker-spin-ms 0").unwrap().worker_spin_ms,
        Some(0)
    );
    assert!(fit("fit --worker-spin-ms -1").is_err());
}

#[test]
fn defaults_and_overrides() {
    assert_eq!(fit("fit").unwrap(), FitArgs::default());
    let a = fit("fit --strategy single --devices 1 --max-steps 5 --seed 9 --threads-per-rank 3")
        .unwrap();
    assert_eq!(
        (
            a.strategy,
            a.devices,
            a.max_steps,
            a.seed,
            a.threads_per_rank
        ),
        (StrategyKind::Single, Some(1), 5, 9, Some(3))
    );
    let a = fit("fit --no-progress --no-checkpoints --auto-wrap blocks.,head --prefetch").unwrap();
    assert_eq!(
        (a.no_progress, a.no_checkpoints, a.prefetch),
        (true, true, true)
    );
    assert_eq!(a.auto_wrap, Some(vec!["blocks.".into(), "head".into()]));
    for (flag, ac) in [
        ("full", ActivationCheckpointing::Full),
        ("every:3", ActivationCheckpointing::Every(3)),
    ] {
        let a = fit(&format!("fit --activation-checkpointing {flag}")).unwrap();
        assert_eq!(a.activation_checkpointing, ac);
    }
    let e = fit("fit --activation-checkpointing every:0").unwrap_err();
    assert!(e.contains("every:K") && e.contains("'every:0'"), "{e}");
    let a =
        fit("fit --model m --lora-rank 16 --lora-alpha 32 --lora-targets q_proj,up_proj").unwrap();
    let lora = a.lora().unwrap();
    assert_eq!((lora.rank, lora.alpha, lora.dropout), (16, 32.0, 0.0));
    assert_eq!(lora.targets, ["q_proj", "up_proj"]);
    let e = fit("fit --model m --lora-rank 4 --lora-targets c_attn").unwrap_err();
    assert!(e.contains("c_attn") && e.contains("q_proj"), "{e}");
    let e = fit("fit --model m --lora-rank 4 --lora-dropout 1").unwrap_err();
    assert!(e.contains("--lora-dropout 1"), "{e}");
    assert!(fit("fit --lora-rank 4").is_err(), "LoRA without --model");
    let a = fit("fit --model m --lora-rank 4 --quantize-base nf4").unwrap();
    let format = |f| Ok(Some(wick_models::QuantizedBase::In(f)));
    assert_eq!(a.quantize_base(), format(wick_models::BlockFormat::Nf4));
    let a = fit("fit --model m --lora-rank 4 --quantize-base q4_k").unwrap();
    assert_eq!(a.quantize_base(), format(wick_models::BlockFormat::Q4K));
    let a = fit("fit --model m --lora-rank 4 --keep-quantized").unwrap();
    assert_eq!(
        a.quantize_base(),
        Ok(Some(wick_models::QuantizedBase::AsRead))
    );
    assert!(fit("fit --model m --keep-quantized").is_err());
    assert!(fit("fit --model m --lora-rank 4 --keep-quantized --quantize-base nf4").is_err());
    let e = fit("fit --model m --quantize-base nf4").unwrap_err();
    assert!(e.contains("lora-rank"), "{e}");
    let a = fit("fit --model m --lora-rank 4 --quantize-base nf4 --quantize-embeddings").unwrap();
    assert!(a.quantize_embeddings);
    let e = fit("fit --model m --lora-rank 4 --quantize-embeddings").unwrap_err();
    assert!(e.contains("quantize-base or keep-quantized"), "{e}");
    let e = fit("fit --model m --lora-rank 4 --quantize-base q8_1 --strategy ddp").unwrap_err();
    assert!(e.contains("q8_1") && e.contains("nf4"), "{e}");
    assert_eq!(fit("fit").unwrap().logger, wick_trainer::Logger::DEFAULT);
    let a = fit("fit --logger mlflow,csv --mlflow-uri http://h:1").unwrap();
    assert_eq!(
        a.logger,
        [wick_trainer::Logger::Mlflow, wick_trainer::Logger::Csv]
    );
    let e = fit("fit --logger wandb").unwrap_err();
    assert!(
        e.contains("'wandb'") && e.contains("csv, tensorboard, mlflow"),
        "{e}"
    );
    let a = fit("fit --checkpoint-dir ck --resume last").unwrap();
    assert_eq!(a.resume, Some(PathBuf::from("ck/last")));
    let Command::Consolidate { with_optimizer, .. } =
        parse("consolidate ck/last out.safetensors --with-optimizer").unwrap()
    else {
        panic!()
    };
    assert!(with_optimizer);
}

#[test]
fn the_toml_keys_are_exactly_the_long_options_without_dashes() {
    use clap::CommandFactory;
    let cli = Cli::command();
    let fit = cli.find_subcommand("fit").unwrap();
    let mut options: Vec<&str> = fit
        .get_arguments()
        .filter_map(|a| a.get_long())
        .filter(|l| !["config", "print-config"].contains(l))
        .collect();
    options.sort();
    // Every optional value given, so that every key is printed.
    let all = FitArgs {
        auto_wrap: Some(vec!["blocks.".into()]),
        clip: Some(1.0),
        devices: Some(2),
        threads_per_rank: Some(1),
        worker_spin_ms: Some(5),
        warmup_steps: Some(1),
        decay_steps: Some(9),
        data: Some("text.txt".into()),
        model: Some("model".into()),
        tokenizer: Some("tokenizer.json".into()),
        lora_rank: Some(16),
        quantize_base: Some("nf4".into()),
        resume: Some("ck".into()),
        mlflow_uri: Some("http://127.0.0.1:5000".into()),
        packing: Some(super::PackingArg::Documents),
        ..FitArgs::default()
    };
    let table: toml::Table = all.to_toml().parse().unwrap();
    let mut keys: Vec<&str> = table.keys().map(String::as_str).collect();
    keys.sort();
    assert_eq!(keys, options);
}

#[test]
fn a_config_file_is_overridden_by_the_command_line() {
    let file = temp_file("strategy = \"zero3\"\nmax-steps = 50\nlr = 0.01\nno-progress = true\n");
    let a = fit(&format!(
        "fit --config {} --max-steps 7",
        file.path().display()
    ))
    .unwrap();
    assert_eq!(
        (a.strategy, a.max_steps, a.lr, a.no_progress),
        (StrategyKind::Zero3, 7, 0.01, true)
    );
}

#[test]
fn print_config_round_trips() {
    let a = fit(
        "fit --strategy fsdp --sharding shard_grad_op --clip 0.5 --precision bf16-mixed \
         --devices 4",
    )
    .unwrap();
    let file = temp_file(&a.to_toml());
    let b = fit(&format!("fit --config {}", file.path().display())).unwrap();
    assert_eq!(a, b);
    assert!(
        a.to_toml().contains("precision = \"bf16-mixed\""),
        "{}",
        a.to_toml()
    );
}

#[test]
fn options_that_do_not_go_together_are_refused_by_name() {
    for (line, refusal) in [
        (
            "fit --strategy zero2 --precision bf16-mixed",
            "precision is an option of fsdp, not zero2",
        ),
        (
            "fit --strategy ddp --sharding no_shard",
            "sharding is an option of fsdp, not ddp",
        ),
        (
            "fit --strategy ddp --prefetch",
            "prefetch is an option of zero3 and fsdp, not ddp",
        ),
    ] {
        let program = fit(line).unwrap_err();
        assert!(program.contains(refusal), "{line}: {program}");
    }
    // What fsdp's options refuse, the program refuses in the same words.
    let library = Fsdp::new(FsdpSharding::NoShard)
        .with_precision(Precision::F16Mixed)
        .unwrap_err()
        .to_string();
    let program = fit("fit --sharding no_shard --precision 16-mixed").unwrap_err();
    assert!(program.contains(&library), "{program} / {library}");
}

#[test]
fn bad_input_gets_one_clear_error() {
    let e = parse("fit --strategy zero9").unwrap_err();
    assert!(
        e.contains("'zero9'") && e.contains("single, ddp, zero1, zero2, zero3, fsdp"),
        "{e}"
    );
    let e = parse("fit --sharding half").unwrap_err();
    assert!(
        e.contains("full_shard, shard_grad_op, no_shard, hybrid_shard"),
        "{e}"
    );
    let e = parse("fit --precision 8").unwrap_err();
    assert!(e.contains("32, bf16-mixed, 16-mixed"), "{e}");
    let e = parse("fit --accelerator tpu").unwrap_err();
    assert!(e.contains("cpu, cuda"), "{e}");
    let e = parse("fit --devices two").unwrap_err();
    assert!(
        e.contains("'two'") && e.contains("--devices") && e.contains("positive integer"),
        "{e}"
    );
    assert!(parse("fit --max-steps 0")
        .unwrap_err()
        .contains("positive integer"));
    assert!(parse("fit --lr -1")
        .unwrap_err()
        .contains("positive number"));
    assert!(parse("fit --frobnicate")
        .unwrap_err()
        .contains("'--frobnicate'"));
    assert!(parse("train").unwrap_err().contains("'train'"));
    assert!(parse("consolidate only-one").unwrap_err().contains("<OUT>"));
    assert!(parse("fit --save-every 5 --no-checkpoints").is_err());
    // The same checks hold for a config file, naming it.
    let file = temp_file("max-steps = 0\n");
    let name = file.path().display().to_string();
    let e = fit(&format!("fit --config {name}")).unwrap_err();
    assert!(
        e.contains(&name) && e.contains("max-steps must be a positive integer"),
        "{e}"
    );
    std::fs::write(file.path(), "strategy = \"zero9\"\n").unwrap();
    let e = fit(&format!("fit --config {name}")).unwrap_err();
    assert!(e.contains(&name) && e.contains("zero9"), "{e}");
    std::fs::write(file.path(), "max_steps = 3\n").unwrap();
    let e = fit(&format!("fit --config {}", file.path().display())).unwrap_err();
    assert!(e.contains("unknown field `max_steps`"), "{e}");
    let e = fit("fit --config /nonexistent/run.toml").unwrap_err();
    assert!(e.contains("/nonexistent/run.toml"), "{e}");
}

#[test]
fn the_learning_rate_schedule_options() {
    let a = fit("fit").unwrap();
    assert_eq!(
        a.lr_schedule(),
        LrSchedule::warmup_cosine(40, 400, 0.1),
        "the main job's default: a tenth of the steps warming up, cosine to a tenth"
    );
    let a = fit("fit --max-steps 100 --warmup-steps 5 --lr-decay linear --min-lr-ratio 0").unwrap();
    assert_eq!(a.lr_schedule(), LrSchedule::warmup_linear(5, 100, 0.0));
    let a = fit("fit --lr-decay constant --warmup-steps 0").unwrap();
    assert_eq!(a.lr_schedule().factor(0), 1.0);
    let e = fit("fit --max-steps 20 --warmup-steps 50").unwrap_err();
    assert!(
        e.contains("--warmup-steps 50") && e.contains("--decay-steps 20"),
        "{e}"
    );
    // The decay's horizon apart from the run's length: a 6-step run follows the first
    // 6 steps of a 12-step one.
    let a = fit("fit --max-steps 6 --decay-steps 12").unwrap();
    assert_eq!(a.lr_schedule(), LrSchedule::warmup_cosine(1, 12, 0.1));
    let e = fit("fit --min-lr-ratio 2").unwrap_err();
    assert!(e.contains("min_lr_ratio"), "{e}");
}

#[test]
fn the_warmup_defaults_by_what_the_run_trains() {
    let model = "tests/fixtures/hf/llama";
    // A new model: a tenth of the decay; fine-tuning: none, unless told.
    let a = fit("fit --max-steps 50").unwrap();
    assert_eq!((a.warmup_steps, a.lr_schedule().warmup_steps), (None, 5));
    for line in [
        format!("fit --model {model} --max-steps 50"),
        format!("fit --model {model} --lora-rank 4 --max-steps 50"),
    ] {
        let a = fit(&line).unwrap();
        assert_eq!(
            (a.warmup_steps, a.lr_schedule().warmup_steps),
            (Some(0), 0),
            "{line}"
        );
    }
    let a = fit(&format!(
        "fit --model {model} --max-steps 50 --warmup-steps 7"
    ))
    .unwrap();
    assert_eq!(a.lr_schedule().warmup_steps, 7);
}

#[test]
fn the_learning_rate_defaults_by_what_the_run_trains_and_print_config_shows_it() {
    let model = "tests/fixtures/hf/llama";
    for (line, lr) in [
        ("fit".to_string(), 1e-2),
        (
            format!("fit --model {model}/config.json --tokenizer {model}/tokenizer.json"),
            1e-2,
        ),
        (format!("fit --model {model}"), 2e-5),
        (format!("fit --model {model} --lora-rank 8"), 2e-4),
        (format!("fit --model {model} --objective dpo"), 1e-6),
        (
            format!("fit --model {model} --objective ipo --lora-rank 8"),
            2e-4,
        ),
        (
            format!("fit --model {model} --lora-rank 8 --lr 0.003"),
            3e-3,
        ),
    ] {
        let a = fit(&line).unwrap();
        assert_eq!(a.lr, lr, "{line}");
        // What --print-config prints is the rate in force, and it reads back as given.
        let file = temp_file(&a.to_toml());
        let printed: toml::Table = a.to_toml().parse().unwrap();
        assert_eq!(printed["lr"].as_float(), Some(lr), "{}", a.to_toml());
        assert_eq!(
            fit(&format!("fit --config {}", file.path().display())).unwrap(),
            a
        );
    }
    // A file's rate stands like any option of it.
    let file = temp_file(&format!("model = \"{model}\"\nlr = 0.5\n"));
    assert_eq!(
        fit(&format!("fit --config {}", file.path().display()))
            .unwrap()
            .lr,
        0.5
    );
}

#[test]
fn preference_objectives_need_a_model_no_packing_and_a_positive_beta() {
    let model = "tests/fixtures/hf/llama";
    let a = fit(&format!("fit --model {model} --objective ipo --beta 0.5")).unwrap();
    assert_eq!((a.objective, a.beta), (super::ObjectiveArg::Ipo, 0.5));
    for (line, says) in [
        ("fit --objective dpo".to_string(), "tunes a --model"),
        (
            format!("fit --model {model} --objective dpo --packing padded"),
            "packing does not apply",
        ),
    ] {
        let e = fit(&line).unwrap_err();
        assert!(e.contains(says), "{line}: {e}");
    }
    let file = temp_file(&format!(
        "model = \"{model}\"\nobjective = \"dpo\"\nbeta = 0.0\n"
    ));
    let e = fit(&format!("fit --config {}", file.path().display())).unwrap_err();
    assert!(e.contains("beta must be a positive number"), "{e}");
}
