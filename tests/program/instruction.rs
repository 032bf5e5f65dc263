//! `wick prepare --format jsonl`: instruction data of the three shapes, masked as
//! `transformers` masks it (its own assistant mask from the template's `{% generation %}`
//! blocks, its -100 loss), trained equally under every strategy, and bad lines refused
//! with their file and line before anything is written.

use super::{hf_fixture, wick};
use candle_core::{DType, Device, Tensor};
use std::path::Path;
use std::sync::Arc;
use wick::core::{Algorithm, OptimizerConfig, SoloWorld, Strategy, TokenBatch, IGNORE_INDEX};
use wick::models::CausalLm;
use wick::strategies::{strategy_by_name, Fsdp, FsdpSharding};
use wick::trainer::{Attached, DataLoader, Dataset, Packing, Split, TokenDataset, Trainer};

/// What `scripts/hf_fixtures.py` computed of `tests/fixtures/hf/chat/chat.jsonl`.
struct Reference {
    ids: Vec<u32>,
    counted: Vec<bool>,
    window_loss: f32,
}

fn reference() -> Reference {
    let text = std::fs::read_to_string(format!("{}/reference.json", hf_fixture("chat"))).unwrap();
    let json: serde_json::Value = serde_json::from_str(&text).unwrap();
    let list = |key: &str| json[key].as_array().unwrap().clone();
    Reference {
        ids: list("ids")
            .iter()
            .map(|v| v.as_u64().unwrap() as u32)
            .collect(),
        counted: list("counted")
            .iter()
            .map(|v| v.as_bool().unwrap())
            .collect(),
        window_loss: json["window_loss"].as_f64().unwrap() as f32,
    }
}

/// `wick prepare --format jsonl` of `files` with the chat fixture's tokenizer (and the
/// template beside it) into `dir/out`.
fn prepare_jsonl(dir: &Path, out: &str, files: &[&str]) -> (bool, String, String) {
    prepare_jsonl_with(&hf_fixture("chat"), &[], dir, out, files)
}

/// The same with the tokenizer (and template) of the fixture directory `tokenizer_dir`, and
/// the options `extra`.
fn prepare_jsonl_with(
    tokenizer_dir: &str,
    extra: &[&str],
    dir: &Path,
    out: &str,
    files: &[&str],
) -> (bool, String, String) {
    let tokenizer = format!("{tokenizer_dir}/tokenizer.json");
    let args = [
        &[
            "prepare",
            "--format",
            "jsonl",
            "--val-fraction",
            "0",
            "--tokenizer",
        ][..],
        &[tokenizer.as_str(), "--output", out],
        extra,
        files,
    ]
    .concat();
    wick(dir, &args)
}

fn chat_jsonl() -> String {
    format!("{}/chat.jsonl", hf_fixture("chat"))
}

#[test]
fn jsonl_examples_are_tokenized_and_masked_as_transformers_does() {
    let dir = tempfile::tempdir().unwrap();
    let (ok, out, err) = prepare_jsonl(dir.path(), "chat.safetensors", &[&chat_jsonl()]);
    assert!(ok, "{out}{err}");
    assert!(
        out.contains("5 example(s)") && out.contains("counted by the loss"),
        "{out}"
    );
    let r = reference();
    let tensors =
        candle_core::safetensors::load(dir.path().join("chat.safetensors"), &Device::Cpu).unwrap();
    let ids: Vec<u32> = tensors["train"]
        .to_dtype(DType::U32)
        .unwrap()
        .to_vec1()
        .unwrap();
    let mask: Vec<u8> = tensors["train_mask"].to_vec1().unwrap();
    assert_eq!(ids, r.ids, "ids differ from transformers'");
    let counted: Vec<bool> = mask.iter().map(|&m| m == 1).collect();
    assert_eq!(
        counted, r.counted,
        "the mask differs from transformers' assistant mask"
    );
    // Some of each: prompts and system turns are not counted.
    assert!(counted.iter().any(|&c| c) && counted.iter().any(|&c| !c));

    // The first window of the tokens one after another (concat): its targets are ignored
    // where not counted; the Llama fixture's loss on it is transformers' with -100 labels.
    let path = dir.path().join("chat.safetensors");
    let data = TokenDataset::open_with(path, Split::Train, 64, Some(Packing::Concat)).unwrap();
    assert!(data.is_masked());
    let TokenBatch {
        ids: inputs,
        targets,
        ..
    } = data.batch(&[0], &Device::Cpu).unwrap();
    let got: Vec<u32> = targets.flatten_all().unwrap().to_vec1().unwrap();
    for (i, &t) in got.iter().enumerate() {
        let want = if r.counted[i + 1] {
            r.ids[i + 1]
        } else {
            IGNORE_INDEX
        };
        assert_eq!(t, want, "target {i}");
    }
    let mut model = CausalLm::from_pretrained(hf_fixture("llama")).unwrap();
    let single = strategy_by_name("single").unwrap();
    let world = Arc::new(SoloWorld);
    let _rank =
        wick::core::configure_rank(single.as_ref(), world, Device::Cpu, 0, &mut model).unwrap();
    let loss = model
        .loss(&inputs, &targets)
        .unwrap()
        .to_scalar::<f32>()
        .unwrap();
    assert!(
        (loss - r.window_loss).abs() <= 1e-5,
        "loss {loss} vs transformers' {}",
        r.window_loss
    );
}

