//! The fused losses against the composite Candle ops of the same loss: the loss and every
//! input's gradient within 1e-5 of each tensor's size (f32), ignored targets, chunks of rows, frozen weights.

#[allow(dead_code)] // what the other test binary uses
mod common;

use candle_core::{DType, Device, Tensor, Var};
use common::{assert_close, check_within, max_diff, var, Bound};
use wick_nn::{
    cross_entropy, cross_entropy_composite, linear_cross_entropy, linear_cross_entropy_composite,
    linear_log_probs, linear_log_probs_composite, IGNORE_INDEX,
};

#[test]
fn cross_entropy_matches_the_composite() {
    for (rows, classes, seed) in [(37, 11, 10), (1, 3, 11), (256, 96, 12)] {
        let targets: Vec<u32> = (0..rows)
            .map(|i| ((i * 7 + seed) % classes) as u32)
            .collect();
        let targets = Tensor::new(targets, &Device::Cpu).unwrap();
        check_within(
            &format!("cross_entropy {rows}x{classes}"),
            &[var(&[rows, classes], seed as u64, 3.0)],
            |t| cross_entropy(&t[0], &targets),
            |t| cross_entropy_composite(&t[0], &targets),
            Bound::Relative,
        );
    }
}

#[test]
fn cross_entropy_counts_only_targets_that_are_not_ignored() {
    // Every third row ignored (a prompt's labels): the mean over the rest, and their
    // gradient alone, fused and composite alike.
    let (rows, classes) = (37, 11);
    let ids: Vec<u32> = (0..rows)
        .map(|i| match i % 3 {
            0 => IGNORE_INDEX,
            _ => ((i * 5) % classes) as u32,
        })
        .collect();
    let targets = Tensor::new(ids.clone(), &Device::Cpu).unwrap();
    let logits = var(&[rows, classes], 70, 3.0);
    check_within(
        "cross_entropy with ignored rows",
        std::slice::from_ref(&logits),
        |t| cross_entropy(&t[0], &targets),
        |t| cross_entropy_composite(&t[0], &targets),
        Bound::Relative,
    );
    // Equal to the mean over the counted rows alone.
    let kept: Vec<u32> = (0..rows as u32)
        .filter(|&i| ids[i as usize] != IGNORE_INDEX)
        .collect();
    let kept_idx = Tensor::new(kept.clone(), &Device::Cpu).unwrap();
    let kept_targets: Vec<u32> = kept.iter().map(|&i| ids[i as usize]).collect();
    let alone = cross_entropy(
        &logits.as_tensor().index_select(&kept_idx, 0).unwrap(),
        &Tensor::new(kept_targets, &Device::Cpu).unwrap(),
    )
    .unwrap();
    let masked = cross_entropy(logits.as_tensor(), &targets).unwrap();
    assert!(max_diff(&alone, &masked) <= 1e-6);
    // Every row ignored: 0, and no gradient.
    let none = Tensor::new(vec![IGNORE_INDEX; rows], &Device::Cpu).unwrap();
    let loss = cross_entropy(logits.as_tensor(), &none).unwrap();
    assert_eq!(loss.to_scalar::<f32>().unwrap(), 0.0);
    let grads = loss.backward().unwrap();
    let g = grads.get(logits.as_tensor()).unwrap();
    assert_eq!(
        g.abs()
            .unwrap()
            .sum_all()
            .unwrap()
            .to_scalar::<f32>()
            .unwrap(),
        0.0
    );
}

/// Targets for `rows` rows of `classes`, every `ignore_every`-th row (from 0) ignored.
fn some_ignored(rows: usize, classes: usize, ignore_every: usize) -> Tensor {
    let ids: Vec<u32> = (0..rows)
        .map(|i| match i % ignore_every {
            0 => IGNORE_INDEX,
            _ => ((i * 7919) % classes) as u32,
        })
        .collect();
    Tensor::new(ids, &Device::Cpu).unwrap()
}

