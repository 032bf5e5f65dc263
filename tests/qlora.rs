//! QLoRA's frozen base: NF4 with double quantization equal to bitsandbytes' own bytes and
//! values on the fixture's weights (tests/fixtures/nf4, written by scripts/nf4_fixtures.py
//! with bitsandbytes; one case holds absmaxes whose 8-bit code is not the nearest entry,
//! as bitsandbytes' table lookup codes them), and LoRA over a quantized base (NF4, and llama.cpp's Q8_0, Q4_K and Q6_K blocks, whose
//! decoding `tests/gguf.rs` holds to the gguf package's bit for bit) equal to LoRA over
//! the weights it decodes to, under every strategy.

use crate::models::{fixtures, max_diff, plain_sgd, trainer, Windows};
use candle_core::{DType, Device, Tensor};
use std::collections::HashMap;
use std::path::Path;
use std::sync::Arc;
use wick::core::{dynamic_code, BlockFormat, Nf4Tensor, OptimizerConfig, PretrainedWeights};
use wick::models::{is_quantized_weight, CausalLm, LoraConfig, QuantizedBase};
use wick::strategies::strategy_by_name;
use wick::trainer::{Attached, DataLoader};

const FIXTURE: &str = "tests/fixtures/nf4/nf4.safetensors";

fn fixture() -> HashMap<String, Tensor> {
    candle_core::safetensors::load(FIXTURE, &Device::Cpu).expect(FIXTURE)
}

fn u8s(t: &Tensor) -> Vec<u8> {
    t.flatten_all().unwrap().to_vec1().unwrap()
}

fn f32s(t: &Tensor) -> Vec<f32> {
    t.flatten_all().unwrap().to_vec1().unwrap()
}

/// Bit patterns, so that a NaN or a signed zero is not equal by accident.
fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

#[test]
fn nf4_equals_bitsandbytes_bit_for_bit() {
    let t = fixture();
    assert_eq!(bits(dynamic_code()), bits(&f32s(&t["dynamic_code"])));
    for case in ["square", "tail", "wide", "table"] {
        let get = |part: &str| &t[&format!("{case}.{part}")];
        let weight = get("weight");
        let offset = f32s(get("offset"))[0];
        // wick's own offset (the mean in f64) is within an ulp of torch's f32 mean.
        let own = Nf4Tensor::quantize(&f32s(weight), weight.dims());
        let ulps = (own.offset().to_bits() as i64 - offset.to_bits() as i64).abs();
        assert!(
            ulps <= 1,
            "{case}: offset {} against {offset}",
            own.offset()
        );
        assert_eq!(own.packed(), u8s(get("packed")), "{case}: 4-bit codes");
        // With bitsandbytes' offset, every byte and value is its own.
        let q = Nf4Tensor::quantize_with_offset(&f32s(weight), weight.dims(), Some(offset));
        assert_eq!(q.packed(), u8s(get("packed")), "{case}: 4-bit codes");
        assert_eq!(
            q.absmax_codes(),
            u8s(get("absmax_codes")),
            "{case}: absmax codes"
        );
        assert_eq!(
            bits(q.absmax_scales()),
            bits(&f32s(get("absmax_scales"))),
            "{case}"
        );
        let want = f32s(get("dequantized"));
        assert_eq!(bits(&q.dequantize()), bits(&want), "{case}: dequantized");
        // bitsandbytes' stored state decodes to the same through wick.
        let stored = Nf4Tensor::from_parts(
            weight.dims(),
            u8s(get("packed")),
            u8s(get("absmax_codes")),
            f32s(get("absmax_scales")),
            offset,
        )
        .unwrap();
        assert_eq!(bits(&stored.dequantize()), bits(&want), "{case}");
        // And the quantization moved the weight: the reference is not the input.
        let moved = f32s(weight)
            .iter()
            .zip(&want)
            .filter(|(a, b)| a != b)
            .count();
        assert!(moved > weight.elem_count() / 2, "{case}: {moved}");
    }
}

/// The Qwen2 fixture's base weights with every block linear weight (and with `embeddings`,
/// the tied embedding) replaced by what its `format` form decodes to (the base QLoRA trains
/// over, as plain f32), written into `dir`.
fn decoded_base(dir: &Path, (format, embeddings): Form) -> HashMap<String, Tensor> {
    let path = fixtures().join("qwen2/model.safetensors");
    let mut weights = candle_core::safetensors::load(path, &Device::Cpu).unwrap();
    for (name, w) in weights.iter_mut() {
        if is_quantized_weight(name, embeddings) {
            let values = format.round_trip(&f32s(w)).unwrap();
            *w = Tensor::from_vec(values, w.dims(), &Device::Cpu).unwrap();
        }
    }
    candle_core::safetensors::save(&weights, dir.join("decoded.safetensors")).unwrap();
    weights
}

