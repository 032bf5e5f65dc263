//! QLoRA's frozen base: NF4 with double quantization equal to bitsandbytes' own bytes and
//! values (tests/fixtures/nf4, written by scripts/nf4_fixtures.py with bitsandbytes), and
//! LoRA over an NF4 base equal to LoRA over the weights it decodes to.

use candle_core::{Device, Tensor};
use std::collections::HashMap;
use wick::core::{dynamic_code, Nf4Tensor};

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
    for case in ["square", "tail", "wide"] {
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
