//! The fused attention and rotary embedding against the composite Candle ops of the same
//! layers: outputs and every input's gradient within 1e-5 (f32), on random inputs, odd
//! sizes, windows, documents packed in a row, strided heads and grouped queries.

use candle_core::{Device, Tensor};
use wick_nn::{
    causal_attention, causal_attention_composite, causal_attention_composite_in_documents,
    causal_attention_composite_with, causal_attention_in_documents, causal_attention_packed,
    causal_attention_with, rotary_composite, AttentionOptions, Positions, RotaryEmbedding,
};

#[allow(dead_code)] // what the other test binaries use
mod common;

use common::{check, max_diff, var};

/// The fused attention against the composite under each of `options`, on grouped-query
/// heads (4 query, 2 key/value) of `seq` positions, with scores big enough that a cap
/// bends them; inputs drawn from `seed` on.
fn each_option_matches(
    name: &str,
    (seq, seed): (usize, u64),
    options: &[AttentionOptions],
    fused: impl Fn(&[Tensor], &AttentionOptions) -> candle_core::Result<Tensor>,
    composite: impl Fn(&[Tensor], &AttentionOptions) -> candle_core::Result<Tensor>,
) {
    for (i, options) in options.iter().enumerate() {
        let seed = seed + 3 * i as u64;
        let q = var(&[2, 4, seq, 8], seed, 3.0);
        let (k, v) = (
            var(&[2, 2, seq, 8], seed + 1, 3.0),
            var(&[2, 2, seq, 8], seed + 2, 1.0),
        );
        check(
            &format!("{name} {options:?}"),
            &[q, k, v],
            |t| fused(t, options),
            |t| composite(t, options),
        );
    }
}

#[test]
fn windowed_scaled_and_capped_attention_matches_the_composite() {
    // Mistral's window (shorter than the sequence, and longer), Gemma 2's scale and cap
    // together, over grouped-query heads.
    let options = [
        AttentionOptions {
            sliding_window: Some(5),
            ..Default::default()
        },
        AttentionOptions {
            sliding_window: Some(64),
            ..Default::default()
        },
        AttentionOptions {
            scale: Some(0.3),
            sliding_window: Some(4),
            softcap: Some(2.0),
        },
    ];
    each_option_matches(
        "attention",
        (17, 50),
        &options,
        |t, o| causal_attention_with(&t[0], &t[1], &t[2], o),
        |t, o| causal_attention_composite_with(&t[0], &t[1], &t[2], o),
    );
    // A window as long as the sequence is plain causal attention.
    let t: Vec<Tensor> = (0..3)
        .map(|i| var(&[1, 2, 9, 4], 60 + i, 1.0).as_tensor().clone())
        .collect();
    let windowed = AttentionOptions {
        sliding_window: Some(9),
        ..Default::default()
    };
    let a = causal_attention_with(&t[0], &t[1], &t[2], &windowed).unwrap();
    let b = causal_attention(&t[0], &t[1], &t[2]).unwrap();
    assert_eq!(max_diff(&a, &b), 0.0);
}

/// Rows of documents of the given lengths, one after another: the positions of each.
fn documents(rows: &[&[usize]]) -> Positions {
    let of: Vec<Vec<u32>> = rows
        .iter()
        .map(|lens| lens.iter().flat_map(|&n| 0..n as u32).collect())
        .collect();
    Positions::new(&Tensor::new(of, &Device::Cpu).unwrap()).unwrap()
}

#[test]
fn attention_within_documents_matches_the_composite() {
    // Documents of one token, of several, one as long as the row; windows shorter than a
    // document and longer; Gemma 2's scale and cap; grouped-query heads.
    let docs = documents(&[&[4, 1, 6, 2], &[13]]);
    let options = [
        AttentionOptions::default(),
        AttentionOptions {
            sliding_window: Some(3),
            ..Default::default()
        },
        AttentionOptions {
            scale: Some(0.3),
            sliding_window: Some(5),
            softcap: Some(2.0),
        },
    ];
    each_option_matches(
        "attention in documents",
        (13, 70),
        &options,
        |t, o| causal_attention_in_documents(&t[0], &t[1], &t[2], o, Some(&docs)),
        |t, o| causal_attention_composite_in_documents(&t[0], &t[1], &t[2], o, &docs),
    );
    // GPT-2's packed projection.
    let (b, h, t, d) = (2, 3, 13, 4);
    let part = |qkv: &Tensor, i: usize| {
        qkv.narrow(2, i * h * d, h * d)?
            .reshape((b, t, h, d))?
            .transpose(1, 2)
    };
    let plain = AttentionOptions::default();
    check(
        "packed attention in documents",
        &[var(&[b, t, 3 * h * d], 80, 1.0)],
        |x| causal_attention_packed(&x[0], h, Some(&docs)),
        |x| {
            let (q, k, v) = (part(&x[0], 0)?, part(&x[0], 1)?, part(&x[0], 2)?);
            let out = causal_attention_composite_in_documents(&q, &k, &v, &plain, &docs)?;
            out.transpose(1, 2)?.reshape((b, t, h * d))
        },
    );
}

