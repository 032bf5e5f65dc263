//! What the unit op and the recompute op share: [`TensorOp2`], a custom op of two tensors
//! written as ordinary tensor code, and the storage conversions that make it Candle's
//! `CustomOp2` on every device ([`OnTensors`]); and the input of a unit's own graph.

use candle_core::{CpuStorage, CustomOp2, DType, Device, Layout, Result, Shape, Tensor, Var};

/// A custom op of two tensors whose forward and backward are tensor code: a unit's run,
/// with a graph of its own that the outer graph sees as one node.
pub(crate) trait TensorOp2: Send + Sync {
    /// The op's name in errors and profiles.
    const NAME: &'static str;

    /// The output, from copies of the inputs outside any graph.
    fn forward(&self, a: &Tensor, b: &Tensor) -> Result<Tensor>;

    /// The inputs' gradients, given the output's gradient `grad`.
    fn backward(
        &self,
        a: &Tensor,
        b: &Tensor,
        grad: &Tensor,
    ) -> Result<(Option<Tensor>, Option<Tensor>)>;
}

/// A [`TensorOp2`] as the custom op Candle applies: each input lent as a tensor copy, the
/// output handed back as the storage Candle takes.
pub(crate) struct OnTensors<K>(pub(crate) K);

impl<K: TensorOp2> CustomOp2 for OnTensors<K> {
    fn name(&self) -> &'static str {
        K::NAME
    }

    fn cpu_fwd(&self, s1: &CpuStorage, l1: &Layout, s2: &CpuStorage, l2: &Layout) -> HostOut {
        let out = self
            .0
            .forward(&host_tensor(s1, l1)?, &host_tensor(s2, l2)?)?;
        host_storage(&out)
    }

    #[cfg(feature = "cuda")]
    fn cuda_fwd(
        &self,
        s1: &candle_core::cuda_backend::CudaStorage,
        l1: &Layout,
        s2: &candle_core::cuda_backend::CudaStorage,
        l2: &Layout,
    ) -> Result<(candle_core::cuda_backend::CudaStorage, Shape)> {
        use crate::units::device_storage::{storage_of, tensor_of};
        let out = self.0.forward(&tensor_of(s1, l1)?, &tensor_of(s2, l2)?)?;
        Ok((storage_of(&out)?, out.shape().clone()))
    }

    fn bwd(
        &self,
        a: &Tensor,
        b: &Tensor,
        _res: &Tensor,
        grad: &Tensor,
    ) -> Result<(Option<Tensor>, Option<Tensor>)> {
        self.0.backward(a, b, grad)
    }
}

/// What a custom op's CPU forward returns: the output's storage and shape.
type HostOut = Result<(CpuStorage, Shape)>;

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
fn host_tensor(storage: &CpuStorage, layout: &Layout) -> Result<Tensor> {
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
fn host_storage(out: &Tensor) -> HostOut {
    let shape = out.shape().clone();
    let out = out.flatten_all()?;
    let storage = match out.dtype() {
        DType::BF16 => CpuStorage::BF16(out.to_vec1()?),
        DType::F16 => CpuStorage::F16(out.to_vec1()?),
        _ => CpuStorage::F32(out.to_dtype(DType::F32)?.to_vec1()?),
    };
    Ok((storage, shape))
}
