//! Rotary position embedding in Hugging Face's "rotate_half" layout: the first and second
//! halves of each head's vector are the two coordinates of its rotated pairs. Forward and
//! backward are each one pass; the backward is the rotation by the opposite angle.

use crate::cpu::{f32_inputs, fused, new_in_chunks};
use crate::fused_op::{CpuOp, CpuOut, Fused, GradsOf, Input};
use crate::positions::Positions;
use candle_core::{CpuStorage, DType, Device, Result, Tensor, D};

/// The cos and sin tables of a rotary embedding, one row per position, `head_dim` wide
/// (each frequency twice, as Hugging Face's `cat((freqs, freqs))`).
#[derive(Clone, Debug)]
pub struct RotaryEmbedding {
    cos: Tensor,
    sin: Tensor,
}

impl RotaryEmbedding {
    /// Tables for `max_positions` positions of heads `head_dim` wide (even), with base
    /// `theta` (`rope_theta`): frequency i is `theta^(-2i / head_dim)`. Computed in f32, as
    /// `transformers` computes them, so the angles round alike.
    pub fn new(head_dim: usize, max_positions: usize, theta: f64, device: &Device) -> Result<Self> {
        if head_dim == 0 || !head_dim.is_multiple_of(2) {
            candle_core::bail!("rotary embedding: head_dim {head_dim} must be even and positive")
        }
        let theta = theta as f32;
        let inv_freq: Vec<f32> = (0..head_dim / 2)
            .map(|i| 1.0 / theta.powf((2 * i) as f32 / head_dim as f32))
            .collect();
        Self::from_frequencies(&inv_freq, max_positions, 1.0, device)
    }

    /// Tables for `max_positions` positions from the inverse frequencies of each pair
    /// (`head_dim / 2` of them, as a scaled rope such as Llama 3's or YaRN computes them),
    /// cos and sin both times `attention_factor` (YaRN's; 1 otherwise), in f32 as
    /// `transformers` computes them.
    pub fn from_frequencies(
        inv_freq: &[f32],
        max_positions: usize,
        attention_factor: f32,
        device: &Device,
    ) -> Result<Self> {
        if inv_freq.is_empty() {
            candle_core::bail!("rotary embedding: no frequencies")
        }
        let head_dim = 2 * inv_freq.len();
        let mut cos = Vec::with_capacity(max_positions * head_dim);
        let mut sin = Vec::with_capacity(max_positions * head_dim);
        for p in 0..max_positions {
            let angles: Vec<f32> = inv_freq.iter().map(|f| p as f32 * f).collect();
            for _ in 0..2 {
                cos.extend(angles.iter().map(|a| a.cos() * attention_factor));
                sin.extend(angles.iter().map(|a| a.sin() * attention_factor));
            }
        }
        let shape = (max_positions, head_dim);
        Ok(RotaryEmbedding {
            cos: Tensor::from_vec(cos, shape, device)?,
            sin: Tensor::from_vec(sin, shape, device)?,
        })
    }

    /// The number of positions the tables cover.
    pub fn max_positions(&self) -> usize {
        self.cos.dims()[0]
    }

    /// `x` (`[batch, heads, time, head_dim]`, positions 0..time) rotated:
    /// `x * cos + rotate_half(x) * sin`. Fused on the CPU in f32; composite elsewhere.
    /// 16-bit inputs are rotated in f32 and rounded once.
    pub fn apply(&self, x: &Tensor) -> Result<Tensor> {
        self.apply_at(x, 0)
    }

    /// [`RotaryEmbedding::apply`] for positions `offset..offset + time`: the new positions
    /// after a cache of `offset` earlier ones (generation).
    pub fn apply_at(&self, x: &Tensor, offset: usize) -> Result<Tensor> {
        let (_, _, t, _) = x.dims4()?;
        self.check(x, offset + t)?;
        let (cos, sin) = (
            self.cos.narrow(0, offset, t)?,
            self.sin.narrow(0, offset, t)?,
        );
        self.rotate(x, (cos, sin), None)
    }

    /// [`RotaryEmbedding::apply`] with each token at its own position (a packed batch's,
    /// restarting at each document): row b's token i is rotated by the angles of
    /// `positions[b, i]`.
    pub fn apply_positions(&self, x: &Tensor, positions: &Positions) -> Result<Tensor> {
        let (b, _, t, _) = x.dims4()?;
        positions.check("rotary embedding", b, t)?;
        // Positions count up from 0 within a row, so none reaches t.
        self.check(x, t)?;
        let (cos, sin) = (self.cos.narrow(0, 0, t)?, self.sin.narrow(0, 0, t)?);
        self.rotate(x, (cos, sin), Some(positions))
    }

    /// Checks that the tables hold `len` positions of `x`'s head width.
    fn check(&self, x: &Tensor, len: usize) -> Result<()> {
        let d = x.dim(3)?;
        if len > self.max_positions() || d != self.cos.dims()[1] {
            candle_core::bail!(
                "rotary embedding: input {:?} needs {len} positions of width {d}; the tables \
                 hold at most {} positions of width {}",
                x.dims(),
                self.max_positions(),
                self.cos.dims()[1]
            )
        }
        Ok(())
    }

