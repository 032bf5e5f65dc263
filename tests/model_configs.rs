//! `config.json` as `transformers` reads it: the published config of each family with its
//! parameter count, fields refused by name, unknown fields named; and tied embeddings of
//! real vocabularies that do not divide by the world size.

use crate::models::{fixtures, max_diff, on_one_cpu, trainer, Windows, FAMILIES};
use candle_core::{Device, Tensor};
use std::path::Path;
use wick::core::{OptimizerConfig, Strategy};
use wick::models::CausalLm;
use wick::strategies::{strategy_by_name, Fsdp, FsdpSharding};
use wick::trainer::{Attached, DataLoader};

/// `config.json` of a published checkpoint of each family, as the hub serves it, and its
/// parameter count as `transformers` 5.24 builds it (`AutoModelForCausalLM.from_config` on
/// the meta device).
const PUBLISHED: [(&str, usize); 7] = [
    ("llama-3.2-1b", 1_235_814_400),
    ("smollm2-135m", 134_515_008),
    ("mistral-7b-v0.1", 7_241_732_096),
    ("qwen2.5-0.5b", 494_032_768),
    ("qwen3-0.6b", 596_049_920),
    ("gemma-2-2b", 2_614_341_888),
    ("gpt2", 124_439_808),
];

#[test]
fn published_configs_of_every_family_load_with_their_parameter_counts() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/configs");
    for (name, parameters) in PUBLISHED {
        let path = dir.join(format!("{name}.json"));
        let text = std::fs::read_to_string(&path).unwrap();
        let (config, unknown) = wick::models::ModelConfig::read_json(&text, &path)
            .unwrap_or_else(|e| panic!("{name}: {e}"));
        assert!(unknown.is_empty(), "{name}: fields not known: {unknown:?}");
        assert_eq!(config.num_parameters(), parameters, "{name}");
    }
    let read = |name: &str| {
        let path = dir.join(format!("{name}.json"));
        match wick::models::ModelConfig::from_file(&path).unwrap() {
            wick::models::ModelConfig::Decoder(c) => c,
            other => panic!("{other:?}"),
        }
    };
    use wick::models::{Family, RopeScaling};
    let llama = read("llama-3.2-1b");
    assert!(matches!(llama.rope.scaling, RopeScaling::Llama3 { factor, .. } if factor == 32.0));
    assert!(llama.tie_word_embeddings);
    // Qwen2.5's window is off (use_sliding_window false), its q/k/v have biases, o none.
    let qwen = read("qwen2.5-0.5b");
    assert!(qwen.layer_windows.iter().all(Option::is_none));
    assert!(qwen.qkv_bias && !qwen.o_bias);
    let mistral = read("mistral-7b-v0.1");
    assert!(mistral.layer_windows.iter().all(|w| *w == Some(4096)));
    let gemma = read("gemma-2-2b");
    assert_eq!(gemma.family, Family::Gemma2);
    assert_eq!(gemma.layer_windows[..2], [Some(4096), None]);
    assert_eq!(gemma.attention_scale, 1.0 / 16.0);
    assert_eq!(gemma.final_logit_softcapping, Some(30.0));
    let qwen3 = read("qwen3-0.6b");
    assert!(qwen3.qk_norm && qwen3.head_dim == 128 && qwen3.hidden_size == 1024);
}

#[test]
fn a_model_gives_its_flops_per_token_by_palms_accounting() {
    use wick::core::TrainModule;
    use wick::models::{LoraConfig, DECODER_TARGETS};
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/configs");
    let smol = CausalLm::from_config(dir.join("smollm2-135m.json")).unwrap();
    // 6 x every parameter (the tied embedding projects the logits) + 12 x 30 layers x 9
    // heads x 64 x 256 positions.
    let attention = 12.0 * (30 * 9 * 64 * 256) as f64;
    assert_eq!(
        smol.flops_per_token(256),
        Some(6.0 * 134_515_008.0 + attention)
    );
    // LoRA of rank 16 on every linear layer of a block: 4.88M adapters at 6 x, the frozen
    // base at 4 x.
    let lora = smol
        .with_lora(LoraConfig {
            rank: 16,
            alpha: 32.0,
            dropout: 0.0,
            targets: DECODER_TARGETS.iter().map(|t| t.to_string()).collect(),
        })
        .unwrap();
    assert_eq!(
        lora.flops_per_token(256),
        Some(4.0 * 134_515_008.0 + 6.0 * 4_884_480.0 + attention)
    );
    // GPT-2's position table is a lookup; its token table, tied, projects.
    let gpt2 = CausalLm::from_config(dir.join("gpt2.json")).unwrap();
    assert_eq!(
        gpt2.flops_per_token(1024),
        Some(6.0 * (124_439_808 - 1024 * 768) as f64 + 12.0 * (12 * 768 * 1024) as f64)
    );
}

