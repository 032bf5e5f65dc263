//! llama.cpp's GGUF files (tests/fixtures/gguf, the fixtures written by the `gguf` package
//! as llama.cpp's converter lays them out: scripts/gguf_fixtures.py): the f32 file's logits
//! equal `transformers`' on the same weights; every family's Q8_0 file (with its tokenizer)
//! gives the logits transformers' own GGUF loader gives on it, and the ids of the Hugging
//! Face tokenizer it was written from; every common type's dequantization equals the
//! `gguf` package's bit for bit.

use crate::models::{fixtures, max_diff, on_one_cpu};
use candle_core::{DType, Device, Tensor};
use std::path::PathBuf;
use wick::models::{BlockFormat, CausalLm, GgufModel};

fn gguf(name: &str) -> PathBuf {
    fixtures().parent().unwrap().join("gguf").join(name)
}

#[test]
fn a_gguf_llama_gives_transformers_logits() {
    let reference = candle_core::safetensors::load(
        fixtures().join("llama").join("reference.safetensors"),
        &Device::Cpu,
    )
    .unwrap();
    let windows = reference["windows"].to_dtype(DType::U32).unwrap();
    let ids = windows.narrow(0, 0, 4).unwrap();
    let ids = ids.narrow(1, 0, ids.dim(1).unwrap() - 1).unwrap();
    let mut lm = CausalLm::from_gguf(gguf("llama-f32.gguf")).unwrap();
    let _strategy = on_one_cpu(&mut lm);
    let logits = lm.logits(&ids).unwrap();
    let diff = max_diff(&logits, &reference["logits"]);
    println!("llama-f32.gguf: logits within {diff:e} of transformers");
    assert!(diff <= 1e-5, "logits differ by {diff}");
    // Quantized to Q8_0, the same model is close, not equal: the file's own weights.
    let mut q8 = CausalLm::from_gguf(gguf("llama-q8_0.gguf")).unwrap();
    let _strategy = on_one_cpu(&mut q8);
    let diff = max_diff(&q8.logits(&ids).unwrap(), &logits);
    assert!(diff > 1e-6 && diff < 0.1, "Q8_0 logits moved by {diff}");
}

/// Every family's Q8_0 file gives transformers' logits on the same file (transformers'
/// GGUF loader dequantizes with the gguf package), not the unquantized model's; its
/// tokenizer gives the ids of the `tokenizer.json` it was written from.
#[test]
fn every_family_s_gguf_gives_the_logits_of_transformers_gguf_loader() {
    let reference =
        candle_core::safetensors::load(gguf("families-q8_0.logits.safetensors"), &Device::Cpu)
            .unwrap();
    let ids = reference["ids"].to_dtype(DType::U32).unwrap();
    let text = "Permission is hereby granted, free of charge, to any person obtaining a copy";
    for family in ["llama", "mistral", "qwen2", "qwen3", "gemma2", "gpt2"] {
        let mut lm = CausalLm::from_gguf(gguf(&format!("{family}-tok-q8_0.gguf"))).unwrap();
        let _strategy = on_one_cpu(&mut lm);
        let logits = lm.logits(&ids).unwrap();
        let diff = max_diff(&logits, &reference[family]);
        let mut hf = CausalLm::from_pretrained(fixtures().join(family)).unwrap();
        let _hf_strategy = on_one_cpu(&mut hf);
        let quantized = max_diff(&logits, &hf.logits(&ids).unwrap());
        println!("{family}: within {diff:e} of transformers' GGUF loader; {quantized:e} from f32");
        assert!(diff <= 1e-5, "{family}: logits differ by {diff}");
        assert!(
            quantized > 1e-4,
            "{family}: Q8_0 moved the logits by {quantized} only"
        );
        let want = hf.tokenizer().unwrap().encode(text).unwrap();
        assert_eq!(
            lm.tokenizer().unwrap().encode(text).unwrap(),
            want,
            "{family}"
        );
    }
}

#[test]
fn q8_0_dequantizes_as_the_gguf_package_does_bit_for_bit() {
    let want =
        candle_core::safetensors::load(gguf("llama-q8_0.safetensors"), &Device::Cpu).unwrap();
    let weights = GgufModel::open(&gguf("llama-q8_0.gguf")).unwrap().weights;
    assert_eq!(want.len(), 14);
    for (name, want) in &want {
        let got: Tensor = weights.dequantized(name).unwrap();
        assert_eq!(got.dims(), want.dims(), "{name}");
        assert_eq!(
            bits(&got),
            bits(want),
            "{name}: not the gguf package's values"
        );
    }
}

#[test]
fn a_gguf_file_wick_cannot_read_is_refused_by_name() {
    use candle_core::quantized::gguf_file::{write, Value};
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("phi.gguf");
    let arch = Value::String("phi3".into());
    write(
        &mut std::fs::File::create(&path).unwrap(),
        &[("general.architecture", &arch)],
        &[],
    )
    .unwrap();
    let e = CausalLm::from_gguf(&path).err().unwrap().to_string();
    assert!(
        e.contains("phi.gguf") && e.contains("architecture 'phi3'"),
        "{e}"
    );
    let e = CausalLm::from_gguf(dir.path().join("none.gguf"))
        .err()
        .unwrap()
        .to_string();
    assert!(e.contains("none.gguf") && e.contains("cannot open"), "{e}");
    std::fs::write(dir.path().join("text.gguf"), "not gguf").unwrap();
    let e = CausalLm::from_gguf(dir.path().join("text.gguf"))
        .err()
        .unwrap()
        .to_string();
    assert!(e.contains("not a GGUF file"), "{e}");
}

