//! The fused causal attention's CPU kernels: for each (batch, head) block the scores
//! `scale q kᵀ` are one matrix product, the causal softmax runs over each row's live part
//! in vectorised exponentials, and the weighted sum is a second product; backward
//! recomputes the probabilities and makes the four gradients' products the same way. The
//! products run on the GEMM Candle's matmul uses, one sequential call per block, so a
//! block's sums go in the same order on any number of threads; batch elements run in
//! parallel on the calling thread's rayon pool.
//!
//! Inputs are read where they lie through their strides (only the head dimension must be
//! unit-strided): the heads of a packed `qkv` projection need no copy. Outputs and
//! gradients are written batch-major, `[batch, time, heads, head_dim]`, the order the
//! output projection reads.

use crate::cpu::new_in_chunks;
use crate::gemm::Threads::One;
use crate::positions::Positions;
use crate::vector_math;
use candle_core::{Layout, Result};
use rayon::prelude::*;

/// Where a `[batch, heads, time, head_dim]` tensor keeps its blocks: block (b, h) starts at
/// `start + b * batch + h * head`, its rows `row` apart, its head dimension unit-strided.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Heads {
    pub(crate) start: usize,
    pub(crate) batch: usize,
    pub(crate) head: usize,
    pub(crate) row: usize,
}

impl Heads {
    /// The blocks of a tensor of shape `[b, h, t, d]` laid out as `l` says.
    pub(crate) fn of(op: &str, l: &Layout) -> Result<Heads> {
        let (_, _, _, d) = l.shape().dims4()?;
        let s = l.stride();
        if d > 1 && s[3] != 1 {
            candle_core::bail!("{op}: the head dimension must be unit-strided, got strides {s:?}")
        }
        Ok(Heads {
            start: l.start_offset(),
            batch: s[0],
            head: s[1],
            row: s[2],
        })
    }

    /// A fresh batch-major buffer's blocks: `[b, t, heads, d]`.
    pub(crate) fn batch_major(t: usize, heads: usize, d: usize) -> Heads {
        Heads {
            start: 0,
            batch: t * heads * d,
            head: d,
            row: heads * d,
        }
    }

    /// Block (b, h)'s rows in `data`: the slice from its first element, and the row stride.
    fn block<'a>(&self, data: &'a [f32], b: usize, h: usize) -> (&'a [f32], usize) {
        (
            &data[self.start + b * self.batch + h * self.head..],
            self.row,
        )
    }
}

/// The sizes of an attention (batch, query heads, key/value heads, time, head dimension)
/// and what its scores go through: the scale, the causal window, the soft cap.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Dims {
    pub(crate) b: usize,
    pub(crate) h: usize,
    pub(crate) hkv: usize,
    pub(crate) t: usize,
    pub(crate) d: usize,
    pub(crate) scores: Scores,
}

/// How a block's scores are made from `q kᵀ`: `scale` times, capped to `cap tanh(s / cap)`
/// when `softcap` is set, and row i attends to the `window` positions up to i.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Scores {
    pub(crate) scale: f32,
    pub(crate) window: usize,
    pub(crate) softcap: Option<f32>,
}

impl Scores {
    /// The positions row i attends to.
    pub(crate) fn live(&self, i: usize) -> std::ops::Range<usize> {
        (i + 1).saturating_sub(self.window)..i + 1
    }

    /// The positions row i attends to when `positions` (the row's, in their documents)
    /// are given: no further back than the start of its document.
    pub(crate) fn live_in(&self, i: usize, positions: Option<&[u32]>) -> std::ops::Range<usize> {
        let live = self.live(i);
        match positions {
            Some(p) => live.start.max(i - p[i] as usize)..live.end,
            None => live,
        }
    }
}

impl Dims {
    fn groups(&self) -> usize {
        self.h / self.hkv
    }
}

/// The attention's output, batch-major (`[b, t, h, d]`); within documents where
/// `documents` gives each token's position in its own.
pub(crate) fn forward(
    q: (&[f32], Heads),
    k: (&[f32], Heads),
    v: (&[f32], Heads),
    n: Dims,
    documents: Option<&Positions>,
) -> Vec<f32> {
    let Dims { h, t, d, .. } = n;
    new_in_chunks(n.b * t * h * d, t * h * d, |b, out| {
        let mut p = vec![0f32; t * t];
        let mut tanh = vec![0f32; if n.scores.softcap.is_some() { t * t } else { 0 }];
        let row = documents.map(|d| d.row(b));
        for head in 0..h {
            let kv = head / n.groups();
            let (q_b, k_b) = (q.1.block(q.0, b, head), k.1.block(k.0, b, kv));
            probabilities(q_b, k_b, (n, row), &mut p, &mut tanh);
            let v = v.1.block(v.0, b, kv);
            One.matmul(
                t,
                d,
                t,
                (&mut out[head * d..], h * d),
                false,
                (&p, t, 1),
                (v.0, v.1, 1),
                1.0,
            );
        }
    })
}