#[test]
fn a_packed_row_attends_and_rotates_as_its_documents_alone() {
    // Each document's outputs in the packed row against the document run on its own: the
    // same numbers (within summation order), windowed, for the attention and the rotary
    // embedding at restarted positions.
    let lens = [5usize, 1, 7, 3];
    let t: usize = lens.iter().sum();
    let docs = documents(&[&lens]);
    let options = AttentionOptions {
        sliding_window: Some(4),
        ..Default::default()
    };
    let rope = RotaryEmbedding::new(8, 32, 10_000.0, &Device::Cpu).unwrap();
    let [q, k, v] = [90, 91, 92].map(|s| var(&[1, 2, t, 8], s, 2.0).as_tensor().clone());
    let (qr, kr) = (
        rope.apply_positions(&q, &docs).unwrap(),
        rope.apply_positions(&k, &docs).unwrap(),
    );
    let packed = causal_attention_in_documents(&qr, &kr, &v, &options, Some(&docs)).unwrap();
    let mut start = 0;
    for n in lens {
        let alone = |x: &Tensor| x.narrow(2, start, n).unwrap();
        let (qa, ka) = (
            rope.apply(&alone(&q)).unwrap(),
            rope.apply(&alone(&k)).unwrap(),
        );
        assert!(
            max_diff(&alone(&qr), &qa) <= 1e-6,
            "rotary of document at {start}"
        );
        let want = causal_attention_with(&qa, &ka, &alone(&v), &options).unwrap();
        let diff = max_diff(&alone(&packed), &want);
        assert!(diff <= 1e-6, "document at {start}: {diff}");
        start += n;
    }
    // Without documents the same row attends across them: the check above can fail.
    let across = causal_attention_with(&qr, &kr, &v, &options).unwrap();
    assert!(max_diff(&across, &packed) > 1e-2);
}

#[test]
fn rotary_at_positions_matches_the_composite() {
    let docs = documents(&[&[3, 9, 5], &[17]]);
    let rope = RotaryEmbedding::new(6, 40, 10_000.0, &Device::Cpu).unwrap();
    let (cos, sin) = tables(6, 17, 10_000.0);
    let at = |table: &Tensor, row: usize| {
        table
            .index_select(&docs.tensor().get(row).unwrap(), 0)
            .unwrap()
    };
    for (name, split) in [("contiguous", false), ("split heads", true)] {
        check(
            &format!("rotary at positions, {name}"),
            &[var(&[2, 17, 3, 6], 95, 2.0)],
            |x| match split {
                true => rope.apply_positions(&x[0].transpose(1, 2)?, &docs),
                false => rope.apply_positions(&x[0].transpose(1, 2)?.contiguous()?, &docs),
            },
            |x| {
                let x = x[0].transpose(1, 2)?.contiguous()?;
                let rows: Vec<Tensor> = (0..2)
                    .map(|b| rotary_composite(&x.narrow(0, b, 1)?, &at(&cos, b), &at(&sin, b)))
                    .collect::<candle_core::Result<_>>()?;
                Tensor::cat(&rows, 0)
            },
        );
    }
}