#[test]
fn config_fields_that_change_the_math_are_refused_by_name() {
    let base: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(fixtures().join("llama/config.json")).unwrap(),
    )
    .unwrap();
    let with = |key: &str, value: serde_json::Value| {
        let mut c = base.clone();
        c[key] = value;
        wick::models::ModelConfig::read_json(&c.to_string(), Path::new("config.json"))
            .map(|(_, unknown)| unknown)
            .map_err(|e| e.to_string())
    };
    assert_eq!(with("use_cache", false.into()), Ok(vec![]));
    // A field wick does not know is ignored, as transformers ignores it, and named.
    assert_eq!(
        with("frobnication", 1.into()),
        Ok(vec!["frobnication".to_string()])
    );
    for (key, value, needle) in [
        (
            "rope_scaling",
            serde_json::json!({"rope_type": "longrope", "factor": 2.0}),
            "longrope",
        ),
        ("partial_rotary_factor", 0.5.into(), "partial_rotary_factor"),
        ("rope_interleaved", true.into(), "rope_interleaved"),
        ("use_mrope", true.into(), "use_mrope"),
        ("sliding_window", 4096.into(), "sliding_window"),
        ("hidden_act", "gelu".into(), "hidden_act"),
        ("num_key_value_heads", 3.into(), "num_key_value_heads"),
        (
            "rope_parameters",
            serde_json::json!({"rope_type": "llama3", "factor": 8.0, "rope_theta": 1e4}),
            "low_freq_factor",
        ),
        ("rope_theta", 5e5.into(), "differ"),
    ] {
        let e = with(key, value)
            .err()
            .unwrap_or_else(|| panic!("{key} was accepted"));
        assert!(
            e.contains("config.json") && e.contains(needle),
            "{key}: {e}"
        );
    }
    // Older transformers write rope_theta itself.
    let mut old = base.clone();
    old.as_object_mut().unwrap().remove("rope_parameters");
    old["rope_theta"] = 500000.0.into();
    match wick::models::ModelConfig::from_json(&old.to_string(), Path::new("config.json")).unwrap()
    {
        wick::models::ModelConfig::Decoder(c) => assert_eq!(c.rope.theta, 500000.0),
        other => panic!("{other:?}"),
    }
}

/// A config of `family` shape, tiny but for a real vocabulary, its embedding tied.
fn tied_config(family: &str, vocab: usize) -> String {
    match family {
        "gpt2" => serde_json::json!({
            "model_type": "gpt2", "vocab_size": vocab, "n_embd": 8, "n_layer": 1, "n_head": 2,
            "n_positions": 16, "resid_pdrop": 0.0, "embd_pdrop": 0.0, "attn_pdrop": 0.0,
        }),
        _ => serde_json::json!({
            "model_type": family, "vocab_size": vocab, "hidden_size": 8,
            "intermediate_size": 12, "num_hidden_layers": 1, "num_attention_heads": 2,
            "num_key_value_heads": 1, "head_dim": 4, "max_position_embeddings": 16,
            "tie_word_embeddings": true,
        }),
    }
    .to_string()
}

#[test]
fn tied_embeddings_of_vocabularies_that_do_not_divide_by_w_train_every_row() {
    // GPT-2's 50257 and Qwen's 151936 rows over 2, 3 and 4 ranks: the flat shards split
    // inside the tied table, and the last rows (on the last rank) must train as on one
    // device. Inputs and targets use the last ids, so those rows get gradient both ways.
    for (family, vocab) in [("gpt2", 50257usize), ("qwen2", 151936)] {
        let last = vocab as u32 - 1;
        let ids: Vec<u32> = (0..12 * 9).map(|i| last - (i * 7919) % 64).collect();
        let windows = Windows(Tensor::from_vec(ids, (12, 9), &Device::Cpu).unwrap());
        let text = tied_config(family, vocab);
        let run_at = |lr: f64, devices: usize, strategy: Box<dyn Strategy>| {
            let model = CausalLm::from_config_json(text.clone(), Path::new("config.json"))
                .unwrap()
                .with_optimizer(OptimizerConfig::adamw(lr));
            let mut t = trainer(devices, strategy, 2);
            let loader = DataLoader::new(Windows(windows.0.clone()), 12).without_shuffle();
            let mut m = Attached::new(model);
            t.fit(&mut m, &loader, None).unwrap();
            t.full_parameters(&mut m).unwrap()
        };
        let run = |devices: usize, strategy: Box<dyn Strategy>| run_at(1e-2, devices, strategy);
        let single = run(1, strategy_by_name("single").unwrap());
        let embedding = |params: &[(String, Tensor)]| {
            params
                .iter()
                .find(|(n, _)| n.ends_with("wte.weight") || n.ends_with("embed_tokens.weight"))
                .unwrap()
                .1
                .clone()
        };
        let want = embedding(&single);
        assert_eq!(want.dims(), [vocab, 8]);
        let tail = |t: &Tensor| t.narrow(0, vocab - 64, 64).unwrap();
        // The last rows moved on one device: trained, not merely equal (a rate of 0 keeps
        // the init).
        let initial = embedding(&run_at(0.0, 1, strategy_by_name("single").unwrap()));
        let moved = max_diff(&tail(&initial), &tail(&want));
        assert!(
            moved > 1e-3,
            "{family}: the last rows did not train ({moved})"
        );
        for w in [2, 3, 4] {
            for (name, strategy) in [
                ("zero3", strategy_by_name("zero3").unwrap()),
                ("fsdp", Fsdp::new(FsdpSharding::FullShard).build()),
            ] {
                let got = embedding(&run(w, strategy));
                let diff = max_diff(&got, &want);
                let tail_diff = max_diff(&tail(&got), &tail(&want));
                println!("{family} {vocab} {name} W={w}: embedding within {diff:e} (last rows {tail_diff:e})");
                assert!(
                    diff <= 1e-6,
                    "{family} {name} W={w}: embedding differs by {diff}"
                );
            }
        }
    }
}

#[test]
fn each_family_builds_the_parameters_its_config_lists_in_that_order() {
    // `ModelConfig::parameter_shapes` (what `estimate`, `export --merge` and the parameter
    // counts read) describes the model a second time: held to what the layers create.
    for family in FAMILIES {
        let mut model = CausalLm::from_pretrained(fixtures().join(family)).unwrap();
        let built: Vec<(String, Vec<usize>)> = on_one_cpu(&mut model)
            .parameter_shapes()
            .into_iter()
            .map(|(n, s)| (n, s.dims().to_vec()))
            .collect();
        assert_eq!(built, model.config().parameter_shapes(), "{family}");
    }
}