/// LoRA of rank 4 on q_proj, v_proj and down_proj (the other four linear layers of a block
/// frozen without an adapter), over the Qwen2 fixture (biases, a tied embedding).
fn lora_model(optimizer: OptimizerConfig) -> CausalLm {
    let lora = LoraConfig {
        rank: 4,
        alpha: 8.0,
        dropout: 0.0,
        targets: ["q_proj", "v_proj", "down_proj"].map(String::from).to_vec(),
    };
    CausalLm::from_pretrained(fixtures().join("qwen2"))
        .unwrap()
        .with_optimizer(optimizer)
        .with_lora(lora)
        .unwrap()
}

/// A base's block form, and whether its embeddings are held in it too.
type Form = (BlockFormat, bool);

fn qlora_model(optimizer: OptimizerConfig, (format, embeddings): Form) -> CausalLm {
    let lm = lora_model(optimizer).with_quantized_base(format).unwrap();
    match embeddings {
        true => lm.with_quantized_embeddings().unwrap(),
        false => lm,
    }
}

fn qwen2_loader() -> DataLoader<Windows> {
    windows_of("qwen2")
}

fn windows_of(family: &str) -> DataLoader<Windows> {
    let path = fixtures().join(format!("{family}/reference.safetensors"));
    let reference = candle_core::safetensors::load(path, &Device::Cpu).unwrap();
    // 12 windows a step: the batch splits over 2, 3 and 4 ranks alike.
    let windows = reference["windows"].to_dtype(DType::U32).unwrap();
    DataLoader::new(Windows(windows), 12).without_shuffle()
}

/// The adapters (and the module) after `steps` steps of `model` on `devices` ranks.
fn fit(
    model: CausalLm,
    devices: usize,
    strategy: &str,
    steps: usize,
) -> (HashMap<String, Tensor>, Attached<CausalLm>) {
    fit_on(model, &qwen2_loader(), (devices, strategy), steps)
}

/// [`fit`] on `data`.
fn fit_on(
    model: CausalLm,
    data: &DataLoader<Windows>,
    (devices, strategy): (usize, &str),
    steps: usize,
) -> (HashMap<String, Tensor>, Attached<CausalLm>) {
    let mut t = trainer(devices, strategy_by_name(strategy).unwrap(), steps);
    let mut m = Attached::new(model);
    t.fit(&mut m, data, None).unwrap();
    let params = t.full_parameters(&mut m).unwrap().into_iter().collect();
    (params, m)
}

fn adapters_diff(a: &HashMap<String, Tensor>, b: &HashMap<String, Tensor>) -> f32 {
    let adapters = a.iter().filter(|(n, _)| LoraConfig::is_adapter(n));
    adapters
        .map(|(n, t)| max_diff(t, &b[n]))
        .fold(0.0, f32::max)
}

#[test]
fn qlora_equals_lora_over_the_base_it_decodes_to() {
    let every_strategy = [
        (1, "single"),
        (2, "ddp"),
        (4, "ddp"),
        (3, "zero1"),
        (4, "zero2"),
        (2, "zero3"),
        (4, "zero3"),
        (2, "fsdp"),
        (3, "fsdp"),
        (4, "fsdp"),
    ];
    qlora_equals_lora((BlockFormat::Nf4, false), &every_strategy);
}

/// The embedding held in blocks too (`--quantize-embeddings`): its rows decoded as tokens
/// look them up, and as the tied head a slice of rows at a time.
#[test]
fn qlora_over_quantized_embeddings_equals_lora_over_the_table_they_decode_to() {
    let runs = [
        (1, "single"),
        (2, "ddp"),
        (2, "zero3"),
        (3, "fsdp"),
        (4, "fsdp"),
    ];
    qlora_equals_lora((BlockFormat::Nf4, true), &runs);
    qlora_equals_lora((BlockFormat::Q8_0, true), &[(1, "single"), (2, "fsdp")]);
}

