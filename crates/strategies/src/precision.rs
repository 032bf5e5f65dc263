//! Mixed precision for sharded strategies: f32 master shards, gathered compute copies in
//! `param_dtype`, gradients reduced in `reduce_dtype`, the optimizer stepping f32 shards.

use candle_core::DType;
use wick_core::{Error, Result};

/// The dtypes of a mixed-precision run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MixedPrecision {
    /// The dtype units are gathered and computed in.
    pub param_dtype: DType,
    /// The dtype gradients are reduced in.
    pub reduce_dtype: DType,
}

impl MixedPrecision {
    /// Lightning's precision names.
    pub const NAMES: &'static [&'static str] = &["32", "bf16-mixed", "16-mixed"];

    /// `None` for full f32 (`32`), otherwise the mixed precision `name` stands for.
    pub fn from_name(name: &str) -> Result<Option<Self>> {
        let half = |dtype| {
            Some(MixedPrecision {
                param_dtype: dtype,
                reduce_dtype: dtype,
            })
        };
        match name {
            "32" => Ok(None),
            "bf16-mixed" => Ok(half(DType::BF16)),
            "16-mixed" => Ok(half(DType::F16)),
            other => Err(Error::config(
                "precision",
                format!(
                    "unknown precision '{other}'; valid: {}",
                    Self::NAMES.join(", ")
                ),
            )),
        }
    }
}

/// The dtypes in force: `precision`, or f32 for both.
pub(crate) fn dtypes(precision: Option<MixedPrecision>) -> (DType, DType) {
    precision.map_or((DType::F32, DType::F32), |p| {
        (p.param_dtype, p.reduce_dtype)
    })
}
