//! Each fused layer against the composite Candle ops of the same layer: outputs and every
//! input's gradient within 1e-5 (f32), on random inputs, odd sizes and a batch of one.

use candle_core::{DType, Device, Module, Tensor, Var};
use wick_nn::{
    causal_attention, cross_entropy, gelu, layer_norm_composite, lora_linear,
    lora_linear_composite, matmul_wt, rms_norm_composite, rms_norm_unit_offset, swiglu,
    swiglu_composite, LayerNorm, LayerWeight, LoraParts, RmsNorm, RotaryEmbedding,
};

#[allow(dead_code)] // what the other test binary uses
mod common;

use common::{check, max_diff, values, var};

#[test]
fn layer_norm_matches_the_composite() {
    for (shape, seed) in [(vec![4, 7, 33], 1), (vec![1, 1, 5], 2), (vec![3, 128], 3)] {
        let c = *shape.last().unwrap();
        let inputs = [
            var(&shape, seed, 2.0),
            var(&[c], seed + 10, 1.0),
            var(&[c], seed + 20, 1.0),
        ];
        check(
            &format!("layer_norm {shape:?}"),
            &inputs,
            |t| LayerNorm::new(t[1].clone(), t[2].clone(), 1e-5).forward(&t[0]),
            |t| layer_norm_composite(&t[0], &t[1], &t[2], 1e-5),
        );
    }
}

#[test]
fn a_few_rows_times_a_weight_match_the_matmul() {
    // One to four rows take the blocked kernel (an odd number of weight rows: a short last
    // block), five Candle's matmul; the weight as an embedding table is, and as wide.
    for (rows, out, inner, seed) in [
        (1, 77, 40, 60),
        (3, 33, 129, 61),
        (4, 100, 16, 62),
        (5, 9, 7, 63),
    ] {
        check(
            &format!("matmul_wt {rows}x{inner} . {out}x{inner}"),
            &[
                var(&[rows, inner], seed, 1.0),
                var(&[out, inner], seed + 1, 1.0),
            ],
            |t| matmul_wt(&t[0], &t[1]),
            |t| t[0].matmul(&t[1].t()?),
        );
    }
}

#[test]
fn gelu_matches_the_composite() {
    for (shape, seed) in [(vec![5, 13], 4), (vec![1], 5), (vec![2, 3, 65], 6)] {
        check(
            &format!("gelu {shape:?}"),
            &[var(&shape, seed, 4.0)],
            |t| gelu(&t[0]),
            |t| t[0].gelu(),
        );
    }
}

#[test]
fn swiglu_matches_the_composite() {
    // Sizes past one SIMD register and one parallel task, and a single element.
    for (shape, seed) in [(vec![5, 13], 40), (vec![1], 41), (vec![3, 40_000], 42)] {
        check(
            &format!("swiglu {shape:?}"),
            &[var(&shape, seed, 6.0), var(&shape, seed + 1, 3.0)],
            |t| swiglu(&t[0], &t[1]),
            |t| swiglu_composite(&t[0], &t[1]),
        );
    }
}

#[test]
fn rms_norm_matches_the_composite() {
    for (shape, seed) in [
        (vec![4, 7, 33], 31),
        (vec![1, 1, 5], 32),
        (vec![3, 128], 33),
    ] {
        let c = *shape.last().unwrap();
        let inputs = [var(&shape, seed, 2.0), var(&[c], seed + 10, 1.0)];
        check(
            &format!("rms_norm {shape:?}"),
            &inputs,
            |t| RmsNorm::new(t[1].clone(), 1e-6).forward(&t[0]),
            |t| rms_norm_composite(&t[0], &t[1], 1e-6),
        );
    }
    // Gemma's norm scales by 1 + weight.
    let inputs = [var(&[3, 2, 24], 34, 2.0), var(&[24], 35, 0.5)];
    check(
        "rms_norm_unit_offset",
        &inputs,
        |t| {
            let vb = candle_nn::VarBuilder::from_tensors(
                [("weight".to_string(), t[1].clone())].into(),
                DType::F32,
                &Device::Cpu,
            );
            rms_norm_unit_offset(24, 1e-6, vb)?.forward(&t[0])
        },
        |t| rms_norm_composite(&t[0], &(&t[1] + 1.0)?, 1e-6),
    );
}