/// The ids of the `train` tokens of the token file `path`.
fn train_ids(path: &Path) -> Vec<u32> {
    let tensors = candle_core::safetensors::load(path, &Device::Cpu).unwrap();
    tensors["train"]
        .to_dtype(DType::U32)
        .unwrap()
        .to_vec1()
        .unwrap()
}

/// transformers 5 saves a tokenizer's chat template in `chat_template.jinja`, not in
/// `tokenizer_config.json` (the fixture `chat_v5` is the chat fixture saved again by
/// transformers 5's `save_pretrained`): wick reads either layout and renders each
/// conversation as transformers does, and `prepare` finds the template in either.
#[test]
fn the_chat_template_is_read_from_either_layout_as_transformers_renders_it() {
    use wick::models::{ChatTemplate, TextTokenizer};
    let v5 = hf_fixture("chat_v5");
    let text = std::fs::read_to_string(format!("{v5}/renders.json")).unwrap();
    let renders: serde_json::Value = serde_json::from_str(&text).unwrap();
    let renders = renders["renders"].as_array().unwrap();
    assert_eq!(renders.len(), 4);
    let tokenizer = TextTokenizer::from_file(format!("{v5}/tokenizer.json")).unwrap();
    for layout in [hf_fixture("chat"), v5.clone()] {
        let template = ChatTemplate::from_dir(&layout)
            .unwrap()
            .expect("a template");
        assert_eq!(template.eos_token(), Some("<|endoftext|>"), "{layout}");
        for r in renders {
            let messages = r["messages"].as_array().unwrap();
            let prompt = r["add_generation_prompt"].as_bool().unwrap();
            let rendered = template.render(messages, prompt).unwrap();
            assert_eq!(rendered, r["text"].as_str().unwrap(), "{layout}");
            let ids: Vec<u32> = r["ids"]
                .as_array()
                .unwrap()
                .iter()
                .map(|v| v.as_u64().unwrap() as u32)
                .collect();
            assert_eq!(tokenizer.encode(&rendered).unwrap(), ids, "{layout}");
        }
    }
    // `prepare` finds the template of transformers 5's layout beside the tokenizer: the
    // same ids as transformers gave for the fixture.
    let dir = tempfile::tempdir().unwrap();
    let (ok, out, err) =
        prepare_jsonl_with(&v5, &[], dir.path(), "v5.safetensors", &[&chat_jsonl()]);
    assert!(ok, "{out}{err}");
    assert_eq!(
        train_ids(&dir.path().join("v5.safetensors")),
        reference().ids
    );
    // Named with --chat-template, a .jinja file serves as well.
    let jinja = format!("{v5}/chat_template.jinja");
    let named = ["--chat-template", jinja.as_str()];
    let (ok, out, err) = prepare_jsonl_with(
        &hf_fixture("chat"),
        &named,
        dir.path(),
        "named.safetensors",
        &[&chat_jsonl()],
    );
    assert!(ok, "{out}{err}");
    assert_eq!(
        train_ids(&dir.path().join("named.safetensors")),
        reference().ids
    );
}