    /// `x` rotated by the rows of `cos` and `sin` (`[time, head_dim]`): row i for time i,
    /// or the row of each token's position where `positions` are given.
    fn rotate(
        &self,
        x: &Tensor,
        (cos, sin): (Tensor, Tensor),
        positions: Option<&Positions>,
    ) -> Result<Tensor> {
        let dtype = x.dtype();
        if dtype != DType::F32 {
            return self
                .rotate(&x.to_dtype(DType::F32)?, (cos, sin), positions)?
                .to_dtype(dtype);
        }
        if !fused(&[x, &cos]) {
            return match positions {
                None => rotary_composite(x, &cos, &sin),
                Some(p) => {
                    // [b, 1, t, d] tables, each row at its token's position.
                    let at = |table: &Tensor| -> Result<Tensor> {
                        let (b, t) = p.dims();
                        let rows = table.index_select(&p.tensor().flatten_all()?, 0)?;
                        rows.reshape((b, 1, t, table.dim(1)?))
                    };
                    rotary_composite(x, &at(&cos)?, &at(&sin)?)
                }
            };
        }
        let rotate = |time_dim| -> Result<Rotate> {
            Ok(Rotate {
                cos: cos.flatten_all()?.to_vec1()?,
                sin: sin.flatten_all()?.to_vec1()?,
                sign: 1.0,
                time_dim,
                positions: positions.cloned(),
            })
        };
        // Heads split off a projection ([b, t, heads, d] memory seen as [b, heads, t, d])
        // are rotated where they lie, and come back in the same order: no copy either way.
        let batch_major = x.transpose(1, 2)?;
        if batch_major.is_contiguous() {
            return batch_major.apply_op1(Fused(rotate(1)?))?.transpose(1, 2);
        }
        x.contiguous()?.apply_op1(Fused(rotate(2)?))
    }
}

/// `x * cos + rotate_half(x) * sin` from Candle's basic ops, for `cos` and `sin` of
/// `[time, head_dim]` (the fallback, and the reference in tests).
pub fn rotary_composite(x: &Tensor, cos: &Tensor, sin: &Tensor) -> Result<Tensor> {
    let half = x.dim(D::Minus1)? / 2;
    let rotated = Tensor::cat(
        &[
            &x.narrow(D::Minus1, half, half)?.neg()?,
            &x.narrow(D::Minus1, 0, half)?,
        ],
        D::Minus1,
    )?;
    x.broadcast_mul(cos)? + rotated.broadcast_mul(sin)?
}

/// The rotation of every position's pairs by its angles (`sign` -1: the opposite angles,
/// which is the rotation's backward), over a contiguous 4-D tensor whose time dimension is
/// `time_dim`: 2 for `[b, heads, t, d]`, 1 for `[b, t, heads, d]`.
struct Rotate {
    /// `[time, head_dim]`, row-major.
    cos: Vec<f32>,
    sin: Vec<f32>,
    sign: f32,
    time_dim: usize,
    /// Each token's row of the tables, where it is not its index along time.
    positions: Option<Positions>,
}

impl CpuOp<1> for Rotate {
    const NAME: &'static str = "wick-rotary";

    fn cpu(&self, inputs: [Input<'_>; 1]) -> CpuOut {
        let [x] = f32_inputs(Self::NAME, inputs)?;
        let shape = inputs[0].1.shape();
        let (_, n1, n2, d) = shape.dims4()?;
        let half = d / 2;
        // Rows of d per task: one (batch, dim-1) block of n2 rows.
        let block = n2 * d;
        let y = new_in_chunks(x.len(), block, |at, y| {
            let x = &x[at * block..at * block + y.len()];
            // Task `at` is (batch, time) or (batch, head): its batch is at / n1.
            let positions = self.positions.as_ref().map(|p| p.row(at / n1));
            for r in 0..n2 {
                // The row's time, then its position.
                let time = match self.time_dim {
                    1 => at % n1,
                    _ => r,
                };
                let p = positions.map_or(time, |p| p[time] as usize);
                let (cos, sin) = (&self.cos[p * d..], &self.sin[p * d..]);
                let (x, y) = (&x[r * d..(r + 1) * d], &mut y[r * d..(r + 1) * d]);
                for i in 0..half {
                    let s = self.sign * sin[i];
                    let (a, b) = (x[i], x[i + half]);
                    y[i] = a * cos[i] - b * s;
                    y[i + half] = b * cos[i + half] + a * self.sign * sin[i + half];
                }
            }
        });
        Ok((CpuStorage::F32(y), shape.clone()))
    }

    fn grads(&self, _: [&Tensor; 1], _res: &Tensor, grad: &Tensor) -> GradsOf<1> {
        let back = Rotate {
            cos: self.cos.clone(),
            sin: self.sin.clone(),
            sign: -self.sign,
            time_dim: self.time_dim,
            positions: self.positions.clone(),
        };
        Ok([Some(grad.contiguous()?.apply_op1_no_bwd(&Fused(back))?)])
    }
}