/// LoRA's parts over frozen `w` and `bias`, with `t` = [x, A, B].
fn lora_parts<'a>(
    t: &'a [Tensor],
    w: &'a LayerWeight,
    bias: &'a Tensor,
    mask: Option<&'a Tensor>,
) -> LoraParts<'a> {
    LoraParts {
        weight: w,
        bias: Some(bias),
        a: &t[1],
        b: &t[2],
        scale: 2.5,
        mask,
    }
}

#[test]
fn lora_linear_matches_the_composite_and_leaves_the_layer_weight_without_gradient() {
    // Odd sizes: 2 x 5 rows of 7 in, 9 out, rank 3; a bias; with and without dropout.
    let plain = |shape: &[usize], seed| var(shape, seed, 0.5).as_tensor().detach();
    let (w, bias) = (LayerWeight::Dense(plain(&[9, 7], 1)), plain(&[9], 2));
    let factors = (0..70).map(|i| if i % 4 == 1 { 0.0 } else { 4.0 / 3.0 });
    let mask = Tensor::from_vec(factors.collect::<Vec<f32>>(), (2, 5, 7), &Device::Cpu).unwrap();
    for (what, mask) in [("lora_linear", None), ("lora_linear, dropout", Some(&mask))] {
        let inputs = [
            var(&[2, 5, 7], 3, 1.0),
            var(&[3, 7], 4, 0.5),
            var(&[9, 3], 5, 0.5),
        ];
        check(
            what,
            &inputs,
            |t| lora_linear(&t[0], lora_parts(t, &w, &bias, mask)),
            |t| lora_linear_composite(&t[0], lora_parts(t, &w, &bias, mask)),
        );
        let t: Vec<Tensor> = inputs.iter().map(|v| v.as_tensor().clone()).collect();
        let out = lora_linear(&t[0], lora_parts(&t, &w, &bias, mask)).unwrap();
        let grads = out.sum_all().unwrap().backward().unwrap();
        assert!(
            grads.get(&w.decoded().unwrap()).is_none() && grads.get(&bias).is_none(),
            "{what}: a frozen weight got a gradient"
        );
    }
}

#[test]
fn linear_matches_candle_nn() {
    for (shape, out, seed) in [
        (vec![4, 7, 33], 19, 13),
        (vec![1, 3], 1, 14),
        (vec![2, 64, 128], 512, 15),
    ] {
        let inp = *shape.last().unwrap();
        let inputs = [
            var(&shape, seed, 1.0),
            var(&[out, inp], seed + 1, 0.5),
            var(&[out], seed + 2, 0.5),
        ];
        let layer = |t: &[Tensor]| candle_nn::Linear::new(t[1].clone(), Some(t[2].clone()));
        check(
            &format!("linear {shape:?} -> {out}"),
            &inputs,
            |t| wick_nn::Linear::from(layer(t)).forward(&t[0]),
            |t| layer(t).forward(&t[0]),
        );
    }
}

#[test]
fn bad_inputs_are_errors() {
    let logits = Tensor::zeros((4, 3), DType::F32, &Device::Cpu).unwrap();
    let out_of_range = Tensor::new(&[0u32, 1, 2, 3], &Device::Cpu).unwrap();
    let e = cross_entropy(&logits, &out_of_range)
        .unwrap_err()
        .to_string();
    assert!(e.contains("target 3 is not below the 3 classes"), "{e}");
    let short = Tensor::new(&[0u32, 1], &Device::Cpu).unwrap();
    assert!(cross_entropy(&logits, &short).is_err());
    let q = Tensor::zeros((1, 1, 4, 2), DType::F32, &Device::Cpu).unwrap();
    let k = Tensor::zeros((1, 1, 3, 2), DType::F32, &Device::Cpu).unwrap();
    assert!(causal_attention(&q, &k, &k)
        .unwrap_err()
        .to_string()
        .contains("kv_heads dividing its heads"));
    // 3 query heads cannot share 2 key/value heads.
    let q = Tensor::zeros((1, 3, 4, 2), DType::F32, &Device::Cpu).unwrap();
    let k = Tensor::zeros((1, 2, 4, 2), DType::F32, &Device::Cpu).unwrap();
    assert!(causal_attention(&q, &k, &k).is_err());
    let odd = RotaryEmbedding::new(3, 8, 10_000.0, &Device::Cpu).unwrap_err();
    assert!(odd.to_string().contains("even"), "{odd}");
    let rope = RotaryEmbedding::new(2, 3, 10_000.0, &Device::Cpu).unwrap();
    assert!(rope
        .apply(&q)
        .unwrap_err()
        .to_string()
        .contains("at most 3 positions"));
}

