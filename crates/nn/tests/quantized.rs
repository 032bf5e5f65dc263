//! A quantized frozen weight (QLoRA's base, in every block format) is decoded inside the
//! op: LoRA's layer and a frozen linear layer over it give the outputs and gradients of the
//! same layers over the weight it decodes to, bit for bit, and the weight itself gets no
//! gradient.

use candle_core::{Module, Tensor, Var};
use wick_core::BlockFormat;
use wick_nn::{lora_linear, FrozenLinear, FrozenWeight, LoraParts};

#[allow(dead_code)] // what the other test binaries use
mod common;

use common::var;

fn bits(t: &Tensor) -> Vec<u32> {
    let v: Vec<f32> = t.flatten_all().unwrap().to_vec1().unwrap();
    v.iter().map(|x| x.to_bits()).collect()
}

/// A `[out, in]` weight in `format`, and the dense weight it decodes to.
fn weights(out: usize, inp: usize, seed: u64, format: BlockFormat) -> (FrozenWeight, FrozenWeight) {
    let dense = var(&[out, inp], seed, 0.5).as_tensor().detach();
    let quantized = FrozenWeight::quantize(&dense, format).unwrap();
    let decoded = FrozenWeight::Dense(quantized.decoded().unwrap());
    // The decoded weight is not the input: quantization moved it.
    assert_ne!(bits(&decoded.decoded().unwrap()), bits(&dense));
    (quantized, decoded)
}

/// The output and the gradients of `vars` of `f`, for a loss that weighs every output.
fn run(vars: &[Var], f: impl Fn(&[Tensor]) -> Tensor) -> Vec<Vec<u32>> {
    let t: Vec<Tensor> = vars.iter().map(|v| v.as_tensor().clone()).collect();
    let y = f(&t);
    let weights = var(y.dims(), 99, 1.0).as_tensor().detach();
    let grads = (&y * &weights)
        .unwrap()
        .sum_all()
        .unwrap()
        .backward()
        .unwrap();
    let mut out = vec![bits(&y)];
    out.extend(t.iter().map(|t| bits(grads.get(t).expect("a gradient"))));
    out
}

#[test]
fn layers_over_a_quantized_weight_equal_the_same_layers_over_its_values() {
    for format in BlockFormat::ALL {
        lora_over(format);
        frozen_linear_over(format);
    }
}

/// LoRA's layer over `format`'s weight against the same over the values it decodes to.
fn lora_over(format: BlockFormat) {
    // 3 x 5 rows of 100 in (a 64-block and a tail), 72 out, rank 4, a bias.
    let (quantized, decoded) = weights(72, 100, 1, format);
    let bias = var(&[72], 2, 0.5).as_tensor().detach();
    let vars = [
        var(&[3, 5, 100], 3, 1.0),
        var(&[4, 100], 4, 0.5),
        var(&[72, 4], 5, 0.5),
    ];
    let layer = |w: &FrozenWeight, t: &[Tensor]| {
        let parts = LoraParts {
            weight: w,
            bias: Some(&bias),
            a: &t[1],
            b: &t[2],
            scale: 2.0,
            mask: None,
        };
        lora_linear(&t[0], parts).unwrap()
    };
    assert_eq!(
        run(&vars, |t| layer(&quantized, t)),
        run(&vars, |t| layer(&decoded, t)),
        "{format}"
    );
}

/// A frozen linear layer over `format`'s weight against one over the values it decodes to.
fn frozen_linear_over(format: BlockFormat) {
    let (quantized, decoded) = weights(40, 130, 6, format);
    let bias = var(&[40], 7, 0.5).as_tensor().detach();
    let vars = [var(&[2, 9, 130], 8, 1.0)];
    let layer = |w: &FrozenWeight| {
        let layer = FrozenLinear::new(w.clone(), Some(bias.clone()));
        move |t: &[Tensor]| layer.forward(&t[0]).unwrap()
    };
    let (q, d) = (run(&vars, layer(&quantized)), run(&vars, layer(&decoded)));
    assert_eq!(q, d, "{format}");
    // The dense path is Candle's own matmul of the decoded weight.
    let x = vars[0].as_tensor();
    let want = x
        .broadcast_matmul(&decoded.decoded().unwrap().t().unwrap())
        .unwrap()
        .broadcast_add(&bias)
        .unwrap();
    let got = FrozenLinear::new(quantized, Some(bias.clone()))
        .forward(x)
        .unwrap();
    let diff = (got - want).unwrap().abs().unwrap().max_all().unwrap();
    assert!(diff.to_scalar::<f32>().unwrap() < 1e-5, "{format}");
}
