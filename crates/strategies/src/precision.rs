//! Mixed precision for sharded strategies: f32 master shards, gathered compute copies in
//! `param_dtype`, gradients reduced in `reduce_dtype`, the optimizer stepping f32 shards.

use candle_core::DType;

/// The dtypes of a mixed-precision run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MixedPrecision {
    /// The dtype units are gathered and computed in.
    pub param_dtype: DType,
    /// The dtype gradients are reduced in.
    pub reduce_dtype: DType,
}

/// The dtypes in force: `precision`, or f32 for both.
pub(crate) fn dtypes(precision: Option<MixedPrecision>) -> (DType, DType) {
    precision.map_or((DType::F32, DType::F32), |p| {
        (p.param_dtype, p.reduce_dtype)
    })
}