/// A chat model fine-tuned and exported comes out able to chat: its chat template, special
/// tokens and generation defaults go into the export, from either layout of the tokenizer
/// (the template in `tokenizer_config.json`, or in transformers 5's `chat_template.jinja`),
/// and the export renders each conversation as transformers did. (`scripts/export-check.sh`
/// has transformers itself read the export, in CI.)
#[test]
fn an_exported_chat_model_carries_its_template_special_tokens_and_generation_config() {
    use wick::models::ChatTemplate;
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let v5 = hf_fixture("chat_v5");
    let text = std::fs::read_to_string(format!("{v5}/renders.json")).unwrap();
    let renders: serde_json::Value = serde_json::from_str(&text).unwrap();
    let llama = hf_fixture("llama");
    let (chat, jsonl) = (
        format!("{}/tokenizer.json", hf_fixture("chat")),
        chat_jsonl(),
    );
    let prepare = [
        "prepare",
        "--format",
        "jsonl",
        "--val-fraction",
        "0.3",
        "--tokenizer",
        &chat,
        "--output",
        "chat.safetensors",
        &jsonl,
    ];
    let (ok, out, err) = wick(d, &prepare);
    assert!(ok, "{out}{err}");
    for layout in [hf_fixture("chat"), v5.clone()] {
        let tokenizer = format!("{layout}/tokenizer.json");
        let name = Path::new(&layout).file_name().unwrap().to_str().unwrap();
        let (ck, exported) = (format!("ck-{name}"), format!("{name}-hf"));
        let args = [
            "fit",
            "--model",
            &llama,
            "--tokenizer",
            &tokenizer,
            "--data",
            "chat.safetensors",
            "--seq",
            "8",
            "--batch-size",
            "2",
            "--max-steps",
            "1",
            "--no-progress",
            "--run-name",
            name,
            "--checkpoint-dir",
            &ck,
            "--val-every",
            "1000",
        ];
        let (ok, out, err) = wick(d, &args);
        assert!(ok, "{out}{err}");
        let (ok, out, err) = wick(d, &["export", &format!("{ck}/last"), &exported]);
        assert!(ok, "{out}{err}");
        let exported = d.join(exported);
        let read = |dir: &Path, f: &str| std::fs::read(dir.join(f)).unwrap();
        // What the tokenizer's directory and the model's held, as they were.
        assert_eq!(
            read(&exported, "tokenizer_config.json"),
            read(Path::new(&layout), "tokenizer_config.json"),
            "{name}"
        );
        assert_eq!(
            read(&exported, "generation_config.json"),
            read(Path::new(&llama), "generation_config.json"),
            "{name}"
        );
        // The template in transformers 5's file too, rendering as transformers did.
        assert_eq!(
            read(&exported, "chat_template.jinja"),
            read(Path::new(&v5), "chat_template.jinja"),
            "{name}"
        );
        let template = ChatTemplate::from_dir(&exported).unwrap().unwrap();
        assert_eq!(template.eos_token(), Some("<|endoftext|>"));
        for r in renders["renders"].as_array().unwrap() {
            let messages = r["messages"].as_array().unwrap();
            let prompt = r["add_generation_prompt"].as_bool().unwrap();
            assert_eq!(
                template.render(messages, prompt).unwrap(),
                r["text"].as_str().unwrap(),
                "{name}"
            );
        }
    }
}

/// Trains the Llama fixture 3 plain SGD steps on the masked windows; its parameters.
/// (SGD, not Adam: Adam's step divides by the root of each gradient's square, so that
/// rounding in the near-zero gradients of rare tokens' rows moves them by up to its rate.)
fn train_masked(
    data: &Path,
    (devices, strategy): (usize, Box<dyn Strategy>),
    accumulate: usize,
) -> Vec<(String, Tensor)> {
    let model = CausalLm::from_pretrained(hf_fixture("llama"))
        .unwrap()
        .with_optimizer(OptimizerConfig::from(Algorithm::Sgd {
            lr: 0.5,
            momentum: 0.0,
            nesterov: false,
            weight_decay: 0.0,
        }));
    let mut t = Trainer::builder()
        .devices(devices)
        .strategy(strategy)
        .max_steps(3)
        .accumulate_grad_batches(accumulate)
        .no_logger()
        .progress(false)
        .model_summary(false)
        .build()
        .unwrap();
    // Windows of 16, whole examples packed in each; steps of 12 windows (W = 2, 3, 4
    // divide it), the first 12 each time, unshuffled: one global batch of 12, or two of 6.
    let windows = TokenDataset::open(data, Split::Train, 16).unwrap();
    assert!(windows.len() >= 12 && windows.packing() == Packing::Documents);
    let loader = DataLoader::new(windows, 12 / accumulate).without_shuffle();
    let mut model = Attached::new(model);
    t.fit(&mut model, &loader, None).unwrap();
    t.full_parameters(&mut model).unwrap()
}

