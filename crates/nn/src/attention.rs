//! Causal self-attention with its core fused: scores, causal mask, softmax and the weighted
//! sum are one op, and its backward recomputes the probabilities (nothing T x T is kept
//! between forward and backward).

use crate::cpu::{as_f32, f32s, fused};
use crate::linear::{linear, Linear};
use candle_core::{
    CpuStorage, CustomOp3, DType, Layout, Module, Result, Shape, Storage, Tensor, D,
};
use candle_nn::VarBuilder;
use rayon::prelude::*;

/// softmax(q kᵀ / sqrt(d) + causal mask) v for `q` of shape `[batch, heads, time,
/// head_dim]` and `k`, `v` of shape `[batch, kv_heads, time, head_dim]`: position i attends
/// to positions 0..=i. With fewer key/value heads than query heads (grouped-query
/// attention), `kv_heads` divides `heads` and key/value head j serves query heads
/// `j*g .. (j+1)*g` for `g = heads / kv_heads`, as Hugging Face's `repeat_kv` maps them.
///
/// Fused on the CPU in f32; [`causal_attention_composite`] elsewhere. 16-bit inputs are
/// computed in f32 and the output rounded back.
pub fn causal_attention(q: &Tensor, k: &Tensor, v: &Tensor) -> Result<Tensor> {
    let (b, h, t, d) = q.dims4()?;
    let kv_dims = k.dims4()?;
    let (_, hkv, _, _) = kv_dims;
    if v.dims4()? != kv_dims || kv_dims != (b, hkv, t, d) || hkv == 0 || h % hkv != 0 {
        candle_core::bail!(
            "causal_attention: q {:?} needs k and v of [batch, kv_heads, time, head_dim] with \
             kv_heads dividing its heads; got k {:?} and v {:?}",
            q.dims(),
            k.dims(),
            v.dims()
        )
    }
    let dtype = q.dtype();
    if dtype != DType::F32 {
        // 16-bit inputs: the softmax runs in f32, the output is rounded once.
        return causal_attention(&as_f32(q)?, &as_f32(k)?, &as_f32(v)?)?.to_dtype(dtype);
    }
    match fused(&[q, k, v]) {
        true => q
            .contiguous()?
            .apply_op3(&k.contiguous()?, &v.contiguous()?, Forward),
        false => causal_attention_composite(q, k, v),
    }
}

/// Each key/value head repeated for the query heads it serves: `[b, hkv, t, d]` to
/// `[b, hkv * groups, t, d]` (Hugging Face's `repeat_kv`).
pub fn repeat_kv(x: &Tensor, groups: usize) -> Result<Tensor> {
    if groups == 1 {
        return Ok(x.clone());
    }
    let (b, hkv, t, d) = x.dims4()?;
    x.unsqueeze(2)?
        .broadcast_as((b, hkv, groups, t, d))?
        .reshape((b, hkv * groups, t, d))
}

/// The same attention from Candle's basic ops (the fallback, and the reference in tests).
pub fn causal_attention_composite(q: &Tensor, k: &Tensor, v: &Tensor) -> Result<Tensor> {
    let (_, h, t, d) = q.dims4()?;
    let groups = h / k.dim(1)?;
    let (k, v) = (repeat_kv(k, groups)?, repeat_kv(v, groups)?);
    let mask: Vec<f32> = (0..t * t)
        .map(|i| {
            if i % t > i / t {
                f32::NEG_INFINITY
            } else {
                0.0
            }
        })
        .collect();
    let mask = Tensor::from_vec(mask, (t, t), q.device())?.to_dtype(q.dtype())?;
    let scores = (q.matmul(&k.t()?)? / (d as f64).sqrt())?.broadcast_add(&mask)?;
    candle_nn::ops::softmax(&scores, D::Minus1)?.matmul(&v)
}

/// Multi-head causal self-attention: one [`Linear`] `qkv` projection, [`causal_attention`], and
/// the output projection.
#[derive(Clone, Debug)]
pub struct CausalSelfAttention {
    qkv: Linear,
    proj: Linear,
    n_head: usize,
}

impl CausalSelfAttention {
    /// Attention over `d_model` wide inputs with `n_head` heads; weights `qkv` and `proj`
    /// from `vb` (as candle-nn's `linear` makes them).
    pub fn new(d_model: usize, n_head: usize, vb: VarBuilder) -> Result<Self> {
        if n_head == 0 || d_model % n_head != 0 {
            candle_core::bail!("attention: {n_head} heads do not divide width {d_model}")
        }
        Ok(CausalSelfAttention {
            qkv: linear(d_model, 3 * d_model, vb.pp("qkv"))?,
            proj: linear(d_model, d_model, vb.pp("proj"))?,
            n_head,
        })
    }
}