/// The gradients of `q`, `k` and `v` given the output's (`dout`), each batch-major:
/// `[b, t, h, d]`, `[b, t, hkv, d]`, `[b, t, hkv, d]`, end to end in one buffer.
pub(crate) fn backward(
    q: (&[f32], Heads),
    k: (&[f32], Heads),
    v: (&[f32], Heads),
    dout: (&[f32], Heads),
    (n, documents): (Dims, Option<&Positions>),
) -> Vec<f32> {
    let Dims { h, hkv, t, d, .. } = n;
    let (len_q, len_kv) = (n.b * t * h * d, n.b * t * hkv * d);
    let mut all = vec![0f32; len_q + 2 * len_kv];
    let (dq, rest) = all.split_at_mut(len_q);
    let (dk, dv) = rest.split_at_mut(len_kv);
    let scale = n.scores.scale;
    let tasks = dq
        .par_chunks_mut(t * h * d)
        .zip(dk.par_chunks_mut(t * hkv * d))
        .zip(dv.par_chunks_mut(t * hkv * d))
        .enumerate();
    tasks.for_each(|(b, ((dq, dk), dv))| {
        let (mut p, mut ds) = (vec![0f32; t * t], vec![0f32; t * t]);
        // With a soft cap, tanh of each capped score, for the cap's derivative 1 - tanh².
        let mut tanh = vec![0f32; if n.scores.softcap.is_some() { t * t } else { 0 }];
        let row = documents.map(|d| d.row(b));
        // Each key/value head's query heads one after another, so that their dK and dV
        // add up in one task, in head order.
        for kv in 0..hkv {
            let (k_b, v_b) = (k.1.block(k.0, b, kv), v.1.block(v.0, b, kv));
            for head in kv * n.groups()..(kv + 1) * n.groups() {
                let q_b = q.1.block(q.0, b, head);
                let dout_b = dout.1.block(dout.0, b, head);
                probabilities(q_b, k_b, (n, row), &mut p, &mut tanh);
                // dV += Pᵀ dO; dP = dO Vᵀ (into `ds`).
                let dv_b = (&mut dv[kv * d..], hkv * d);
                One.matmul(
                    t,
                    d,
                    t,
                    dv_b,
                    true,
                    (&p, 1, t),
                    (dout_b.0, dout_b.1, 1),
                    1.0,
                );
                let (ds_all, ds_rs) = (&mut ds[..], t);
                One.matmul(
                    t,
                    t,
                    d,
                    (ds_all, ds_rs),
                    false,
                    (dout_b.0, dout_b.1, 1),
                    (v_b.0, 1, v_b.1),
                    1.0,
                );
                // dS_ij = scale p_ij (dP_ij - sum_k p_ik dP_ik): zero where p is; times
                // 1 - tanh² under a soft cap.
                for (p, ds) in p.chunks_exact(t).zip(ds.chunks_exact_mut(t)) {
                    let weighted = vector_math::dot(p, ds);
                    for (ds, &p) in ds.iter_mut().zip(p) {
                        *ds = scale * p * (*ds - weighted);
                    }
                }
                if n.scores.softcap.is_some() {
                    for (ds, th) in ds.iter_mut().zip(&tanh) {
                        *ds *= 1.0 - th * th;
                    }
                }
                // dQ = dS K; dK += dSᵀ Q.
                let dq_b = (&mut dq[head * d..], h * d);
                One.matmul(t, d, t, dq_b, false, (&ds, t, 1), (k_b.0, k_b.1, 1), 1.0);
                let dk_b = (&mut dk[kv * d..], hkv * d);
                One.matmul(t, d, t, dk_b, true, (&ds, 1, t), (q_b.0, q_b.1, 1), 1.0);
            }
        }
    });
    all
}

/// The causal probabilities of one block into `p` (`t x t`, row-major): row i is
/// `softmax(s_ij)` over the j of its window (within its document, where the row's
/// `positions` are given), and zero elsewhere, for the scores `s` that `n.scores` makes.
/// Under a soft cap, `tanh` (`t x t`) gets each live score's tanh.
fn probabilities(
    q: (&[f32], usize),
    k: (&[f32], usize),
    (n, positions): (Dims, Option<&[u32]>),
    p: &mut [f32],
    tanh: &mut [f32],
) {
    let Dims { t, d, scores, .. } = n;
    // p = scale q kᵀ: k is read transposed through its strides.
    One.matmul(
        t,
        t,
        d,
        (p, t),
        false,
        (q.0, q.1, 1),
        (k.0, 1, k.1),
        scores.scale,
    );
    for (i, row) in p.chunks_exact_mut(t).enumerate() {
        let live = scores.live_in(i, positions);
        if let Some(cap) = scores.softcap {
            // Gemma 2's cap: the scaled score through cap tanh(s / cap), in torch's order.
            let tanh = &mut tanh[i * t..(i + 1) * t];
            for j in live.clone() {
                let th = (row[j] / cap).tanh();
                tanh[j] = th;
                row[j] = th * cap;
            }
        }
        let (before, rest) = row.split_at_mut(live.start);
        let (live, after) = rest.split_at_mut(live.len());
        let max = vector_math::max(live);
        let inv = 1.0 / vector_math::exp_shifted_sum(live, max);
        for x in live.iter_mut() {
            *x *= inv;
        }
        before.fill(0.0);
        after.fill(0.0);
    }
}
