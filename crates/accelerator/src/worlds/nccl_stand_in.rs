//! `NcclWorld` in a build without the `nccl` feature: the same names as the real one, so the
//! accelerator has one code path; making one is a clear error.

use candle_core::Device;
use std::convert::Infallible;
use std::sync::Arc;
use wick_core::{Collective, CollectiveError, CollectiveExt};

/// NCCL collectives between CUDA ranks, in a build without the `nccl` feature: it cannot be
/// made; [`NcclWorld::new`] says how to get the real one.
pub struct NcclWorld {
    never: Infallible,
}

impl NcclWorld {
    /// Whether this build has NCCL: `false` here.
    pub const ENABLED: bool = false;

    /// An error: this build has no NCCL.
    pub fn new(control: Arc<dyn Collective>, _device: &Device) -> Result<Self, CollectiveError> {
        Err(CollectiveError::Unsupported {
            rank: control.rank(),
            op: "init",
            message: "this wick was built without the `nccl` feature; rebuild with \
                      `--features cuda,nccl` for NCCL between GPUs"
                .into(),
        })
    }
}

crate::worlds::stand_in_collective!(NcclWorld);

#[cfg(test)]
mod tests {
    #[test]
    fn making_one_says_which_feature_is_missing() {
        let world = std::sync::Arc::new(wick_core::SoloWorld);
        let e = super::NcclWorld::new(world, &candle_core::Device::Cpu)
            .err()
            .unwrap()
            .to_string();
        assert!(e.contains("--features cuda,nccl"), "{e}");
    }
}
