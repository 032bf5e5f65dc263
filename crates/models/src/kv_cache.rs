//! The keys and values a model has computed for the positions it has seen, kept per
//! attention layer so that generation computes each new token's position only, as
//! `transformers`' `DynamicCache` does.

use candle_core::{Result, Tensor};
use wick_nn::{cached_attention, causal_attention_with, AttentionOptions};

/// Positions a layer's buffers grow by at least: a new token rarely reallocates.
const GROWTH: usize = 256;

/// The keys and values of one attention layer, in buffers of `[batch, kv_heads, capacity,
/// head_dim]` written up to `len`, which grow (by doubling) only when full: a new token
/// writes its position in place.
#[derive(Clone, Debug, Default)]
pub(crate) struct LayerCache {
    buffers: Option<(Tensor, Tensor)>,
    len: usize,
}

impl LayerCache {
    /// Attention of `q` over every position so far, once `k` and `v` of the new positions
    /// (`[batch, kv_heads, t, head_dim]`) are written after the cached ones. The first
    /// positions (an empty cache: the prompt) attend as the whole forward does.
    pub(crate) fn attend(
        &mut self,
        q: &Tensor,
        k: Tensor,
        v: Tensor,
        options: &AttentionOptions,
    ) -> Result<Tensor> {
        let first = self.len == 0;
        self.write(&k, &v)?;
        let (kb, vb) = self.buffers.as_ref().expect("written above");
        match first {
            true => causal_attention_with(q, &k, &v, options),
            false => cached_attention(q, kb, vb, self.len, options),
        }
    }

    /// `k` and `v` written at positions `len..len + t`, the buffers grown first if full.
    fn write(&mut self, k: &Tensor, v: &Tensor) -> Result<()> {
        let (b, hkv, t, d) = k.dims4()?;
        let capacity = self.buffers.as_ref().map_or(Ok(0), |(kb, _)| kb.dim(2))?;
        if self.len + t > capacity {
            let grown = (self.len + t).max(2 * capacity).max(GROWTH);
            let fresh = || Tensor::zeros((b, hkv, grown, d), k.dtype(), k.device());
            let (kb, vb) = (fresh()?, fresh()?);
            if let Some((old_k, old_v)) = &self.buffers {
                kb.slice_set(&old_k.narrow(2, 0, self.len)?.contiguous()?, 2, 0)?;
                vb.slice_set(&old_v.narrow(2, 0, self.len)?.contiguous()?, 2, 0)?;
            }
            self.buffers = Some((kb, vb));
        }
        let (kb, vb) = self.buffers.as_ref().expect("made above");
        kb.slice_set(&k.contiguous()?, 2, self.len)?;
        vb.slice_set(&v.contiguous()?, 2, self.len)?;
        self.len += t;
        Ok(())
    }
}

/// A model's cache of keys and values ([`crate::CausalLm::new_cache`]): what lets
/// [`crate::CausalLm::next_logits`] compute only the new positions. One cache serves one
/// sequence (or one batch of sequences of one length) from its first token on.
#[derive(Clone, Debug)]
pub struct KvCache {
    layers: Vec<LayerCache>,
    len: usize,
}

impl KvCache {
    /// An empty cache for a model of `layers` attention layers.
    pub(crate) fn new(layers: usize) -> Self {
        KvCache {
            layers: vec![LayerCache::default(); layers],
            len: 0,
        }
    }

    /// The positions the cache holds.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether it holds no position yet.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Each layer's part, for a forward over new positions; [`KvCache::advance`] after it.
    pub(crate) fn layers_mut(&mut self) -> &mut [LayerCache] {
        &mut self.layers
    }

    /// The forward over `t` new positions went through every layer: the cache holds them.
    /// (A forward that failed part way leaves the cache unusable: start a new one.)
    pub(crate) fn advance(&mut self, t: usize) {
        self.len += t;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::Device;

    /// Past its first buffer (it grows at 256 positions, then doubles), fed in uneven
    /// pieces, the cache attends as the whole sequence does: grouped heads, a window.
    #[test]
    fn a_growing_cache_attends_as_the_whole_sequence_does() {
        let dev = &Device::Cpu;
        let (h, hkv, t, d) = (4, 2, 600, 8);
        let q = Tensor::randn(0f32, 1.0, (1, h, t, d), dev).unwrap();
        let k = Tensor::randn(0f32, 1.0, (1, hkv, t, d), dev).unwrap();
        let v = Tensor::randn(0f32, 1.0, (1, hkv, t, d), dev).unwrap();
        for window in [None, Some(50)] {
            let options = AttentionOptions {
                sliding_window: window,
                ..AttentionOptions::default()
            };
            let whole = causal_attention_with(&q, &k, &v, &options).unwrap();
            let mut cache = LayerCache::default();
            let mut at = 0;
            for piece in [100, 1, 1, 150, 3, 1, 200, 144] {
                let part = |x: &Tensor| x.narrow(2, at, piece).unwrap();
                let out = cache
                    .attend(&part(&q), part(&k), part(&v), &options)
                    .unwrap();
                let want = whole.narrow(2, at, piece).unwrap();
                let diff = (out - want).and_then(|d| d.abs()?.max_all()?.to_scalar::<f32>());
                let diff = diff.unwrap();
                assert!(
                    diff < 1e-5,
                    "{window:?}: positions {at}..{} differ by {diff}",
                    at + piece
                );
                at += piece;
            }
            assert_eq!((at, cache.len), (t, t));
        }
    }
}
