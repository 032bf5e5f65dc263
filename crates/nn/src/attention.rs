//! Causal self-attention with its core fused: scores, causal mask, softmax and the weighted
//! sum are one op, and its backward recomputes the probabilities (nothing T x T is kept
//! between forward and backward).

use crate::attention_kernel::{self as kernel, Dims, Heads, Scores};
use crate::cpu::{as_f32, f32s, fused, new_in_chunks};
use crate::fused_op::{CpuOp, CpuOut, Fused, GradsOf, Input};
use crate::linear::{linear, Linear};
use crate::positions::Positions;
use candle_core::{CpuStorage, DType, Layout, Module, Result, Shape, Storage, Tensor, D};
use candle_nn::VarBuilder;

/// What an attention's scores go through besides the causal mask. The default is plain
/// causal attention scaled by `1/sqrt(head_dim)`.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct AttentionOptions {
    /// The scores' scale (default `1/sqrt(head_dim)`; Gemma 2's `query_pre_attn_scalar^-0.5`).
    pub scale: Option<f64>,
    /// Position i attends to positions `i - window + 1 ..= i` only (Mistral's and Gemma 2's
    /// `sliding_window`, as `transformers` masks it: `kv > q - window`).
    pub sliding_window: Option<usize>,
    /// Scaled scores `s` become `cap * tanh(s / cap)` before the mask (Gemma 2's
    /// `attn_logit_softcapping`).
    pub softcap: Option<f64>,
}

impl AttentionOptions {
    pub(crate) fn scores(&self, head_dim: usize, t: usize) -> Scores {
        Scores {
            scale: self
                .scale
                .map_or(1.0 / (head_dim as f32).sqrt(), |s| s as f32),
            window: self.sliding_window.unwrap_or(t).min(t),
            softcap: self.softcap.map(|c| c as f32),
        }
    }
}

/// softmax(q kᵀ / sqrt(d) + causal mask) v for `q` of shape `[batch, heads, time,
/// head_dim]` and `k`, `v` of shape `[batch, kv_heads, time, head_dim]`: position i attends
/// to positions 0..=i. With fewer key/value heads than query heads (grouped-query
/// attention), `kv_heads` divides `heads` and key/value head j serves query heads
/// `j*g .. (j+1)*g` for `g = heads / kv_heads`, as Hugging Face's `repeat_kv` maps them.
///
/// Fused on the CPU in f32; [`causal_attention_composite`] elsewhere. 16-bit inputs are
/// computed in f32 and the output rounded back.
pub fn causal_attention(q: &Tensor, k: &Tensor, v: &Tensor) -> Result<Tensor> {
    causal_attention_with(q, k, v, &AttentionOptions::default())
}

/// [`causal_attention`] with its scores scaled, windowed or capped as `options` say.
pub fn causal_attention_with(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    options: &AttentionOptions,
) -> Result<Tensor> {
    causal_attention_in_documents(q, k, v, options, None)
}

/// [`causal_attention_with`] over rows that hold several documents (a packed batch):
/// where `documents` is given, a position attends to the positions of its own document
/// only (a block-diagonal causal mask, windowed and capped within each block), so no
/// document sees another. The backward keeps to the same blocks.
pub fn causal_attention_in_documents(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    options: &AttentionOptions,
    documents: Option<&Positions>,
) -> Result<Tensor> {
    let (b, h, t, d) = q.dims4()?;
    if let Some(docs) = documents {
        docs.check("causal_attention", b, t)?;
    }
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
    if options.sliding_window == Some(0) {
        candle_core::bail!("causal_attention: a sliding window must hold at least one position")
    }
    let dtype = q.dtype();
    if dtype != DType::F32 {
        // 16-bit inputs: the softmax runs in f32, the output is rounded once.
        let (q, k, v) = (as_f32(q)?, as_f32(k)?, as_f32(v)?);
        return causal_attention_in_documents(&q, &k, &v, options, documents)?.to_dtype(dtype);
    }
    if !fused(&[q, k, v]) {
        return composite(q, k, v, options, documents);
    }
    // Read where they lie, as long as the head dimension is unit-strided.
    let unit = |x: &Tensor| match x.stride()[3] == 1 || d == 1 {
        true => Ok(x.clone()),
        false => x.contiguous(),
    };
    // Batch-major out of the op, handed back as [b, h, t, d].
    let op = Forward {
        options: *options,
        documents: documents.cloned(),
    };
    unit(q)?
        .apply_op3(&unit(k)?, &unit(v)?, Fused(op))?
        .transpose(1, 2)
}

