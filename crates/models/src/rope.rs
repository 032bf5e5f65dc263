//! A decoder's rotary tables: the inverse frequencies of each rope type, computed in f32
//! in the order `transformers`' `ROPE_INIT_FUNCTIONS` compute them (short windows hide a
//! frequency that is slightly wrong; a 2048-token window against `transformers` does not),
//! and, under a dynamic rope, tables made again for sequences past the model's length.

use crate::config::{DecoderConfig, Rope, RopeScaling};
use candle_core::{Device, Result};
use std::f64::consts::PI;
use std::sync::{Arc, Mutex};
use wick_nn::RotaryEmbedding;

/// The unscaled inverse frequencies `1 / theta^(2i / dim)`, in f32.
fn base_frequencies(theta: f64, dim: usize) -> Vec<f32> {
    let theta = theta as f32;
    (0..dim / 2)
        .map(|i| 1.0 / theta.powf((2 * i) as f32 / dim as f32))
        .collect()
}

/// The inverse frequencies of `rope` for heads `dim` wide and the attention factor of cos
/// and sin, for a model of `max_positions` positions run on `seq_len` tokens.
pub(crate) fn frequencies(
    rope: &Rope,
    dim: usize,
    max_positions: usize,
    seq_len: usize,
) -> (Vec<f32>, f32) {
    let inv = base_frequencies(rope.theta, dim);
    match rope.scaling {
        RopeScaling::Default => (inv, 1.0),
        RopeScaling::Linear { factor } => (inv.iter().map(|f| f / factor as f32).collect(), 1.0),
        RopeScaling::Dynamic { factor } => {
            // NTK-aware: the base grows with the length past the model's own.
            let len = seq_len.max(max_positions) as f64;
            let scaled = factor * len / max_positions as f64 - (factor - 1.0);
            let base = rope.theta * scaled.powf(dim as f64 / (dim as f64 - 2.0));
            (base_frequencies(base, dim), 1.0)
        }
        RopeScaling::Llama3 {
            factor,
            low_freq_factor,
            high_freq_factor,
            original_max_position_embeddings,
        } => {
            let bands = (low_freq_factor, high_freq_factor);
            let old = original_max_position_embeddings as f64;
            (llama3(&inv, factor, bands, old), 1.0)
        }
        RopeScaling::Yarn {
            factor,
            original_max_position_embeddings,
            attention_factor,
            beta_fast,
            beta_slow,
            truncate,
        } => {
            let old = original_max_position_embeddings as f64;
            let scaled = yarn(
                rope.theta,
                dim,
                factor,
                old,
                (beta_fast, beta_slow),
                truncate,
            );
            (scaled, attention_factor as f32)
        }
    }
}

/// What llama.cpp stores of a Llama 3 rope (`rope_freqs.weight`): each frequency's divisor,
/// the unscaled frequency over the scaled; `None` for another rope type.
pub(crate) fn llama3_divisors(rope: &Rope, dim: usize) -> Option<Vec<f32>> {
    let RopeScaling::Llama3 { .. } = rope.scaling else {
        return None;
    };
    let base = base_frequencies(rope.theta, dim);
    let (scaled, _) = frequencies(rope, dim, 0, 0);
    Some(base.iter().zip(&scaled).map(|(b, s)| b / s).collect())
}

/// Llama 3's frequencies from the unscaled `inv`: wavelengths shorter than the original
/// length `old` over `high_freq_factor` kept, longer than it over `low_freq_factor` divided
/// by `factor`, and a smooth blend between.
fn llama3(
    inv: &[f32],
    factor: f64,
    (low_freq_factor, high_freq_factor): (f64, f64),
    old: f64,
) -> Vec<f32> {
    let (low_wavelen, high_wavelen) = (
        (old / low_freq_factor) as f32,
        (old / high_freq_factor) as f32,
    );
    let (factor, band) = (factor as f32, (high_freq_factor - low_freq_factor) as f32);
    inv.iter()
        .map(|&f| {
            // torch's `2 * pi / f` is `f.reciprocal() * (2 pi)`.
            let wavelen = (1.0 / f) * (2.0 * PI) as f32;
            if wavelen < high_wavelen {
                f
            } else if wavelen > low_wavelen {
                f / factor
            } else {
                let smooth = ((1.0 / wavelen) * old as f32 - low_freq_factor as f32) / band;
                (1.0 - smooth) * f / factor + smooth * f
            }
        })
        .collect()
}

/// YaRN's frequencies for heads `dim` wide at base `theta`: extrapolated above the
/// correction range the betas give over the original length `old`, interpolated by
/// `factor` below it, ramped between.
fn yarn(
    theta: f64,
    dim: usize,
    factor: f64,
    old: f64,
    (beta_fast, beta_slow): (f64, f64),
    truncate: bool,
) -> Vec<f32> {
    let d = dim as f64;
    let correction = |rotations: f64| d * (old / (rotations * 2.0 * PI)).ln() / (2.0 * theta.ln());
    let (mut low, mut high) = (correction(beta_fast), correction(beta_slow));
    if truncate {
        (low, high) = (low.floor(), high.ceil());
    }
    let (low, mut high) = (low.max(0.0), high.min(d - 1.0));
    if low == high {
        high += 0.001;
    }
    let theta = theta as f32;
    (0..dim / 2)
        .map(|i| {
            let pos = theta.powf((2 * i) as f32 / dim as f32);
            let (extrapolated, interpolated) = (1.0 / pos, 1.0 / (factor as f32 * pos));
            let ramp = ((i as f32 - low as f32) / (high - low) as f32).clamp(0.0, 1.0);
            let keep = 1.0 - ramp;
            interpolated * (1.0 - keep) + extrapolated * keep
        })
        .collect()
}

/// The tables a decoder's layers share, made at the first forward for its length and
/// kept while they serve: tables of `n` positions serve any shorter sequence, except that
/// under a dynamic rope a sequence past the model's length has tables of its own.
pub(crate) struct RopeTables {
    rope: Rope,
    head_dim: usize,
    max_positions: usize,
    device: Device,
    /// The last tables made, the length they were made for, and whether that length was
    /// past a dynamic rope's `max_position_embeddings` (tables for that length only).
    made: Mutex<Option<(usize, bool, Arc<RotaryEmbedding>)>>,
}

impl RopeTables {
    pub(crate) fn new(c: &DecoderConfig, device: &Device) -> Self {
        RopeTables {
            rope: c.rope.clone(),
            head_dim: c.head_dim,
            max_positions: c.max_position_embeddings,
            device: device.clone(),
            made: Mutex::new(None),
        }
    }

    /// The tables for a sequence of `len` tokens.
    pub(crate) fn for_len(&self, len: usize) -> Result<Arc<RotaryEmbedding>> {
        let rescaled =
            matches!(self.rope.scaling, RopeScaling::Dynamic { .. }) && len > self.max_positions;
        let mut made = self.made.lock().unwrap_or_else(|e| e.into_inner());
        if let Some((n, was_rescaled, tables)) = &*made {
            let serves = match rescaled {
                true => *was_rescaled && *n == len,
                false => !*was_rescaled && *n >= len,
            };
            if serves {
                return Ok(tables.clone());
            }
        }
        let (inv, factor) = frequencies(&self.rope, self.head_dim, self.max_positions, len);
        let tables = Arc::new(RotaryEmbedding::from_frequencies(
            &inv,
            len,
            factor,
            &self.device,
        )?);
        *made = Some((len, rescaled, tables.clone()));
        Ok(tables)
    }
}
