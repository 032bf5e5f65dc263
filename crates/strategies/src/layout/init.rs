//! Counter-based parameter initialisation.
//!
//! Element `i` of parameter `name` is a pure function of `(seed, name, i)`, so a rank can make
//! its slice of a parameter without the rest, and the assembled parameter is bit-identical for
//! every world size and strategy. Uniform values use 24 random bits (exactly representable in
//! f32); normal values use Box-Muller over two 53-bit uniforms, computed in f64.

use candle_core::Shape;
use candle_nn::init::NormalOrUniform;
use candle_nn::Init;
use std::ops::Range;
use wick_core::{splitmix64, BlockFormat, BlockRead, ParamInit};

fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, &b| {
        (h ^ b as u64).wrapping_mul(0x0000_0100_0000_01b3)
    })
}

/// The random stream of one parameter: element `i`'s draws depend only on the key and `i`.
#[derive(Debug, Clone, Copy)]
pub struct ParamRng {
    key: u64,
}

impl ParamRng {
    /// The stream for parameter `name` under `seed`.
    pub fn new(seed: u64, name: &str) -> Self {
        ParamRng {
            key: splitmix64(seed ^ splitmix64(fnv1a(name.as_bytes()))),
        }
    }

    fn bits(&self, counter: u64) -> u64 {
        splitmix64(self.key ^ splitmix64(counter))
    }

    /// Uniform in [0, 1) with 24 bits, for element `i`.
    pub fn uniform(&self, i: u64) -> f64 {
        (self.bits(2 * i) >> 40) as f64 / (1u64 << 24) as f64
    }

    /// Standard normal for element `i`.
    pub fn normal(&self, i: u64) -> f64 {
        let u1 = ((self.bits(2 * i) >> 11) + 1) as f64 / (1u64 << 53) as f64;
        let u2 = (self.bits(2 * i + 1) >> 11) as f64 / (1u64 << 53) as f64;
        (-2.0 * u1.ln()).sqrt() * (2.0 * std::f64::consts::PI * u2).cos()
    }
}

/// The values of elements `range` (row-major) of parameter `name`: drawn from its
/// initializer, or read from pretrained weights.
pub fn param_values(
    init: &ParamInit,
    seed: u64,
    name: &str,
    shape: &Shape,
    range: Range<usize>,
) -> candle_core::Result<Vec<f32>> {
    match init {
        ParamInit::Init(init) => Ok(init_values(init, seed, name, shape, range)),
        ParamInit::Weights(weights) => weights.read(name, shape, range),
    }
}

/// The stored blocks in `format` that hold elements `range` of parameter `name` (at block
/// boundaries): as pretrained weights hold them where they keep `name` in `format` (a GGUF
/// file's own blocks, taken as they are), or quantized from its values (an NF4 weight's
/// offset from `range`'s own absmaxes: the whole weight's only when `range` is all of it).
pub fn param_blocks(
    init: &ParamInit,
    seed: u64,
    (name, shape): (&str, &Shape),
    format: BlockFormat,
    range: Range<usize>,
) -> candle_core::Result<Vec<u8>> {
    if let ParamInit::Weights(weights) = init {
        let read = BlockRead {
            name,
            shape,
            format,
            range: range.clone(),
        };
        if let Some(blocks) = weights.read_blocks(&read)? {
            let want = format.stored_len(range.len());
            if blocks.len() != want {
                candle_core::bail!(
                    "parameter '{name}': the weights gave {} bytes of {format} blocks for \
                     elements {range:?}, not {want}",
                    blocks.len()
                )
            }
            return Ok(blocks);
        }
    }
    let values = param_values(init, seed, name, shape, range)?;
    format.quantize(&values, None)
}

/// The values of elements `range` (row-major) of parameter `name` with `shape` and `init`.
pub fn init_values(
    init: &Init,
    seed: u64,
    name: &str,
    shape: &Shape,
    range: Range<usize>,
) -> Vec<f32> {
    let rng = ParamRng::new(seed, name);
    let idx = range.map(|i| i as u64);
    match *init {
        Init::Const(c) => idx.map(|_| c as f32).collect(),
        Init::Uniform { lo, up } => idx
            .map(|i| (lo + (up - lo) * rng.uniform(i)) as f32)
            .collect(),
        Init::Randn { mean, stdev } => idx.map(|i| (mean + stdev * rng.normal(i)) as f32).collect(),
        Init::Kaiming {
            dist,
            fan,
            non_linearity,
        } => {
            let std = non_linearity.gain() / (fan.for_shape(shape) as f64).sqrt();
            match dist {
                NormalOrUniform::Uniform => {
                    let bound = 3f64.sqrt() * std;
                    idx.map(|i| (-bound + 2.0 * bound * rng.uniform(i)) as f32)
                        .collect()
                }
                NormalOrUniform::Normal => idx.map(|i| (std * rng.normal(i)) as f32).collect(),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn any_slice_matches_the_whole() {
        let shape = Shape::from((7, 13));
        for init in [
            candle_nn::init::DEFAULT_KAIMING_NORMAL,
            Init::Uniform { lo: -0.5, up: 0.5 },
        ] {
            let whole = init_values(&init, 3, "w", &shape, 0..91);
            let parts: Vec<f32> = [0..20, 20..23, 23..91]
                .into_iter()
                .flat_map(|r| init_values(&init, 3, "w", &shape, r))
                .collect();
            assert_eq!(whole, parts);
        }
    }

    #[test]
    fn names_and_seeds_change_the_values() {
        let shape = Shape::from(64);
        let init = Init::Randn {
            mean: 0.0,
            stdev: 1.0,
        };
        let a = init_values(&init, 1, "a", &shape, 0..64);
        assert_ne!(a, init_values(&init, 1, "b", &shape, 0..64));
        assert_ne!(a, init_values(&init, 2, "a", &shape, 0..64));
    }

    #[test]
    fn normal_has_the_right_moments() {
        let shape = Shape::from(20_000);
        let v = init_values(
            &Init::Randn {
                mean: 1.0,
                stdev: 2.0,
            },
            0,
            "n",
            &shape,
            0..20_000,
        );
        let mean = v.iter().map(|&x| x as f64).sum::<f64>() / v.len() as f64;
        let var = v.iter().map(|&x| (x as f64 - mean).powi(2)).sum::<f64>() / v.len() as f64;
        assert!((mean - 1.0).abs() < 0.05, "mean {mean}");
        assert!((var.sqrt() - 2.0).abs() < 0.05, "std {}", var.sqrt());
    }
}
