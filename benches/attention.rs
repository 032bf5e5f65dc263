//! wick-nn's fused causal attention (forward and backward, grouped-query heads) against
//! its composite twin, at the throughput example's Llama shape: batch 2, 8 query and 4
//! key/value heads, sequence 256, head size 64. Both run in one process, on all cores.
//!
//! `cargo bench --bench attention`

// criterion's macros emit undocumented public items.
#![allow(missing_docs)]

use candle_core::{Device, Result, Tensor, Var};
use criterion::{criterion_group, criterion_main, Criterion};
use wick::nn::{causal_attention, causal_attention_composite, repeat_kv};

const GROUPS: usize = 2;

/// Forward, then backward to q, k and v, as a training step runs them.
fn step(q: &Var, k: &Var, v: &Var, fused: bool) -> Result<()> {
    let out = if fused {
        causal_attention(q, k, v)?
    } else {
        let (k, v) = (repeat_kv(k, GROUPS)?, repeat_kv(v, GROUPS)?);
        causal_attention_composite(q, &k, &v)?
    };
    let grads = out.sqr()?.sum_all()?.backward()?;
    assert!(grads.get(q).is_some());
    Ok(())
}

fn bench(c: &mut Criterion) {
    let dev = Device::Cpu;
    let make = |heads: usize| -> Var {
        Var::from_tensor(&Tensor::randn(0f32, 1.0, (2, heads, 256, 64), &dev).unwrap()).unwrap()
    };
    let (q, k, v) = (make(8), make(8 / GROUPS), make(8 / GROUPS));
    let mut group = c.benchmark_group("causal_attention_fwd_bwd");
    group.sample_size(20);
    group.bench_function("fused", |b| b.iter(|| step(&q, &k, &v, true).unwrap()));
    group.bench_function("composite", |b| b.iter(|| step(&q, &k, &v, false).unwrap()));
    group.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