#[test]
fn masked_losses_train_every_strategy_as_one_device_on_the_global_batch() {
    // Ranks hold different numbers of counted targets: each rank's mean would weigh them
    // wrongly; the step's mean over every counted target of the global batch does not.
    let dir = tempfile::tempdir().unwrap();
    let jsonl = chat_jsonl();
    let (ok, out, err) = prepare_jsonl(dir.path(), "chat.safetensors", &[&jsonl, &jsonl, &jsonl]);
    assert!(ok, "{out}{err}");
    let data = dir.path().join("chat.safetensors");
    let want = train_masked(&data, (1, strategy_by_name("single").unwrap()), 1);
    // With accumulation each step's mean is over the counted targets of all its
    // micro-batches, whatever the world size.
    let runs: Vec<(&str, usize, Box<dyn Strategy>, usize)> = vec![
        ("ddp", 2, strategy_by_name("ddp").unwrap(), 1),
        ("zero3", 3, strategy_by_name("zero3").unwrap(), 1),
        ("fsdp", 4, Fsdp::new(FsdpSharding::FullShard).build(), 1),
        ("single", 1, strategy_by_name("single").unwrap(), 2),
        ("ddp", 2, strategy_by_name("ddp").unwrap(), 2),
        ("zero3", 3, strategy_by_name("zero3").unwrap(), 2),
    ];
    for (name, w, strategy, accumulate) in runs {
        let got = train_masked(&data, (w, strategy), accumulate);
        let worst = got
            .iter()
            .zip(&want)
            .map(|((n, a), (m, b))| {
                assert_eq!(n, m);
                (a - b)
                    .unwrap()
                    .abs()
                    .unwrap()
                    .max_all()
                    .unwrap()
                    .to_scalar::<f32>()
                    .unwrap()
            })
            .fold(0f32, f32::max);
        println!(
            "masked {name} at W={w}, accumulating {accumulate}: parameters within {worst:e} \
             of single"
        );
        assert!(
            worst <= 1e-6,
            "{name} W={w} x{accumulate}: parameters differ by {worst}"
        );
    }
}

#[test]
fn bad_lines_name_the_file_and_line_and_write_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let good = r#"{"prompt": "a", "completion": "b"}"#;
    for (line, needle) in [
        ("{not json", "not JSON"),
        (r#"{"question": "a"}"#, "has none of"),
        (r#"{"prompt": "a"}"#, "has no 'completion'"),
        (r#"{"messages": [{"content": "hi"}]}"#, "no 'role'"),
        (r#"{"messages": "hi"}"#, "must be a list"),
    ] {
        std::fs::write(d.join("bad.jsonl"), format!("{good}\n{line}\n{good}\n")).unwrap();
        let (ok, out, err) = prepare_jsonl(d, "bad.safetensors", &["bad.jsonl"]);
        assert!(!ok, "{line} was accepted: {out}");
        assert!(
            err.contains("bad.jsonl:2") && err.contains(needle),
            "{line}: {err}"
        );
        assert!(
            !d.join("bad.safetensors").exists(),
            "{line}: a token file was written"
        );
    }
    // A conversation needs a chat template: the plain fixture tokenizer has none.
    std::fs::write(
        d.join("chat.jsonl"),
        r#"{"messages": [{"role": "user", "content": "hi"}]}"#,
    )
    .unwrap();
    let tokenizer = format!("{}/tokenizer.json", hf_fixture("llama"));
    let (ok, _, err) = wick(
        d,
        &[
            "prepare",
            "--format",
            "jsonl",
            "--tokenizer",
            &tokenizer,
            "--output",
            "c.safetensors",
            "chat.jsonl",
        ],
    );
    assert!(
        !ok && err.contains("chat.jsonl:1") && err.contains("chat_template"),
        "{err}"
    );
    // A template that refuses the conversation (raise_exception) names the line too.
    let config = serde_json::json!({
        "eos_token": "<|endoftext|>",
        "chat_template": "{% for m in messages %}{% if m.role == 'tool' %}{{ raise_exception('no tools here') }}{% endif %}{{ m.content }}{% endfor %}",
    });
    std::fs::write(d.join("tokenizer_config.json"), config.to_string()).unwrap();
    std::fs::write(
        d.join("tool.jsonl"),
        format!(
            "{good}\n{}\n",
            r#"{"messages": [{"role": "tool", "content": "x"}]}"#
        ),
    )
    .unwrap();
    let (ok, _, err) = wick(
        d,
        &[
            "prepare",
            "--format",
            "jsonl",
            "--tokenizer",
            &tokenizer,
            "--chat-template",
            "tokenizer_config.json",
            "--output",
            "t.safetensors",
            "tool.jsonl",
        ],
    );
    assert!(
        !ok && err.contains("tool.jsonl:2") && err.contains("no tools here"),
        "{err}"
    );
    assert!(!d.join("t.safetensors").exists());
}