/// [`causal_attention`] over the heads of a packed projection: `qkv` of shape `[batch,
/// time, 3 * heads * head_dim]` holds each row's queries, keys and values one after
/// another, each `heads` blocks of `head_dim` (what one linear layer of width
/// `3 * d_model` gives); the output is `[batch, time, heads * head_dim]`, what the output
/// projection reads. On the CPU in f32 neither the split into heads nor their merge copies
/// anything, and the gradient comes back packed in one buffer.
///
/// Where `documents` is given, attention keeps within each document, as
/// [`causal_attention_in_documents`].
pub fn causal_attention_packed(
    qkv: &Tensor,
    heads: usize,
    documents: Option<&Positions>,
) -> Result<Tensor> {
    let (b, t, width) = qkv.dims3()?;
    if heads == 0 || width % (3 * heads) != 0 {
        candle_core::bail!(
            "causal_attention_packed: rows of {width} do not split into q, k and v of {heads} heads"
        )
    }
    if let Some(docs) = documents {
        docs.check("causal_attention_packed", b, t)?;
    }
    let d = width / 3 / heads;
    if qkv.dtype() != DType::F32 {
        return causal_attention_packed(&as_f32(qkv)?, heads, documents)?.to_dtype(qkv.dtype());
    }
    if !fused(&[qkv]) {
        let part = |i: usize| {
            qkv.narrow(2, i * heads * d, heads * d)?
                .reshape((b, t, heads, d))?
                .transpose(1, 2)
        };
        let options = AttentionOptions::default();
        let out = composite(&part(0)?, &part(1)?, &part(2)?, &options, documents)?;
        return out.transpose(1, 2)?.reshape((b, t, heads * d));
    }
    let op = PackedForward {
        heads,
        documents: documents.cloned(),
    };
    qkv.contiguous()?.apply_op1(Fused(op))
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
    causal_attention_composite_with(q, k, v, &AttentionOptions::default())
}

/// [`causal_attention_with`] from Candle's basic ops, in `transformers`' eager order:
/// scale, cap, mask, softmax.
pub fn causal_attention_composite_with(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    options: &AttentionOptions,
) -> Result<Tensor> {
    composite(q, k, v, options, None)
}

/// [`causal_attention_in_documents`] from Candle's basic ops (the fallback, and the
/// reference in tests): the mask is block-diagonal where `documents` is given.
pub fn causal_attention_composite_in_documents(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    options: &AttentionOptions,
    documents: &Positions,
) -> Result<Tensor> {
    composite(q, k, v, options, Some(documents))
}