/// Every type llama.cpp writes most (`quants.gguf`: the gguf package's quantizations, and
/// seeded random blocks of the K-quants) dequantizes to the gguf package's values bit for
/// bit, through the call `GgufWeights` reads every tensor with, and the blocks a QLoRA
/// base keeps (`BlockFormat`) through the base's own decoding.
#[test]
fn every_common_type_dequantizes_as_the_gguf_package_does_bit_for_bit() {
    use candle_core::quantized::gguf_file::Content;
    let want = candle_core::safetensors::load(gguf("quants.safetensors"), &Device::Cpu).unwrap();
    let mut file = std::fs::File::open(gguf("quants.gguf")).unwrap();
    let content = Content::read(&mut file).unwrap();
    let mut types: Vec<&String> = want.keys().collect();
    types.sort();
    assert_eq!(
        types,
        [
            "t.BF16", "t.F16", "t.Q2_K", "t.Q3_K", "t.Q4_0", "t.Q4_1", "t.Q4_K", "t.Q5_0",
            "t.Q5_1", "t.Q5_K", "t.Q6_K", "t.Q8_0"
        ]
    );
    for (name, want) in &want {
        let got = content
            .tensor(&mut file, name, &Device::Cpu)
            .unwrap()
            .dequantize(&Device::Cpu)
            .unwrap();
        assert_eq!(
            bits(&got),
            bits(want),
            "{name}: not the gguf package's values"
        );
    }
    // A QLoRA base kept in llama.cpp's blocks decodes its stored bytes the same way.
    let mut kept = Vec::new();
    for (name, want) in &want {
        let q = content.tensor(&mut file, name, &Device::Cpu).unwrap();
        let Some(format) = BlockFormat::from_ggml(q.dtype()) else {
            continue;
        };
        let mut got = vec![0f32; q.shape().elem_count()];
        format.decode(&q.data().unwrap(), &mut got).unwrap();
        let got = Tensor::new(got, &Device::Cpu).unwrap();
        assert_eq!(bits(&got), bits(want), "{format}: not {name}'s values");
        kept.push(format.name());
    }
    kept.sort();
    assert_eq!(
        kept,
        ["q2_k", "q3_k", "q4_0", "q4_1", "q4_k", "q5_0", "q5_1", "q5_k", "q6_k", "q8_0"]
    );
}

/// The bits of every value of `t`.
fn bits(t: &Tensor) -> Vec<u32> {
    let v: Vec<f32> = t.flatten_all().unwrap().to_vec1().unwrap();
    v.into_iter().map(f32::to_bits).collect()
}

/// Llama 3's scaled rope, stored by llama.cpp as the divisors of `rope_freqs.weight`: read
/// back as the fixture's `rope_scaling` (the logits are transformers' on the Hugging Face
/// fixture), and written again by `GgufExport` with the same divisors and logits.
#[test]
fn a_llama_3_rope_is_read_from_rope_freqs_and_written_back() {
    use candle_core::quantized::gguf_file::Content;
    use std::collections::HashMap;
    use wick::models::{GgufExport, GgufType, ModelConfig, RopeScaling};
    let hf = fixtures().join("llama3");
    let reference =
        candle_core::safetensors::load(hf.join("reference.safetensors"), &Device::Cpu).unwrap();
    let windows = reference["windows"].to_dtype(DType::U32).unwrap();
    let ids = windows.narrow(0, 0, 2).unwrap();
    let ids = ids.narrow(1, 0, ids.dim(1).unwrap() - 1).unwrap();
    let want = reference["logits"].narrow(0, 0, 2).unwrap();
    let logits_of = |path: &std::path::Path| {
        let mut lm = CausalLm::from_gguf(path).unwrap();
        let ModelConfig::Decoder(c) = lm.config() else {
            panic!("a decoder")
        };
        let scaling = c.rope.scaling.clone();
        let _strategy = on_one_cpu(&mut lm);
        (lm.logits(&ids).unwrap(), scaling)
    };
    let (logits, scaling) = logits_of(&gguf("llama3-f32.gguf"));
    let RopeScaling::Llama3 {
        factor,
        original_max_position_embeddings,
        ..
    } = scaling
    else {
        panic!("{scaling:?}")
    };
    assert_eq!((factor, original_max_position_embeddings), (8.0, 256));
    let diff = max_diff(&logits, &want);
    assert!(diff <= 1e-5, "logits differ by {diff}");
    // Written again from the Hugging Face fixture: the same divisors, the same model.
    let lm = CausalLm::from_pretrained(&hf).unwrap();
    let tensors: HashMap<String, Tensor> =
        candle_core::safetensors::load(hf.join("model.safetensors"), &Device::Cpu).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("llama3.gguf");
    let export = GgufExport {
        config: lm.config(),
        name: "llama3",
        tokenizer: lm.tokenizer().unwrap(),
        bos: Some(0),
        eos: Some(0),
        chat_template: None,
    };
    export.write(&out, &tensors, GgufType::F32).unwrap();
    let divisors = |path: &std::path::Path| -> Vec<f32> {
        let mut file = std::fs::File::open(path).unwrap();
        let content = Content::read(&mut file).unwrap();
        let t = content
            .tensor(&mut file, "rope_freqs.weight", &Device::Cpu)
            .unwrap();
        t.dequantize(&Device::Cpu).unwrap().to_vec1().unwrap()
    };
    let (a, b) = (divisors(&out), divisors(&gguf("llama3-f32.gguf")));
    assert!(
        a.iter().zip(&b).all(|(x, y)| (x - y).abs() <= 1e-6 * y),
        "{a:?} {b:?}"
    );
    assert!(
        b.iter().any(|&d| d > 1.0),
        "the fixture's rope is scaled: {b:?}"
    );
    let (again, _) = logits_of(&out);
    assert!(max_diff(&again, &logits) <= 1e-6);
}
