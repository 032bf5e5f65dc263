//! The autograd op that turns a flat shard into the full flat buffer.
//!
//! Forward: one all-gather of every rank's shard (in the compute dtype). Backward: one
//! reduce-scatter (mean over ranks, in the reduce dtype) of the full buffer's gradient into
//! the shard's gradient, issued and left in flight ([`BackwardReduction`]). Backward issues these
//! in the order it visits the graph, which is the same on every rank for the same graph.

use crate::units::backward_reduction::BackwardReduction;
#[cfg(feature = "cuda")]
use crate::units::prefetch::gather;
use candle_core::{CpuStorage, CustomOp1, DType, Device, Layout, Result, Shape, Tensor};
use half::{bf16, f16};
use std::sync::Arc;
use wick_core::{Collective, CollectiveExt};

/// Gathers a shard of `padded / world_size` elements into `padded` elements.
pub(crate) struct GatherOp {
    pub(crate) world: Arc<dyn Collective>,
    pub(crate) padded: usize,
    /// The unit gathered (the key of its kept gradient under accumulation).
    pub(crate) unit: usize,
    pub(crate) reduction: Arc<BackwardReduction>,
    pub(crate) param_dtype: DType,
    pub(crate) reduce_dtype: DType,
}

/// `len` elements of `T` filled by an all-gather of `shard` straight into their bytes.
fn gather_vec<T: Copy + Default>(
    world: &dyn Collective,
    shard: &Tensor,
    len: usize,
) -> Result<Vec<T>> {
    let mut full = vec![T::default(); len];
    // SAFETY: plain floats: the collective writes whole elements' bytes.
    let bytes = unsafe {
        std::slice::from_raw_parts_mut(
            full.as_mut_ptr().cast::<u8>(),
            std::mem::size_of_val(full.as_slice()),
        )
    };
    world
        .all_gather_host(shard, bytes)
        .map_err(candle_core::Error::from)?;
    Ok(full)
}

/// A CPU storage of `dtype` with `len` elements gathered from every rank's `shard`.
pub(crate) fn gather_storage(
    world: &dyn Collective,
    shard: &Tensor,
    dtype: DType,
    len: usize,
) -> Result<CpuStorage> {
    let shard = shard.to_dtype(dtype)?;
    Ok(match dtype {
        DType::BF16 => CpuStorage::BF16(gather_vec::<bf16>(world, &shard, len)?),
        DType::F16 => CpuStorage::F16(gather_vec::<f16>(world, &shard, len)?),
        _ => CpuStorage::F32(gather_vec::<f32>(world, &shard, len)?),
    })
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
        let full = gather_storage(self.world.as_ref(), &shard, self.param_dtype, self.padded)?;
        Ok((full, Shape::from(self.padded)))
    }

    #[cfg(feature = "cuda")]
    fn cuda_fwd(
        &self,
        storage: &candle_core::cuda_backend::CudaStorage,
        layout: &Layout,
    ) -> Result<(candle_core::cuda_backend::CudaStorage, Shape)> {
        use crate::units::device_storage::{storage_of, tensor_of};
        let shard = tensor_of(storage, layout)?;
        let full = gather(self.world.as_ref(), &shard, self.padded, self.param_dtype)?;
        Ok((storage_of(&full)?, Shape::from(self.padded)))
    }

    /// The shard's gradient is reduce-scattered while backward goes on, and reaches the
    /// strategy through `reduction`, not this op's return value.
    fn bwd(&self, arg: &Tensor, _res: &Tensor, grad: &Tensor) -> Result<Option<Tensor>> {
        reduce_to_shard(
            self.world.as_ref(),
            &self.reduction,
            self.unit,
            grad,
            self.reduce_dtype,
            arg,
        )?;
        Ok(None)
    }
}

/// Issues the reduce-scatter (mean over ranks, in `reduce_dtype`) of a unit's full flat
/// gradient into `shard`'s gradient, left in flight in `reduction` (the strategy collects it after
/// backward); or keeps the gradient local while accumulating micro-batches.
pub(crate) fn reduce_to_shard(
    world: &dyn Collective,
    reduction: &BackwardReduction,
    unit: usize,
    grad: &Tensor,
    reduce_dtype: DType,
    shard: &Tensor,
) -> Result<()> {
    match reduction.settle(unit, grad.to_dtype(reduce_dtype)?.contiguous()?)? {
        Some(grad) => reduction.reduce_scatter(world, shard, &grad),
        None => Ok(()),
    }
}