#[test]
fn qlora_over_llama_cpp_blocks_equals_lora_over_the_base_they_decode_to() {
    let kept_and_sharded = [(1, "single"), (2, "ddp"), (2, "zero3"), (3, "fsdp")];
    for format in [BlockFormat::Q8_0, BlockFormat::Q4K, BlockFormat::Q6K] {
        qlora_equals_lora((format, false), &kept_and_sharded);
    }
}

/// LoRA over a base born in `form` on each of `runs` (ranks, strategy) against LoRA over
/// the values it decodes to on one device: first gradients, then 10 AdamW steps.
fn qlora_equals_lora(form: Form, runs: &[(usize, &str)]) {
    let (format, embeddings) = form;
    let label = format!(
        "{format}{}",
        if embeddings { " and embeddings" } else { "" }
    );
    let dir = tempfile::tempdir().unwrap();
    let decoded = decoded_base(dir.path(), form);
    let file = PretrainedWeights::open(&[dir.path().join("decoded.safetensors")]).unwrap();
    let file = Arc::new(file);
    let over_decoded = |optimizer| lora_model(optimizer).with_weights(file.clone());
    // One SGD step at rate 1: each parameter moves by minus its gradient.
    let (q, _) = fit(qlora_model(plain_sgd(), form), 1, "single", 1);
    let (d, _) = fit(over_decoded(plain_sgd()), 1, "single", 1);
    let grads = adapters_diff(&q, &d);
    let moved = q
        .iter()
        .filter(|(n, _)| n.contains(".lora_B."))
        .map(|(n, t)| {
            let start = t.zeros_like().unwrap();
            max_diff(t, &start).min(max_diff(&d[n], &start))
        });
    let smallest = moved.fold(f32::INFINITY, f32::min);
    println!("qlora {label}: first gradients within {grads:e} (B's smallest {smallest:e})");
    // Every B's gradient at least 10x the bound.
    assert!(
        grads <= 1e-6 && smallest > 1e-5,
        "{label}: {grads} {smallest}"
    );
    // Ten AdamW steps, on one device and on several ranks of every strategy (the base kept
    // whole, or sharded by whole blocks), against LoRA over the decoded base on one device.
    let adamw = || OptimizerConfig::adamw(1e-3);
    let (reference, _) = fit(over_decoded(adamw()), 1, "single", 10);
    let (original, _) = fit(lora_model(adamw()), 1, "single", 10);
    // What quantizing the base changes, which the bound must sit far below.
    let quantization = adapters_diff(&reference, &original);
    assert!(quantization > 1e-4, "{label}: {quantization}");
    for &(devices, strategy) in runs {
        let (got, m) = fit(qlora_model(adamw(), form), devices, strategy, 10);
        let diff = adapters_diff(&got, &reference);
        println!("qlora {label} {strategy} W={devices}: 10 steps within {diff:e} (quantization moved {quantization:e})");
        assert!(diff <= 1e-5, "{label} {strategy} W={devices}: {diff}");
        // The frozen weights come out as the values they decode to, never moved.
        for (n, value) in got.iter().filter(|(n, _)| !LoraConfig::is_adapter(n)) {
            assert_eq!(max_diff(value, &decoded[n]), 0.0, "{strategy}: {n}");
        }
        // The block weights are kept as stored blocks (4.13 to 8.5 bits, not 32): whole on
        // each rank, or dealt out in whole blocks. Sharded, a rank holds its 1/W share and
        // at most, in each of the 3 units (2 layers and the root), one stored block and its
        // two value parts' padding (under W elements each) more.
        let quantized: usize = (decoded.iter())
            .filter(|(n, _)| is_quantized_weight(n, embeddings))
            .map(|(_, t)| format.stored_len(t.elem_count()))
            .sum();
        let dense: usize = (got.iter())
            .filter(|(n, _)| !is_quantized_weight(n, embeddings))
            .map(|(_, t)| 4 * t.elem_count())
            .sum();
        let bytes = m.state_bytes().unwrap().params;
        match strategy {
            "zero3" | "fsdp" => {
                let block = format.block_bytes();
                let whole = quantized + dense;
                let bound = whole.div_ceil(devices) + 3 * (block + 2 * 4 * devices);
                println!("qlora {label} {strategy} W={devices}: {bytes} bytes of parameters a rank (bound {bound}, whole {whole})");
                assert!(
                    bytes <= bound,
                    "{label} {strategy} W={devices}: {bytes} > {bound}"
                );
            }
            _ => assert_eq!(bytes, quantized + dense, "{label} {strategy} W={devices}"),
        }
    }
}

