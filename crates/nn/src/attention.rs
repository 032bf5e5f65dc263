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

/// softmax(q kᵀ / sqrt(d) + causal mask) v for `q`, `k`, `v` of shape
/// `[batch, heads, time, head_dim]`: position i attends to positions 0..=i.
///
/// Fused on the CPU in f32; [`causal_attention_composite`] elsewhere. 16-bit inputs are
/// computed in f32 and the output rounded back.
pub fn causal_attention(q: &Tensor, k: &Tensor, v: &Tensor) -> Result<Tensor> {
    let dims = q.dims4()?;
    if k.dims4()? != dims || v.dims4()? != dims {
        candle_core::bail!(
            "causal_attention: q {:?}, k {:?} and v {:?} must have one shape",
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

/// The same attention from Candle's basic ops (the fallback, and the reference in tests).
pub fn causal_attention_composite(q: &Tensor, k: &Tensor, v: &Tensor) -> Result<Tensor> {
    let (_, _, t, d) = q.dims4()?;
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
    candle_nn::ops::softmax(&scores, D::Minus1)?.matmul(v)
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

/// One (batch, head) block's sizes.
fn block_dims(l: &Layout) -> Result<(usize, usize)> {
    let (_, _, t, d) = l.shape().dims4()?;
    Ok((t, d))
}

/// Row i's probabilities over positions 0..=i into `p` (length i + 1).
fn probabilities(q_i: &[f32], k: &[f32], d: usize, scale: f32, p: &mut [f32]) {
    let mut max = f32::NEG_INFINITY;
    for (j, pj) in p.iter_mut().enumerate() {
        let k_j = &k[j * d..(j + 1) * d];
        *pj = scale * q_i.iter().zip(k_j).map(|(a, b)| a * b).sum::<f32>();
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
        let (t, d) = block_dims(ql)?;
        let (q, k, v) = (
            f32s(self.name(), qs, ql)?,
            f32s(self.name(), ks, kl)?,
            f32s(self.name(), vs, vl)?,
        );
        let scale = 1.0 / (d as f32).sqrt();
        let mut out = vec![0f32; q.len()];
        let block = t * d;
        // One task per (batch, head) block.
        out.par_chunks_mut(block).enumerate().for_each(|(n, o)| {
            let (q, k, v) = (&q[n * block..], &k[n * block..], &v[n * block..]);
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
        let n = q.elem_count();
        let all = q.apply_op3_no_bwd(
            k,
            v,
            &Backward {
                grad: grad.contiguous()?,
            },
        )?;
        let part = |i: usize| all.narrow(0, i * n, n)?.reshape(q.shape());
        Ok((Some(part(0)?), Some(part(1)?), Some(part(2)?)))
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
        let (t, d) = block_dims(ql)?;
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
        let len = q.len();
        let mut all = vec![0f32; 3 * len];
        let (dq, rest) = all.split_at_mut(len);
        let (dk, dv) = rest.split_at_mut(len);
        let block = t * d;
        let blocks = dq
            .par_chunks_mut(block)
            .zip(dk.par_chunks_mut(block))
            .zip(dv.par_chunks_mut(block))
            .enumerate();
        // One task per (batch, head) block.
        blocks.for_each(|(n, ((dq, dk), dv))| {
            let at = n * block..(n + 1) * block;
            let (q, k, v) = (&q[at.clone()], &k[at.clone()], &v[at.clone()]);
            let dout = &dout[at];
            let (mut p, mut dp) = (vec![0f32; t], vec![0f32; t]);
            for i in 0..t {
                let (p, dp) = (&mut p[..=i], &mut dp[..=i]);
                let q_i = &q[i * d..(i + 1) * d];
                probabilities(q_i, k, d, scale, p);
                let do_i = &dout[i * d..(i + 1) * d];
                // dP_ij = dO_i . v_j; dV_j += p_ij dO_i.
                let mut weighted = 0f32;
                for j in 0..=i {
                    let v_j = &v[j * d..(j + 1) * d];
                    dp[j] = do_i.iter().zip(v_j).map(|(a, b)| a * b).sum();
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
        });
        Ok((CpuStorage::F32(all), Shape::from(3 * len)))
    }
}