impl Module for CausalSelfAttention {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let (b, t, c) = x.dims3()?;
        let hd = c / self.n_head;
        let qkv = self.qkv.forward(x)?.reshape((b, t, 3, self.n_head, hd))?;
        let head = |i| {
            qkv.narrow(2, i, 1)?
                .squeeze(2)?
                .transpose(1, 2)?
                .contiguous()
        };
        let out = causal_attention(&head(0)?, &head(1)?, &head(2)?)?;
        self.proj.forward(&out.transpose(1, 2)?.reshape((b, t, c))?)
    }
}

/// One (batch, head) block's sizes, and the query heads per key/value head.
fn block_dims(q: &Layout, k: &Layout) -> Result<(usize, usize, usize)> {
    let (_, h, t, d) = q.shape().dims4()?;
    let (_, hkv, _, _) = k.shape().dims4()?;
    Ok((t, d, h / hkv))
}

/// `a . b` with eight running sums, added in a fixed order at the end: a plain
/// `zip().sum()` is one sequential chain of float adds, which the compiler may not
/// reorder, so it cannot use SIMD lanes; this form vectorises and stays deterministic.
fn dot(a: &[f32], b: &[f32]) -> f32 {
    const LANES: usize = 8;
    let mut acc = [0f32; LANES];
    let (a8, b8) = (a.chunks_exact(LANES), b.chunks_exact(LANES));
    let tail: f32 = a8
        .remainder()
        .iter()
        .zip(b8.remainder())
        .map(|(x, y)| x * y)
        .sum();
    for (x, y) in a8.zip(b8) {
        for l in 0..LANES {
            acc[l] += x[l] * y[l];
        }
    }
    let pairs = [
        acc[0] + acc[4],
        acc[1] + acc[5],
        acc[2] + acc[6],
        acc[3] + acc[7],
    ];
    (pairs[0] + pairs[2]) + (pairs[1] + pairs[3]) + tail
}

/// Row i's probabilities over positions 0..=i into `p` (length i + 1).
fn probabilities(q_i: &[f32], k: &[f32], d: usize, scale: f32, p: &mut [f32]) {
    let mut max = f32::NEG_INFINITY;
    for (j, pj) in p.iter_mut().enumerate() {
        let k_j = &k[j * d..(j + 1) * d];
        *pj = scale * dot(q_i, k_j);
        max = max.max(*pj);
    }
    let mut sum = 0f32;
    for pj in p.iter_mut() {
        *pj = (*pj - max).exp();
        sum += *pj;
    }
    for pj in p.iter_mut() {
        *pj /= sum;
    }
}

struct Forward;

impl CustomOp3 for Forward {
    fn name(&self) -> &'static str {
        "wick-causal-attention"
    }

    fn cpu_fwd(
        &self,
        qs: &CpuStorage,
        ql: &Layout,
        ks: &CpuStorage,
        kl: &Layout,
        vs: &CpuStorage,
        vl: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        let (t, d, groups) = block_dims(ql, kl)?;
        let (q, k, v) = (
            f32s(self.name(), qs, ql)?,
            f32s(self.name(), ks, kl)?,
            f32s(self.name(), vs, vl)?,
        );
        let scale = 1.0 / (d as f32).sqrt();
        let mut out = vec![0f32; q.len()];
        let block = t * d;
        // One task per (batch, query head) block; query head n reads key/value head
        // n / groups (the query heads of a batch element are consecutive, so are its
        // key/value heads).
        out.par_chunks_mut(block).enumerate().for_each(|(n, o)| {
            let kv = n / groups;
            let (q, k, v) = (&q[n * block..], &k[kv * block..], &v[kv * block..]);
            let mut p = vec![0f32; t];
            for i in 0..t {
                let p = &mut p[..=i];
                probabilities(&q[i * d..(i + 1) * d], k, d, scale, p);
                let o_i = &mut o[i * d..(i + 1) * d];
                for (j, &pj) in p.iter().enumerate() {
                    for (o, v) in o_i.iter_mut().zip(&v[j * d..(j + 1) * d]) {
                        *o += pj * v;
                    }
                }
            }
        });
        Ok((CpuStorage::F32(out), ql.shape().clone()))
    }

    fn bwd(
        &self,
        q: &Tensor,
        k: &Tensor,
        v: &Tensor,
        _res: &Tensor,
        grad: &Tensor,
    ) -> Result<(Option<Tensor>, Option<Tensor>, Option<Tensor>)> {
        let (nq, nkv) = (q.elem_count(), k.elem_count());
        let all = q.apply_op3_no_bwd(
            k,
            v,
            &Backward {
                grad: grad.contiguous()?,
            },
        )?;
        Ok((
            Some(all.narrow(0, 0, nq)?.reshape(q.shape())?),
            Some(all.narrow(0, nq, nkv)?.reshape(k.shape())?),
            Some(all.narrow(0, nq + nkv, nkv)?.reshape(k.shape())?),
        ))
    }
}

