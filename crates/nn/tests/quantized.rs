//! A quantized frozen weight (QLoRA's base, in every block format) is decoded inside the
//! op: LoRA's layer and a frozen linear layer over it give the outputs and gradients of the
//! same layers over the weight it decodes to, bit for bit, and the weight itself gets no
//! gradient. An embedding table held quantized gives the rows and, as a tied output head
//! decoded a slice of rows at a time, the loss, log-probabilities and input gradients of
//! the table it decodes to.

use candle_core::{DType, Module, Tensor, Var};
use wick_core::{BlockFormat, IGNORE_INDEX};
use wick_nn::{
    head_score, linear_cross_entropy, linear_log_probs, lora_linear, FrozenLinear, HeadScore,
    LayerWeight, LoraParts,
};

#[allow(dead_code)] // what the other test binaries use
mod common;

use common::{assert_close, max_diff, var, Bound};

fn bits(t: &Tensor) -> Vec<u32> {
    let v: Vec<f32> = t.flatten_all().unwrap().to_vec1().unwrap();
    v.iter().map(|x| x.to_bits()).collect()
}

/// A `[out, in]` weight in `format`, and the dense weight it decodes to.
fn weights(out: usize, inp: usize, seed: u64, format: BlockFormat) -> (LayerWeight, LayerWeight) {
    let dense = var(&[out, inp], seed, 0.5).as_tensor().detach();
    let quantized = LayerWeight::quantize(&dense, format).unwrap();
    let decoded = LayerWeight::Dense(quantized.decoded().unwrap());
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
    let layer = |w: &LayerWeight, t: &[Tensor]| {
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
    let layer = |w: &LayerWeight| {
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

#[test]
fn rows_of_a_quantized_table_are_the_rows_of_its_values() {
    for format in [BlockFormat::Nf4, BlockFormat::Q8_0, BlockFormat::Q4K] {
        // Rows of 96 do not fill a block of 256 (Q4_K) or 16384 (NF4): rows share blocks.
        let (quantized, decoded) = weights(300, 96, 11, format);
        let ids = Tensor::new(&[0u32, 299, 7, 7, 150, 171], &candle_core::Device::Cpu).unwrap();
        let (got, want) = (quantized.rows(&ids).unwrap(), decoded.rows(&ids).unwrap());
        assert_eq!(bits(&got), bits(&want), "{format}");
        let past = Tensor::new(&[300u32], &candle_core::Device::Cpu).unwrap();
        assert!(quantized.rows(&past).is_err(), "{format}");
    }
}

/// The sliced head's loss and x's gradient against the dense fused head over the table's
/// values, and its log-probabilities and their gradient (under a random weighting).
#[test]
fn a_quantized_head_scores_as_the_dense_head_over_its_values() {
    // 4096 rows of x make slices of 2048 of the 5000 rows of the table: three, the last
    // one short.
    let (n, vocab, width) = (4096, 5000, 64);
    let (quantized, decoded) = weights(vocab, width, 21, BlockFormat::Nf4);
    let LayerWeight::Dense(table) = &decoded else {
        unreachable!("decoded is dense")
    };
    let x = var(&[n, width], 22, 1.0);
    let targets: Vec<u32> = (0..n as u32)
        .map(|i| {
            if i % 7 == 3 {
                IGNORE_INDEX
            } else {
                i.wrapping_mul(2654435761) % vocab as u32
            }
        })
        .collect();
    let targets = Tensor::new(targets.as_slice(), &candle_core::Device::Cpu).unwrap();
    for softcap in [None, Some(3.0)] {
        let loss = |w: &LayerWeight| {
            let loss =
                head_score(HeadScore::MeanLoss, x.as_tensor(), w, &targets, softcap).unwrap();
            let dx = loss.backward().unwrap().remove(x.as_tensor()).unwrap();
            (loss, dx)
        };
        let (got, got_dx) = loss(&quantized);
        let want = linear_cross_entropy(x.as_tensor(), table, &targets, softcap).unwrap();
        let want_dx = want.backward().unwrap().remove(x.as_tensor()).unwrap();
        let what = format!("softcap {softcap:?}");
        assert_close(&format!("loss, {what}"), &got, &want, Bound::Relative);
        assert_close(&format!("dx, {what}"), &got_dx, &want_dx, Bound::Relative);
        // The reference moves: the same head over the weight before quantization differs
        // from it by far more than the bound (50 to 150 times, by softcap).
        let before = dense_before_quantization(vocab, width, 21);
        let moved = linear_cross_entropy(x.as_tensor(), &before, &targets, softcap).unwrap();
        let bound = common::TOLERANCE * common::max_abs(&want);
        assert!(max_diff(&moved, &want) > 20.0 * bound, "{what}");

        let weighting = var(&[n], 23, 1.0).as_tensor().detach();
        let log_probs = |w: &dyn Fn(&Tensor) -> Tensor| {
            let lp = w(x.as_tensor());
            let dx = (&lp * &weighting)
                .unwrap()
                .sum_all()
                .unwrap()
                .backward()
                .unwrap();
            (lp, dx.get(x.as_tensor()).unwrap().clone())
        };
        let (got, got_dx) = log_probs(&|x| {
            head_score(HeadScore::LogProbs, x, &quantized, &targets, softcap).unwrap()
        });
        let (want, want_dx) =
            log_probs(&|x| linear_log_probs(x, table, &targets, softcap).unwrap());
        assert_close(&format!("log-probs, {what}"), &got, &want, Bound::Relative);
        assert_close(
            &format!("log-probs' dx, {what}"),
            &got_dx,
            &want_dx,
            Bound::Relative,
        );
    }
    // x in bf16 is scored in f32 and gets its gradient in bf16.
    let x16 = x.as_tensor().to_dtype(DType::BF16).unwrap();
    let loss = head_score(HeadScore::MeanLoss, &x16, &quantized, &targets, None).unwrap();
    let dx = loss.backward().unwrap().remove(x.as_tensor()).unwrap();
    assert_eq!((loss.dtype(), dx.dtype()), (DType::F32, DType::F32));
}

/// The dense weight [`weights`] quantizes for `seed`.
fn dense_before_quantization(out: usize, inp: usize, seed: u64) -> Tensor {
    var(&[out, inp], seed, 0.5).as_tensor().detach()
}