/// The fused output projection `fused` (with a softcap or not) against its composite
/// reference: one chunk; a vocabulary so large that 300 rows take three chunks of 100; a
/// single row.
fn fused_matches_composite(
    name: &str,
    seed: u64,
    fused: impl Fn(&Tensor, &Tensor, &Tensor, Option<f64>) -> candle_core::Result<Tensor>,
    composite: impl Fn(&Tensor, &Tensor, &Tensor, Option<f64>) -> candle_core::Result<Tensor>,
) {
    for (i, (rows, hidden, vocab)) in [(37, 16, 11), (300, 24, 70_001), (1, 8, 5)]
        .into_iter()
        .enumerate()
    {
        let seed = seed + i as u64;
        for softcap in [None, Some(3.0)] {
            let targets = some_ignored(rows, vocab, 4);
            check_within(
                &format!("{name} {rows}x{hidden}x{vocab} cap {softcap:?}"),
                &[
                    var(&[rows, hidden], seed, 1.0),
                    var(&[vocab, hidden], seed + 100, 1.0),
                ],
                |t| fused(&t[0], &t[1], &targets, softcap),
                |t| composite(&t[0], &t[1], &targets, softcap),
                Bound::Relative,
            );
        }
    }
}

#[test]
fn linear_cross_entropy_matches_the_composite() {
    fused_matches_composite(
        "linear_cross_entropy",
        20,
        linear_cross_entropy,
        linear_cross_entropy_composite,
    );
}

#[test]
fn linear_log_probs_match_the_composite_row_by_row() {
    // Each row's log-probability and, back-propagating a different weight per row, every
    // gradient; ignored rows give 0.
    fused_matches_composite(
        "linear_log_probs",
        30,
        linear_log_probs,
        linear_log_probs_composite,
    );
    // The mean of the counted rows' log-probabilities is minus the cross-entropy.
    let (x, w) = (var(&[37, 16], 40, 1.0), var(&[11, 16], 41, 1.0));
    let targets = some_ignored(37, 11, 4);
    let log_probs = linear_log_probs(x.as_tensor(), w.as_tensor(), &targets, None).unwrap();
    let loss = linear_cross_entropy(x.as_tensor(), w.as_tensor(), &targets, None).unwrap();
    let sum = log_probs.sum_all().unwrap().to_scalar::<f32>().unwrap();
    let mean = -sum / 27.0;
    assert!((mean - loss.to_scalar::<f32>().unwrap()).abs() < 1e-5);
    let ignored = log_probs.get(0).unwrap().to_scalar::<f32>().unwrap();
    assert_eq!(ignored, 0.0);
}

