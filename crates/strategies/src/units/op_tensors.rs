//! Tensors in and out of a custom op's CPU storage, and the input of a unit's own graph:
//! what the unit op and the recompute op share.

use candle_core::{CpuStorage, DType, Device, Layout, Result, Shape, Tensor, Var};

/// The input as a variable of the unit's own graph, when it can take a gradient, and the
/// tensor the unit runs on (cut from any graph outside the unit).
pub(crate) fn input_var(input: &Tensor) -> Result<(Option<Var>, Tensor)> {
    Ok(match input.dtype() {
        DType::F32 | DType::F16 | DType::BF16 | DType::F64 => {
            let v = Var::from_tensor(&input.detach())?;
            let t = v.as_tensor().clone();
            (Some(v), t)
        }
        _ => (None, input.detach()),
    })
}

/// A tensor holding a copy of a CPU storage's contiguous elements.
pub(crate) fn host_tensor(storage: &CpuStorage, layout: &Layout) -> Result<Tensor> {
    let (start, end) = layout
        .contiguous_offsets()
        .ok_or_else(|| candle_core::Error::Msg("wick unit: inputs must be contiguous".into()))?;
    let shape = layout.shape().clone();
    match storage {
        CpuStorage::F32(v) => Tensor::from_slice(&v[start..end], shape, &Device::Cpu),
        CpuStorage::U32(v) => Tensor::from_slice(&v[start..end], shape, &Device::Cpu),
        CpuStorage::I64(v) => Tensor::from_slice(&v[start..end], shape, &Device::Cpu),
        CpuStorage::U8(v) => Tensor::from_slice(&v[start..end], shape, &Device::Cpu),
        CpuStorage::BF16(v) => Tensor::from_slice(&v[start..end], shape, &Device::Cpu),
        CpuStorage::F16(v) => Tensor::from_slice(&v[start..end], shape, &Device::Cpu),
        other => candle_core::bail!(
            "wick unit: unsupported input dtype {:?}",
            candle_core::backend::BackendStorage::dtype(other)
        ),
    }
}

/// `out`'s elements as the CPU storage a custom op's forward returns (16-bit kept, anything
/// else as f32), with its shape.
pub(crate) fn host_storage(out: &Tensor) -> Result<(CpuStorage, Shape)> {
    let shape = out.shape().clone();
    let out = out.flatten_all()?;
    let storage = match out.dtype() {
        DType::BF16 => CpuStorage::BF16(out.to_vec1()?),
        DType::F16 => CpuStorage::F16(out.to_vec1()?),
        _ => CpuStorage::F32(out.to_dtype(DType::F32)?.to_vec1()?),
    };
    Ok((storage, shape))
}