#[test]
fn a_quantized_base_needs_lora() {
    let plain = CausalLm::from_pretrained(fixtures().join("qwen2")).unwrap();
    let e = plain.with_quantized_base(BlockFormat::Nf4).err().unwrap();
    assert!(e.to_string().contains("LoRA"), "{e}");
}

/// A quantized GGUF's own blocks kept as they are (`--keep-quantized`): LoRA over them
/// equals LoRA over the same file dequantized (what wick reads from it otherwise), whole or
/// sharded by whole blocks. The Llama fixture's Q8_0 file holds the attention and gate/up
/// weights in Q8_0 (the query and key rows in llama.cpp's rope order, put back row by row)
/// and `down_proj` in f32 (its rows of 88 do not divide into blocks), which stays dense.
#[test]
fn a_gguf_base_kept_as_read_equals_lora_over_the_file_dequantized() {
    let file = fixtures().join("../gguf/llama-q8_0.gguf");
    let lora = || LoraConfig {
        rank: 4,
        alpha: 8.0,
        dropout: 0.0,
        targets: ["q_proj", "k_proj", "down_proj"].map(String::from).to_vec(),
    };
    let model = |optimizer| {
        let lm = CausalLm::from_pretrained(&file).unwrap();
        lm.with_optimizer(optimizer).with_lora(lora()).unwrap()
    };
    let data = windows_of("llama");
    let adamw = || OptimizerConfig::adamw(1e-3);
    let (reference, _) = fit_on(model(adamw()), &data, (1, "single"), 10);
    // The file's quantization moves the run far more than the bound.
    let original = CausalLm::from_pretrained(fixtures().join("llama")).unwrap();
    let original = original.with_optimizer(adamw()).with_lora(lora()).unwrap();
    let (original, _) = fit_on(original, &data, (1, "single"), 10);
    let quantization = adapters_diff(&reference, &original);
    assert!(quantization > 1e-4, "{quantization}");
    let kept = || {
        model(adamw())
            .with_quantized_base(QuantizedBase::AsRead)
            .unwrap()
    };
    // The last two runs keep the embedding and the output head (untied here), which the
    // file holds in Q8_0 too, as its blocks as well: looked up and scored from them.
    let runs = [(1, "single"), (2, "ddp"), (2, "zero3"), (3, "fsdp")].map(|r| (r, false));
    let with_embeddings = [((1, "single"), true), ((3, "fsdp"), true)];
    for ((devices, strategy), embeddings) in runs.into_iter().chain(with_embeddings) {
        let model = match embeddings {
            true => kept().with_quantized_embeddings().unwrap(),
            false => kept(),
        };
        let (got, m) = fit_on(model, &data, (devices, strategy), 10);
        let run = format!("{strategy} W={devices}, embeddings {embeddings}");
        let diff = adapters_diff(&got, &reference);
        println!(
            "kept as read {run}: 10 steps within {diff:e} (quantization moved {quantization:e})"
        );
        assert!(diff <= 1e-5, "{run}: {diff}");
        // The frozen weights decode to the file's values, bit for bit (rows in order).
        for (n, value) in got.iter().filter(|(n, _)| !LoraConfig::is_adapter(n)) {
            assert_eq!(max_diff(value, &reference[n]), 0.0, "{run}: {n}");
        }
        // The Q8_0 weights are kept as their blocks (8.5 bits), down_proj as f32.
        let q8 = |n: &str| is_quantized_weight(n, embeddings) && !n.contains("down_proj");
        let bytes: usize = (got.iter())
            .map(|(n, t)| match q8(n) {
                true => BlockFormat::Q8_0.stored_len(t.elem_count()),
                false => 4 * t.elem_count(),
            })
            .sum();
        let held = m.state_bytes().unwrap().params;
        match strategy {
            "single" | "ddp" => assert_eq!(held, bytes, "{run}"),
            _ => assert!(
                held < bytes / devices + 3 * 1024,
                "{run}: {held} of {bytes}"
            ),
        }
    }
    // Weights that hold no blocks cannot be kept as read.
    let plain = CausalLm::from_pretrained(fixtures().join("llama")).unwrap();
    let e = plain.with_lora(lora()).unwrap();
    let e = e.with_quantized_base(QuantizedBase::AsRead).err().unwrap();
    assert!(e.to_string().contains("GGUF"), "{e}");
}