fn composite(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    options: &AttentionOptions,
    documents: Option<&Positions>,
) -> Result<Tensor> {
    // Candle's batched matmul takes standard layouts only (a head of a packed projection
    // is not one).
    let (q, k, v) = (&q.contiguous()?, &k.contiguous()?, &v.contiguous()?);
    let (b, h, t, d) = q.dims4()?;
    let groups = h / k.dim(1)?;
    let (k, v) = (repeat_kv(k, groups)?, repeat_kv(v, groups)?);
    let s = options.scores(d, t);
    // One [t, t] mask for every row, or one per row of documents.
    let rows = documents.map_or(1, |_| b);
    let mask: Vec<f32> = (0..rows * t * t)
        .map(|i| {
            let (row, i) = (i / (t * t), i % (t * t));
            let positions = documents.map(|p| p.row(row));
            match s.live_in(i / t, positions).contains(&(i % t)) {
                true => 0.0,
                false => f32::NEG_INFINITY,
            }
        })
        .collect();
    let mask = Tensor::from_vec(mask, (rows, 1, t, t), q.device())?.to_dtype(q.dtype())?;
    let mut scores = q.matmul(&k.t()?)?.affine(s.scale as f64, 0.0)?;
    if let Some(cap) = s.softcap {
        scores = (scores / cap as f64)?.tanh()?.affine(cap as f64, 0.0)?;
    }
    candle_nn::ops::softmax(&scores.broadcast_add(&mask)?, D::Minus1)?.matmul(&v)
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
        if n_head == 0 || !d_model.is_multiple_of(n_head) {
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
        let qkv = self.qkv.forward(x)?;
        self.proj
            .forward(&causal_attention_packed(&qkv, self.n_head, None)?)
    }
}

/// The sizes of an attention over `q` (`[b, h, t, d]`) and `k` (`[b, hkv, t, d]`).
fn dims(q: &Layout, k: &Layout, options: &AttentionOptions) -> Result<Dims> {
    let (b, h, t, d) = q.shape().dims4()?;
    let (_, hkv, _, _) = k.shape().dims4()?;
    let scores = options.scores(d, t);
    Ok(Dims {
        b,
        h,
        hkv,
        t,
        d,
        scores,
    })
}

/// (q, k, v) -> the output, batch-major (`[b, t, h, d]`).
struct Forward {
    options: AttentionOptions,
    documents: Option<Positions>,
}

impl CpuOp<3> for Forward {
    const NAME: &'static str = "wick-causal-attention";