/// (q, k, v) and the output's gradient -> [dq, dk, dv] end to end.
struct Backward {
    grad: Tensor,
}

impl CustomOp3 for Backward {
    fn name(&self) -> &'static str {
        "wick-causal-attention-backward"
    }

    fn cpu_fwd(
        &self,
        qs: &CpuStorage,
        ql: &Layout,
        ks: &CpuStorage,
        kl: &Layout,
        vs: &CpuStorage,
        vl: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        let (t, d, groups) = block_dims(ql, kl)?;
        let (q, k, v) = (
            f32s(self.name(), qs, ql)?,
            f32s(self.name(), ks, kl)?,
            f32s(self.name(), vs, vl)?,
        );
        let (gs, gl) = self.grad.storage_and_layout();
        let Storage::Cpu(gs) = &*gs else {
            candle_core::bail!("{}: the gradient must be on the cpu", self.name())
        };
        let dout = f32s(self.name(), gs, gl)?;
        let scale = 1.0 / (d as f32).sqrt();
        let (len_q, len_kv) = (q.len(), k.len());
        let mut all = vec![0f32; len_q + 2 * len_kv];
        let (dq, rest) = all.split_at_mut(len_q);
        let (dk, dv) = rest.split_at_mut(len_kv);
        let block = t * d;
        // One task per (batch, key/value head): its query heads (consecutive blocks of q)
        // one after another, so that their dK and dV add up in one task, in head order.
        let tasks = dq
            .par_chunks_mut(groups * block)
            .zip(dk.par_chunks_mut(block))
            .zip(dv.par_chunks_mut(block))
            .enumerate();
        tasks.for_each(|(m, ((dq, dk), dv))| {
            let kv = m * block..(m + 1) * block;
            let (k, v) = (&k[kv.clone()], &v[kv]);
            let (mut p, mut dp) = (vec![0f32; t], vec![0f32; t]);
            for (r, dq) in dq.chunks_exact_mut(block).enumerate() {
                let at = (m * groups + r) * block..(m * groups + r + 1) * block;
                let (q, dout) = (&q[at.clone()], &dout[at]);
                for i in 0..t {
                    let (p, dp) = (&mut p[..=i], &mut dp[..=i]);
                    let q_i = &q[i * d..(i + 1) * d];
                    probabilities(q_i, k, d, scale, p);
                    let do_i = &dout[i * d..(i + 1) * d];
                    // dP_ij = dO_i . v_j; dV_j += p_ij dO_i.
                    let mut weighted = 0f32;
                    for j in 0..=i {
                        let v_j = &v[j * d..(j + 1) * d];
                        dp[j] = dot(do_i, v_j);
                        weighted += p[j] * dp[j];
                        for (dv, g) in dv[j * d..(j + 1) * d].iter_mut().zip(do_i) {
                            *dv += p[j] * g;
                        }
                    }
                    // dS_ij = p_ij (dP_ij - sum_k p_ik dP_ik); dQ_i, dK_j from it.
                    let dq_i = &mut dq[i * d..(i + 1) * d];
                    for j in 0..=i {
                        let ds = p[j] * (dp[j] - weighted) * scale;
                        let k_j = &k[j * d..(j + 1) * d];
                        for (dq, kv) in dq_i.iter_mut().zip(k_j) {
                            *dq += ds * kv;
                        }
                        for (dk, qv) in dk[j * d..(j + 1) * d].iter_mut().zip(q_i) {
                            *dk += ds * qv;
                        }
                    }
                }
            }
        });
        Ok((CpuStorage::F32(all), Shape::from(len_q + 2 * len_kv)))
    }
}