/// How the 16-bit check reads a variable: rounded to 16 bits, or that rounded back to f32.
type Cast<'a> = &'a dyn Fn(&Var) -> Tensor;

/// Layer norm, RMS norm, rotary embedding and attention take 16-bit inputs as torch's
/// autocast does: computed in f32, the output rounded to the input's dtype once, the
/// gradient flowing back in that dtype.
#[test]
fn sixteen_bit_inputs_compute_in_f32() {
    let x = var(&[3, 5, 24], 21, 2.0);
    let (w, b) = (var(&[24], 22, 1.0), var(&[24], 23, 1.0));
    let q = var(&[2, 3, 7, 8], 24, 1.0);
    let (k, v) = (var(&[2, 3, 7, 8], 25, 1.0), var(&[2, 3, 7, 8], 26, 1.0));
    for dtype in [DType::F16, DType::BF16] {
        let half = |t: &Var| t.as_tensor().to_dtype(dtype).unwrap();
        let f32_of_half = |t: &Var| half(t).to_dtype(DType::F32).unwrap();
        // Each op over 16-bit inputs: the f32 result over the rounded inputs, rounded once.
        let check = |name: &str, op: &dyn Fn(Cast) -> Tensor| {
            let got = op(&half);
            let want = op(&f32_of_half).to_dtype(dtype).unwrap();
            assert_eq!(got.dtype(), dtype, "{name}");
            let diff = max_diff(
                &got.to_dtype(DType::F32).unwrap(),
                &want.to_dtype(DType::F32).unwrap(),
            );
            assert_eq!(diff, 0.0, "{dtype:?} {name}");
        };
        check("layer norm", &|p| {
            LayerNorm::new(p(&w), p(&b), 1e-5).forward(&p(&x)).unwrap()
        });
        check("attention", &|p| {
            causal_attention(&p(&q), &p(&k), &p(&v)).unwrap()
        });
        check("rms norm", &|p| {
            RmsNorm::new(p(&w), 1e-6).forward(&p(&x)).unwrap()
        });
        let rope = RotaryEmbedding::new(8, 7, 10_000.0, &Device::Cpu).unwrap();
        check("rotary", &|p| rope.apply(&p(&q)).unwrap());
    }
    // The gradient too: through f16 layer norm it is within f16 rounding of the f32
    // gradient, closer than the composite ops computed in f16 get (3.5x here).
    let x16 = Var::from_tensor(&x.as_tensor().to_dtype(DType::F16).unwrap()).unwrap();
    let x32 = Var::from_tensor(&x16.as_tensor().to_dtype(DType::F32).unwrap()).unwrap();
    let half = |t: &Var, dtype| t.as_tensor().to_dtype(dtype).unwrap();
    let grad = |x: &Var, norm: &dyn Fn(&Tensor) -> Tensor| {
        let out = norm(x.as_tensor()).to_dtype(DType::F32).unwrap();
        let r = Tensor::from_vec(values(out.elem_count(), 98, 1.0), out.shape(), &Device::Cpu);
        let store = (out * r.unwrap())
            .unwrap()
            .sum_all()
            .unwrap()
            .backward()
            .unwrap();
        store
            .get(x.as_tensor())
            .unwrap()
            .to_dtype(DType::F32)
            .unwrap()
    };
    let reference = grad(&x32, &|t| {
        LayerNorm::new(
            half(&w, DType::F16).to_dtype(DType::F32).unwrap(),
            half(&b, DType::F16).to_dtype(DType::F32).unwrap(),
            1e-5,
        )
        .forward(t)
        .unwrap()
    });
    let ours = grad(&x16, &|t| {
        LayerNorm::new(half(&w, DType::F16), half(&b, DType::F16), 1e-5)
            .forward(t)
            .unwrap()
    });
    let composite = grad(&x16, &|t| {
        layer_norm_composite(t, &half(&w, DType::F16), &half(&b, DType::F16), 1e-5).unwrap()
    });
    let (ours, composite) = (
        max_diff(&ours, &reference),
        max_diff(&composite, &reference),
    );
    assert!(
        ours <= 1e-3 && ours * 2.0 < composite,
        "f16 layer norm gradient {ours} from f32's (the f16 composite: {composite})"
    );
}
