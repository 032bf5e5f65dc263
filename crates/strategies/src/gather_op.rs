//! The autograd op that turns a flat shard into the full flat buffer.
//!
//! Forward: one all-gather of every rank's shard. Backward: one reduce-scatter (mean over
//! ranks) of the full buffer's gradient into the shard's gradient. Backward runs these in
//! the order backward visits the graph, which is the same on every rank for the same graph.

use crate::grad_sync::GradSync;
use candle_core::{CpuStorage, CustomOp1, DType, Device, Layout, Result, Shape, Tensor};
use std::sync::Arc;
use wick_core::{Collective, ReduceOp};

/// Gathers a shard of `padded / world_size` elements into `padded` elements.
pub(crate) struct GatherOp {
    pub(crate) world: Arc<dyn Collective>,
    pub(crate) padded: usize,
    /// The unit gathered (the key of its kept gradient under accumulation).
    pub(crate) unit: usize,
    pub(crate) sync: Arc<GradSync>,
}

impl CustomOp1 for GatherOp {
    fn name(&self) -> &'static str {
        "wick-gather"
    }

    fn cpu_fwd(&self, storage: &CpuStorage, layout: &Layout) -> Result<(CpuStorage, Shape)> {
        let data = storage.as_slice::<f32>()?;
        let (start, end) = layout.contiguous_offsets().ok_or_else(|| {
            candle_core::Error::Msg("wick-gather: the shard must be contiguous".into())
        })?;
        // A small copy (1/W of the unit) so the world sees a tensor; the full output is
        // written once, straight into the buffer this op returns.
        let shard = Tensor::from_slice(&data[start..end], end - start, &Device::Cpu)?;
        let mut full = vec![0f32; self.padded];
        self.world
            .all_gather_host(&shard, &mut full)
            .map_err(candle_core::Error::wrap)?;
        Ok((CpuStorage::F32(full), Shape::from(self.padded)))
    }

    fn bwd(&self, arg: &Tensor, _res: &Tensor, grad: &Tensor) -> Result<Option<Tensor>> {
        reduce_to_shard(
            self.world.as_ref(),
            &self.sync,
            self.unit,
            grad,
            arg.elem_count(),
        )
    }
}

/// The shard's gradient from a unit's full flat gradient: one reduce-scatter (mean over
/// ranks), or `None` while gradients are kept local for accumulation.
pub(crate) fn reduce_to_shard(
    world: &dyn Collective,
    sync: &GradSync,
    unit: usize,
    grad: &Tensor,
    shard_len: usize,
) -> Result<Option<Tensor>> {
    let Some(grad) = sync.settle(unit, grad.contiguous()?)? else {
        return Ok(None);
    };
    let shard_grad = Tensor::zeros(shard_len, DType::F32, grad.device())?;
    world
        .reduce_scatter_into(&grad, &shard_grad, ReduceOp::Mean)
        .map_err(candle_core::Error::wrap)?;
    Ok(Some(shard_grad))
}