#[test]
fn attention_reads_strided_heads_and_packed_projections() {
    // (batch, heads, time, head_dim): q, k and v as the heads of one packed projection
    // ([b, t, 3 * heads * d]), read in place by both entry points.
    for (b, h, t, d, seed) in [(2, 3, 17, 8, 31), (1, 2, 64, 16, 32), (1, 1, 1, 4, 33)] {
        let qkv = [var(&[b, t, 3 * h * d], seed, 1.0)];
        let part = |qkv: &Tensor, i: usize| {
            qkv.narrow(2, i * h * d, h * d)
                .and_then(|p| p.reshape((b, t, h, d)))
                .and_then(|p| p.transpose(1, 2))
        };
        let merged = |out: Tensor| out.transpose(1, 2)?.reshape((b, t, h * d));
        check(
            &format!("packed attention b={b} h={h} t={t} d={d}"),
            &qkv,
            |x| causal_attention_packed(&x[0], h, None),
            |x| {
                let (q, k, v) = (part(&x[0], 0)?, part(&x[0], 1)?, part(&x[0], 2)?);
                merged(causal_attention_composite(&q, &k, &v)?)
            },
        );
        check(
            &format!("strided attention b={b} h={h} t={t} d={d}"),
            &qkv,
            |x| {
                merged(causal_attention(
                    &part(&x[0], 0)?,
                    &part(&x[0], 1)?,
                    &part(&x[0], 2)?,
                )?)
            },
            |x| {
                let (q, k, v) = (part(&x[0], 0)?, part(&x[0], 1)?, part(&x[0], 2)?);
                merged(causal_attention_composite(&q, &k, &v)?)
            },
        );
    }
}

#[test]
fn causal_and_grouped_query_attention_match_the_composite() {
    // (batch, query heads, key/value heads, time, head_dim): as many key/value heads as
    // query heads (one position, and a 64-long sequence among them), 2 and 3 query heads
    // per key/value head, one key/value head for all, and a batch of one.
    for (b, h, hkv, t, d, seed) in [
        (2, 3, 3, 17, 8, 7),
        (1, 1, 1, 1, 4, 8),
        (1, 4, 4, 64, 32, 9),
        (2, 4, 2, 13, 8, 21),
        (1, 6, 2, 9, 4, 22),
        (3, 3, 1, 5, 6, 23),
        (1, 2, 1, 1, 2, 24),
    ] {
        let inputs = [
            var(&[b, h, t, d], seed, 1.0),
            var(&[b, hkv, t, d], seed + 1, 1.0),
            var(&[b, hkv, t, d], seed + 2, 1.0),
        ];
        check(
            &format!("attention b={b} h={h} kv={hkv} t={t} d={d}"),
            &inputs,
            |t| causal_attention(&t[0], &t[1], &t[2]),
            |t| causal_attention_composite(&t[0], &t[1], &t[2]),
        );
    }
}

#[test]
fn rotary_embedding_matches_the_composite() {
    for (shape, seed) in [
        (vec![2, 3, 17, 8], 41),
        (vec![1, 1, 1, 2], 42),
        (vec![1, 4, 64, 6], 43),
    ] {
        let (t, d) = (shape[2], shape[3]);
        let rope = RotaryEmbedding::new(d, 80, 10_000.0, &Device::Cpu).unwrap();
        let (cos, sin) = tables(d, t, 10_000.0);
        check(
            &format!("rotary {shape:?}"),
            &[var(&shape, seed, 2.0)],
            |x| rope.apply(&x[0]),
            |x| rotary_composite(&x[0], &cos, &sin),
        );
        // The heads of a projection: [b, t, heads, d] memory seen as [b, heads, t, d].
        let (b, h) = (shape[0], shape[1]);
        check(
            &format!("rotary of split heads {shape:?}"),
            &[var(&[b, t, h, d], seed + 100, 2.0)],
            |x| rope.apply(&x[0].transpose(1, 2)?),
            |x| rotary_composite(&x[0].transpose(1, 2)?.contiguous()?, &cos, &sin),
        );
    }
}

/// cos and sin of `[t, d]` for base `theta`, computed here independently of the op.
fn tables(d: usize, t: usize, theta: f32) -> (Tensor, Tensor) {
    let mut cos = Vec::new();
    let mut sin = Vec::new();
    for p in 0..t {
        for i in 0..d {
            let f = 1.0 / theta.powf((2 * (i % (d / 2))) as f32 / d as f32);
            cos.push((p as f32 * f).cos());
            sin.push((p as f32 * f).sin());
        }
    }
    let shape = (t, d);
    (
        Tensor::from_vec(cos, shape, &Device::Cpu).unwrap(),
        Tensor::from_vec(sin, shape, &Device::Cpu).unwrap(),
    )
}
