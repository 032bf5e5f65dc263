//! Tensors from and to the CUDA storage Candle hands a custom op, so that the gather and
//! unit ops run their CPU code path's tensor logic on the device too.
//!
//! Candle gives an op's forward a borrowed storage and takes back an owned one; both ends
//! cost one device-to-device copy (the shard in, the output out), the price of doing the
//! work with ordinary tensor calls.

use candle_core::cuda_backend::CudaStorage;
use candle_core::op::BackpropOp;
use candle_core::{Layout, Result, Storage, Tensor};

/// A tensor holding a copy of the elements `layout` reads from `storage` (contiguous).
pub(crate) fn tensor_of(storage: &CudaStorage, layout: &Layout) -> Result<Tensor> {
    let (start, end) = layout.contiguous_offsets().ok_or_else(|| {
        candle_core::Error::Msg("wick: custom-op inputs must be contiguous".into())
    })?;
    let copy = candle_core::backend::BackendStorage::try_clone(storage, layout)?;
    // The copy has the whole storage; the layout's elements are `start..end` of it.
    Tensor::from_storage(Storage::Cuda(copy), end, BackpropOp::none(), false)
        .narrow(0, start, end - start)?
        .reshape(layout.shape())
}

/// An owned copy of a CUDA tensor's storage, holding its elements from the first.
pub(crate) fn storage_of(t: &Tensor) -> Result<CudaStorage> {
    let t = t.contiguous()?;
    // A view that starts inside its storage is copied out first.
    let t = match t.layout().start_offset() {
        0 => t,
        _ => t.copy()?,
    };
    let (storage, layout) = t.storage_and_layout();
    match &*storage {
        Storage::Cuda(cuda) => candle_core::backend::BackendStorage::try_clone(cuda, layout),
        _ => candle_core::bail!("wick: expected a CUDA tensor"),
    }
}
