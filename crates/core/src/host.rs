//! Access to the f32 host memory behind CPU tensors, for worlds that move bytes themselves.
//!
//! Candle keeps storage private; reads go through its read guard and writes through an
//! in-place custom op, which also refuses a destination that aliases its source instead of
//! deadlocking on the storage lock.

use candle_core::backend::BackendStorage;
use candle_core::{CpuStorage, DType, InplaceOp1, InplaceOp2, Layout, Storage, Tensor};

/// Why a tensor's memory could not be reached.
#[derive(Debug, Clone, thiserror::Error)]
#[error("{0}")]
pub struct HostAccessError(pub String);

fn check_f32(t: &Tensor) -> Result<(), HostAccessError> {
    if t.dtype() != DType::F32 {
        return Err(HostAccessError(format!(
            "expected an f32 tensor, found {:?}",
            t.dtype()
        )));
    }
    if !t.device().is_cpu() {
        return Err(HostAccessError(format!(
            "expected a cpu tensor, found {:?}",
            t.device().location()
        )));
    }
    Ok(())
}

fn contiguous(data: &[f32], layout: &Layout) -> Result<(usize, usize), HostAccessError> {
    let (start, end) = layout.contiguous_offsets().ok_or_else(|| {
        HostAccessError("expected a contiguous tensor, found a strided view".to_string())
    })?;
    if end > data.len() {
        return Err(HostAccessError("tensor layout exceeds its storage".into()));
    }
    Ok((start, end))
}

fn cpu_f32<'a>(storage: &'a CpuStorage, layout: &Layout) -> candle_core::Result<&'a [f32]> {
    let data = storage.as_slice::<f32>()?;
    let (start, end) = contiguous(data, layout).map_err(candle_core::Error::wrap)?;
    Ok(&data[start..end])
}

fn cpu_f32_mut<'a>(
    storage: &'a mut CpuStorage,
    layout: &Layout,
) -> candle_core::Result<&'a mut [f32]> {
    match storage {
        CpuStorage::F32(data) => {
            let (start, end) = contiguous(data, layout).map_err(candle_core::Error::wrap)?;
            Ok(&mut data[start..end])
        }
        other => Err(candle_core::Error::wrap(HostAccessError(format!(
            "expected f32 storage, found {:?}",
            other.dtype()
        )))),
    }
}

/// Runs `f` on the contiguous f32 data of a CPU tensor.
pub fn with_f32<R>(t: &Tensor, f: impl FnOnce(&[f32]) -> R) -> Result<R, HostAccessError> {
    check_f32(t)?;
    let (storage, layout) = t.storage_and_layout();
    match &*storage {
        Storage::Cpu(cpu) => {
            let data = cpu_f32(cpu, layout).map_err(|e| HostAccessError(e.to_string()))?;
            Ok(f(data))
        }
        _ => Err(HostAccessError("expected a cpu tensor".into())),
    }
}

struct Mutate<F>(std::cell::RefCell<Option<F>>);

impl<F: FnOnce(&mut [f32])> InplaceOp1 for Mutate<F> {
    fn name(&self) -> &'static str {
        "wick-host-mutate"
    }
    fn cpu_fwd(&self, storage: &mut CpuStorage, layout: &Layout) -> candle_core::Result<()> {
        let data = cpu_f32_mut(storage, layout)?;
        if let Some(f) = self.0.borrow_mut().take() {
            f(data);
        }
        Ok(())
    }
}

impl<F: FnOnce(&mut [f32], &[f32])> InplaceOp2 for Mutate<F> {
    fn name(&self) -> &'static str {
        "wick-host-mutate-from"
    }
    fn cpu_fwd(
        &self,
        dst: &mut CpuStorage,
        dst_l: &Layout,
        src: &CpuStorage,
        src_l: &Layout,
    ) -> candle_core::Result<()> {
        let src = cpu_f32(src, src_l)?;
        let data = cpu_f32_mut(dst, dst_l)?;
        if let Some(f) = self.0.borrow_mut().take() {
            f(data, src);
        }
        Ok(())
    }
}

/// Runs `f` on the contiguous f32 data of a CPU tensor, mutably, in place.
///
/// The tensor's storage is written for everyone holding it: only use it on buffers this
/// code owns (collective outputs, flat gradient buckets).
pub fn with_f32_mut<R>(t: &Tensor, f: impl FnOnce(&mut [f32]) -> R) -> Result<R, HostAccessError> {
    check_f32(t)?;
    let mut out = None;
    let op = Mutate(std::cell::RefCell::new(Some(|d: &mut [f32]| {
        out = Some(f(d));
    })));
    t.inplace_op1(&op)
        .map_err(|e| HostAccessError(e.to_string()))?;
    drop(op);
    out.ok_or_else(|| HostAccessError("in-place access did not run".into()))
}

/// Runs `f` on `dst`'s data (mutably) and `src`'s data; the two must not share storage.
pub fn with_f32_mut_from<R>(
    dst: &Tensor,
    src: &Tensor,
    f: impl FnOnce(&mut [f32], &[f32]) -> R,
) -> Result<R, HostAccessError> {
    check_f32(dst)?;
    check_f32(src)?;
    let mut out = None;
    let op = Mutate(std::cell::RefCell::new(Some(|d: &mut [f32], s: &[f32]| {
        out = Some(f(d, s));
    })));
    dst.inplace_op2(src, &op)
        .map_err(|e| HostAccessError(e.to_string()))?;
    drop(op);
    out.ok_or_else(|| HostAccessError("in-place access did not run".into()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::Device;

    #[test]
    fn reads_and_writes_views() {
        let t = Tensor::arange(0f32, 10., &Device::Cpu).unwrap();
        let view = t.narrow(0, 2, 3).unwrap();
        assert_eq!(with_f32(&view, |d| d.to_vec()).unwrap(), vec![2., 3., 4.]);
        with_f32_mut(&view, |d| d.fill(-1.)).unwrap();
        assert_eq!(t.to_vec1::<f32>().unwrap()[1..6], [1., -1., -1., -1., 5.]);
        let src = Tensor::new(&[7f32, 8., 9.], &Device::Cpu).unwrap();
        with_f32_mut_from(&view, &src, |d, s| d.copy_from_slice(s)).unwrap();
        assert_eq!(t.to_vec1::<f32>().unwrap()[2..5], [7., 8., 9.]);
    }

    #[test]
    fn refuses_strided_and_wrong_dtype() {
        let t = Tensor::zeros((3, 4), DType::F32, &Device::Cpu).unwrap();
        assert!(with_f32(&t.t().unwrap(), |_| ()).is_err());
        let u = Tensor::zeros(4, DType::U32, &Device::Cpu).unwrap();
        assert!(with_f32(&u, |_| ()).unwrap_err().0.contains("f32"));
    }
}
