//! Mixed precision for sharded strategies: f32 master shards, gathered compute copies in
//! the precision's `param_dtype`, gradients reduced in its `reduce_dtype`, the optimizer
//! stepping f32 shards.

use candle_core::DType;

/// Lightning's precision names: what the sharded FSDP modes compute and reduce in.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
#[cfg_attr(feature = "clap", derive(clap::ValueEnum))]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub enum Precision {
    /// f32 throughout.
    #[default]
    #[cfg_attr(feature = "clap", value(name = "32"))]
    #[cfg_attr(feature = "serde", serde(rename = "32"))]
    Full,
    /// bf16 compute copies and reductions over f32 master shards.
    #[cfg_attr(feature = "clap", value(name = "bf16-mixed"))]
    #[cfg_attr(feature = "serde", serde(rename = "bf16-mixed"))]
    Bf16Mixed,
    /// f16 compute copies and reductions, with dynamic loss scaling.
    #[cfg_attr(feature = "clap", value(name = "16-mixed"))]
    #[cfg_attr(feature = "serde", serde(rename = "16-mixed"))]
    F16Mixed,
}

impl Precision {
    /// Every precision.
    pub const ALL: [Precision; 3] = [Precision::Full, Precision::Bf16Mixed, Precision::F16Mixed];

    /// The name users type: `32`, `bf16-mixed`, `16-mixed`.
    pub fn name(self) -> &'static str {
        match self {
            Precision::Full => "32",
            Precision::Bf16Mixed => "bf16-mixed",
            Precision::F16Mixed => "16-mixed",
        }
    }

    /// Whether units compute in 16 bits over f32 master shards.
    pub fn is_mixed(self) -> bool {
        self != Precision::Full
    }

    /// The dtype units are gathered and computed in.
    pub fn param_dtype(self) -> DType {
        match self {
            Precision::Full => DType::F32,
            Precision::Bf16Mixed => DType::BF16,
            Precision::F16Mixed => DType::F16,
        }
    }

    /// The dtype gradients are reduced in: the compute dtype, as Lightning's mixed
    /// precisions reduce.
    pub fn reduce_dtype(self) -> DType {
        self.param_dtype()
    }

    /// Bytes of one gathered element.
    pub fn compute_bytes(self) -> usize {
        match self {
            Precision::Full => 4,
            Precision::Bf16Mixed | Precision::F16Mixed => 2,
        }
    }
}