#[test]
fn linear_cross_entropy_leaves_a_layer_weight_alone_and_makes_late_gradients_alike() {
    let (rows, hidden, vocab) = (300, 24, 70_001);
    let targets = some_ignored(rows, vocab, 5);
    let x = var(&[rows, hidden], 30, 1.0);
    let w = var(&[vocab, hidden], 31, 1.0);
    let frozen = w.as_tensor().detach();
    // A frozen weight (not a variable): the input's gradient only, as the composite's.
    let fused = linear_cross_entropy(x.as_tensor(), &frozen, &targets, None).unwrap();
    let composite = linear_cross_entropy_composite(x.as_tensor(), &frozen, &targets, None).unwrap();
    let (gf, gc) = (fused.backward().unwrap(), composite.backward().unwrap());
    assert!(gf.get(&frozen).is_none());
    assert_close(
        "the input's gradient",
        gf.get(&x).unwrap(),
        gc.get(&x).unwrap(),
        Bound::Relative,
    );
    // A forward under no_grad keeps no gradients; a backward after it makes them then,
    // scaled by the loss's incoming gradient, the same as a forward that kept them.
    let late = wick_core::no_grad(|| {
        linear_cross_entropy(x.as_tensor(), w.as_tensor(), &targets, Some(2.0)).unwrap()
    });
    let kept = linear_cross_entropy(x.as_tensor(), w.as_tensor(), &targets, Some(2.0)).unwrap();
    assert_eq!(
        late.to_scalar::<f32>().unwrap(),
        kept.to_scalar::<f32>().unwrap()
    );
    let (gl, gk) = (
        late.affine(0.5, 0.0).unwrap().backward().unwrap(),
        kept.affine(0.5, 0.0).unwrap().backward().unwrap(),
    );
    for v in [&x, &w] {
        assert_eq!(max_diff(gl.get(v).unwrap(), gk.get(v).unwrap()), 0.0);
    }
    // The same bits on one thread and on two.
    let on = |threads: usize| {
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(threads)
            .build()
            .unwrap();
        pool.install(|| {
            let loss = linear_cross_entropy(x.as_tensor(), w.as_tensor(), &targets, None).unwrap();
            let grads = loss.backward().unwrap();
            let dw = grads.get(&w).unwrap().flatten_all().unwrap();
            (
                loss.to_scalar::<f32>().unwrap(),
                dw.to_vec1::<f32>().unwrap(),
            )
        })
    };
    assert!(
        on(1) == on(2),
        "the result depends on the number of threads"
    );
    // Out-of-range targets and shapes that do not fit are errors.
    let bad = Tensor::new(vec![vocab as u32; rows], &Device::Cpu).unwrap();
    let e = linear_cross_entropy(x.as_tensor(), w.as_tensor(), &bad, None).unwrap_err();
    assert!(
        e.to_string().contains("is not below the 70001 classes"),
        "{e}"
    );
    let e = linear_cross_entropy(w.as_tensor(), x.as_tensor(), &targets, None).unwrap_err();
    assert!(e.to_string().contains("do not fit"), "{e}");
}

#[test]
fn linear_cross_entropy_fuses_16_bit_inputs_multiplied_in_f32() {
    // bf16-mixed and 16-mixed hand the loss 16-bit activations and weights: the fused op
    // multiplies them in f32 (the reference: the composite over the same values in f32),
    // returns an f32 loss, and hands each input its gradient in its own dtype.
    let (rows, hidden, vocab) = (64, 16, 5000);
    let targets = some_ignored(rows, vocab, 5);
    for (dtype, ulp) in [(DType::BF16, 1.0 / 128.0), (DType::F16, 1.0 / 1024.0)] {
        for softcap in [None, Some(3.0)] {
            let sixteen = |v: Var| Var::from_tensor(&v.to_dtype(dtype).unwrap()).unwrap();
            let (x, w) = (
                sixteen(var(&[rows, hidden], 30, 1.0)),
                sixteen(var(&[vocab, hidden], 31, 1.0)),
            );
            let f32_of = |v: &Var| Var::from_tensor(&v.to_dtype(DType::F32).unwrap()).unwrap();
            let (xr, wr) = (f32_of(&x), f32_of(&w));
            let fused = linear_cross_entropy(&x, &w, &targets, softcap).unwrap();
            let reference = linear_cross_entropy_composite(&xr, &wr, &targets, softcap).unwrap();
            assert_eq!(fused.dtype(), DType::F32);
            let what = format!("{dtype:?} cap {softcap:?}");
            assert_close(
                &format!("{what}: the loss"),
                &fused,
                &reference,
                Bound::Relative,
            );
            let (gf, gr) = (fused.backward().unwrap(), reference.backward().unwrap());
            for (input, input_f32, name) in [(&x, &xr, "x"), (&w, &wr, "weight")] {
                let got = gf.get(input).unwrap();
                assert_eq!(got.dtype(), dtype, "{what}: {name}'s gradient");
                let want = gr.get(input_f32).unwrap();
                // Both are the f32 gradient; the fused one is rounded to 16 bits once.
                let diff = max_diff(&got.to_dtype(DType::F32).unwrap(), want);
                let size = common::max_abs(want);
                assert!(
                    diff <= ulp * size,
                    "{what}: {name}'s gradient differs by {diff} of {size}"
                );
            }
        }
    }
}