    fn cpu(&self, inputs: [Input<'_>; 3]) -> CpuOut {
        let n = dims(inputs[0].1, inputs[1].1, &self.options)?;
        let [q, k, v] = blocks(Self::NAME, inputs)?;
        let out = kernel::forward(q, k, v, n, self.documents.as_ref());
        Ok((CpuStorage::F32(out), Shape::from((n.b, n.t, n.h, n.d))))
    }

    fn grads(&self, [q, k, v]: [&Tensor; 3], _res: &Tensor, grad: &Tensor) -> GradsOf<3> {
        let (b, h, t, d) = q.dims4()?;
        let hkv = k.dim(1)?;
        let (nq, nkv) = (q.elem_count(), k.elem_count());
        let backward = Backward {
            grad: grad.contiguous()?,
            options: self.options,
            documents: self.documents.clone(),
        };
        let all = q.apply_op3_no_bwd(k, v, &Fused(backward))?;
        // Batch-major buffers, handed back as [b, heads, t, d] views.
        let part = |start: usize, len: usize, heads: usize| {
            all.narrow(0, start, len)?
                .reshape((b, t, heads, d))?
                .transpose(1, 2)
        };
        Ok([
            Some(part(0, nq, h)?),
            Some(part(nq, nkv, hkv)?),
            Some(part(nq + nkv, nkv, hkv)?),
        ])
    }
}

/// The (batch, head) blocks of q, k and v where they lie.
fn blocks<'a>(op: &str, inputs: [Input<'a>; 3]) -> Result<[(&'a [f32], Heads); 3]> {
    let [(qs, ql), (ks, kl), (vs, vl)] = inputs;
    Ok([
        (qs.as_slice::<f32>()?, Heads::of(op, ql)?),
        (ks.as_slice::<f32>()?, Heads::of(op, kl)?),
        (vs.as_slice::<f32>()?, Heads::of(op, vl)?),
    ])
}

/// (q, k, v) and the output's gradient (batch-major) -> [dq, dk, dv], each batch-major,
/// end to end.
struct Backward {
    grad: Tensor,
    options: AttentionOptions,
    documents: Option<Positions>,
}

impl CpuOp<3> for Backward {
    const NAME: &'static str = "wick-causal-attention-backward";

    fn cpu(&self, inputs: [Input<'_>; 3]) -> CpuOut {
        let n = dims(inputs[0].1, inputs[1].1, &self.options)?;
        let name = Self::NAME;
        let (gs, gl) = self.grad.storage_and_layout();
        let Storage::Cpu(gs) = &*gs else {
            candle_core::bail!("{name}: the gradient must be on the cpu")
        };
        let [q, k, v] = blocks(name, inputs)?;
        let dout = (f32s(name, gs, gl)?, Heads::batch_major(n.t, n.h, n.d));
        let all = kernel::backward(q, k, v, dout, (n, self.documents.as_ref()));
        let len = all.len();
        Ok((CpuStorage::F32(all), Shape::from(len)))
    }
}

/// The three parts of a packed `qkv` (`[b, t, 3 * heads * d]`, contiguous) as blocks:
/// part i of head h starts at `i * heads * d + h * d` in each row.
fn packed(l: &Layout, heads: usize) -> Result<(Dims, [Heads; 3])> {
    let (b, t, width) = l.shape().dims3()?;
    let d = width / 3 / heads;
    let e = heads * d;
    let part = |i: usize| Heads {
        start: l.start_offset() + i * e,
        batch: t * width,
        head: d,
        row: width,
    };
    let n = Dims {
        b,
        h: heads,
        hkv: heads,
        t,
        d,
        scores: AttentionOptions::default().scores(d, t),
    };
    Ok((n, [part(0), part(1), part(2)]))
}

/// qkv -> the output, `[b, t, heads * d]`.
struct PackedForward {
    heads: usize,
    documents: Option<Positions>,
}

impl CpuOp<1> for PackedForward {
    const NAME: &'static str = "wick-causal-attention";

    fn cpu(&self, [(s, l)]: [Input<'_>; 1]) -> CpuOut {
        let (n, [q, k, v]) = packed(l, self.heads)?;
        let data = s.as_slice::<f32>()?;
        let docs = self.documents.as_ref();
        let out = kernel::forward((data, q), (data, k), (data, v), n, docs);
        Ok((CpuStorage::F32(out), Shape::from((n.b, n.t, n.h * n.d))))
    }

    fn grads(&self, [qkv]: [&Tensor; 1], _res: &Tensor, grad: &Tensor) -> GradsOf<1> {
        let op = Fused(PackedBackward {
            heads: self.heads,
            documents: self.documents.clone(),
        });
        Ok([Some(qkv.apply_op2_no_bwd(&grad.contiguous()?, &op)?)])
    }
}

/// (qkv, the output's gradient) -> d(qkv), packed as qkv is.
struct PackedBackward {
    heads: usize,
    documents: Option<Positions>,
}

impl CpuOp<2> for PackedBackward {
    const NAME: &'static str = "wick-causal-attention-backward";

    fn cpu(&self, [(s, l), (gs, gl)]: [Input<'_>; 2]) -> CpuOut {
        let (n, [q, k, v]) = packed(l, self.heads)?;
        let data = s.as_slice::<f32>()?;
        let dout = f32s(Self::NAME, gs, gl)?;
        let all = kernel::backward(
            (data, q),
            (data, k),
            (data, v),
            (dout, Heads::batch_major(n.t, n.h, n.d)),
            (n, self.documents.as_ref()),
        );
        // Interleave the three batch-major gradients into qkv's rows.
        let e = n.h * n.d;
        let rows = n.b * n.t;
        let dqkv = new_in_chunks(rows * 3 * e, 3 * e, |r, row| {
            for i in 0..3 {
                row[i * e..(i + 1) * e]
                    .copy_from_slice(&all[(i * rows + r) * e..(i * rows + r + 1) * e]);
            }
        });
        Ok((CpuStorage::F32(dqkv), l.shape().clone()))
    }
}
