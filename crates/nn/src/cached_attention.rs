//! Attention of new positions over a cache of keys and values (generation): the cache's
//! buffers are read where they lie, past their written length masked, and each key/value
//! head serves its group of query heads in place, so a new token costs one pass over the
//! cache and no copy of it.

use crate::attention::AttentionOptions;
use crate::cpu::as_f32;
use candle_core::{DType, Result, Tensor, D};

/// softmax(q kᵀ · scale + mask) v for `q` of `[batch, heads, t, head_dim]`, the last `t` of
/// `len` positions, over the first `len` positions of `k` and `v` (`[batch, kv_heads,
/// capacity, head_dim]`, a cache's buffers written up to `len`): query i attends to
/// positions up to `len - t + i`, within the window and soft cap of `options`, as
/// [`crate::causal_attention_with`] attends over a whole sequence. Key/value head j serves
/// query heads `j*g .. (j+1)*g` (`g = heads / kv_heads`), as Hugging Face's `repeat_kv` maps
/// them. 16-bit inputs are computed in f32 and the output rounded back.
pub fn cached_attention(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    len: usize,
    options: &AttentionOptions,
) -> Result<Tensor> {
    let (b, h, t, d) = q.dims4()?;
    let (_, hkv, capacity, _) = k.dims4()?;
    if v.dims4()? != k.dims4()? || k.dims4()? != (b, hkv, capacity, d) || hkv == 0 || h % hkv != 0 {
        candle_core::bail!(
            "cached_attention: q {:?} needs k and v of [batch, kv_heads, capacity, head_dim] \
             with kv_heads dividing its heads; got k {:?} and v {:?}",
            q.dims(),
            k.dims(),
            v.dims()
        )
    }
    if t == 0 || len < t || len > capacity || options.sliding_window == Some(0) {
        candle_core::bail!(
            "cached_attention: {t} new positions of {len} do not fit a cache of {capacity} \
             (or the window is empty)"
        )
    }
    let dtype = q.dtype();
    if dtype != DType::F32 {
        let (q, k, v) = (as_f32(q)?, as_f32(k)?, as_f32(v)?);
        return cached_attention(&q, &k, &v, len, options)?.to_dtype(dtype);
    }
    let g = h / hkv;
    // Query heads grouped under their key/value head: [b, hkv, g * t, d], row r is query
    // position r % t.
    let grouped = q.contiguous()?.reshape((b, hkv, g * t, d))?;
    let s = options.scores(d, len);
    // The written positions only, read where they lie (each head's rows are contiguous).
    let (k, v) = (k.narrow(2, 0, len)?, v.narrow(2, 0, len)?);
    let mut scores = grouped.matmul(&k.t()?)?.affine(s.scale as f64, 0.0)?;
    if let Some(cap) = s.softcap {
        scores = (scores / cap as f64)?.tanh()?.affine(cap as f64, 0.0)?;
    }
    let first = len - t;
    // One new position with every earlier one in its window: nothing to mask.
    if t == 1 && s.live(first).start == 0 {
        return candle_nn::ops::softmax(&scores, D::Minus1)?
            .matmul(&v)?
            .reshape((b, h, t, d));
    }
    let mask: Vec<f32> = (0..g * t * len)
        .map(|i| {
            let (row, key) = (i / len, i % len);
            match s.live(first + row % t).contains(&key) {
                true => 0.0,
                false => f32::NEG_INFINITY,
            }
        })
        .collect();
    let mask = Tensor::from_vec(mask, (g * t, len), q.device())?;
    candle_nn::ops::softmax(&scores.broadcast_add(&mask)?, D::Minus1)?
        .matmul(&v)?
        .reshape((b, h, t, d))
}
