//! Access to the host memory behind tensors, for the worlds that move bytes themselves
//! (`ThreadComm`, `MpiWorld`).
//!
//! Candle keeps storage private; reads go through its read guard and writes through an
//! in-place custom op, which also refuses a destination that aliases its source instead of
//! deadlocking on the storage lock. Collectives move f32 and, for mixed precision, bf16 and
//! f16, and gather u8 (a quantized base's blocks); the data is handed out as bytes with the
//! tensor's dtype. Only float dtypes reduce ([`check_reducible`]).
//!
//! A tensor on another device (a CUDA rank of a `ThreadWorld`, several of which may share
//! one GPU) is staged: copied to the host, handed out, and written back in place when it
//! was lent mutably. That costs two copies per call and is meant for tests; `NcclWorld`
//! moves device memory itself.

use candle_core::backend::BackendStorage;
use candle_core::{CpuStorage, DType, Device, InplaceOp1, InplaceOp2, Layout, Storage, Tensor};

/// Why a tensor's memory could not be reached.
#[derive(Debug, Clone, thiserror::Error)]
#[error("{0}")]
pub(crate) struct HostAccessError(pub(crate) String);

fn check(t: &Tensor) -> Result<(), HostAccessError> {
    if !matches!(t.dtype(), DType::F32 | DType::BF16 | DType::F16 | DType::U8) {
        return Err(HostAccessError(format!(
            "expected an f32, bf16, f16 or u8 tensor, found {:?}",
            t.dtype()
        )));
    }
    Ok(())
}

/// Refuses a reduction over `dtype` unless its elements add (f32, bf16, f16): bytes are
/// moved, never summed. Every reduction checks this before any byte is read.
pub(crate) fn check_reducible(dtype: DType) -> Result<(), HostAccessError> {
    match dtype {
        DType::F32 | DType::BF16 | DType::F16 => Ok(()),
        other => Err(HostAccessError(format!(
            "reductions take f32, bf16 or f16 tensors, found {other:?}"
        ))),
    }
}

fn access_error(e: candle_core::Error) -> HostAccessError {
    HostAccessError(e.to_string())
}

/// A host copy of a tensor on another device (`None` for a CPU tensor, used as it is).
fn staged(t: &Tensor) -> Result<Option<Tensor>, HostAccessError> {
    if t.device().is_cpu() {
        return Ok(None);
    }
    if !t.is_contiguous() {
        return Err(HostAccessError(
            "expected a contiguous tensor, found a strided view".into(),
        ));
    }
    t.to_device(&Device::Cpu).map(Some).map_err(access_error)
}

/// Writes a staged host copy back into the device tensor it was made from, in place.
fn write_back(t: &Tensor, host: &Tensor) -> Result<(), HostAccessError> {
    let upload = host.flatten_all().and_then(|h| h.to_device(t.device()));
    upload
        .and_then(|h| t.flatten_all()?.slice_set(&h, 0, 0))
        .map_err(access_error)
}

fn range(len: usize, layout: &Layout) -> candle_core::Result<(usize, usize)> {
    let (start, end) = layout.contiguous_offsets().ok_or_else(|| {
        candle_core::Error::wrap(HostAccessError(
            "expected a contiguous tensor, found a strided view".into(),
        ))
    })?;
    if end > len {
        return Err(candle_core::Error::wrap(HostAccessError(
            "tensor layout exceeds its storage".into(),
        )));
    }
    Ok((start, end))
}

fn as_bytes<'a, T>(v: &'a [T], layout: &Layout) -> candle_core::Result<&'a [u8]> {
    let (start, end) = range(v.len(), layout)?;
    let part = &v[start..end];
    // SAFETY: the elements are plain floats or bytes; their bytes are valid to read for the
    // borrow.
    Ok(unsafe {
        std::slice::from_raw_parts(part.as_ptr().cast::<u8>(), std::mem::size_of_val(part))
    })
}

fn as_bytes_mut<'a, T>(v: &'a mut [T], layout: &Layout) -> candle_core::Result<&'a mut [u8]> {
    let (start, end) = range(v.len(), layout)?;
    let part = &mut v[start..end];
    let len = std::mem::size_of_val(part);
    // SAFETY: plain floats or bytes: any bytes written are a valid value.
    Ok(unsafe { std::slice::from_raw_parts_mut(part.as_mut_ptr().cast::<u8>(), len) })
}

fn bytes<'a>(storage: &'a CpuStorage, layout: &Layout) -> candle_core::Result<&'a [u8]> {
    match storage {
        CpuStorage::F32(v) => as_bytes(v, layout),
        CpuStorage::BF16(v) => as_bytes(v, layout),
        CpuStorage::F16(v) => as_bytes(v, layout),
        CpuStorage::U8(v) => as_bytes(v, layout),
        other => candle_core::bail!("no collective for {:?} storage", other.dtype()),
    }
}

fn bytes_mut<'a>(
    storage: &'a mut CpuStorage,
    layout: &Layout,
) -> candle_core::Result<&'a mut [u8]> {
    match storage {
        CpuStorage::F32(v) => as_bytes_mut(v, layout),
        CpuStorage::BF16(v) => as_bytes_mut(v, layout),
        CpuStorage::F16(v) => as_bytes_mut(v, layout),
        CpuStorage::U8(v) => as_bytes_mut(v, layout),
        other => candle_core::bail!("no collective for {:?} storage", other.dtype()),
    }
}

/// Runs `f` on the bytes of a contiguous tensor (f32, bf16, f16 or u8).
pub(crate) fn with_bytes<R>(t: &Tensor, f: impl FnOnce(&[u8]) -> R) -> Result<R, HostAccessError> {
    check(t)?;
    if let Some(host) = staged(t)? {
        return with_bytes(&host, f);
    }
    let (storage, layout) = t.storage_and_layout();
    match &*storage {
        Storage::Cpu(cpu) => {
            let data = bytes(cpu, layout).map_err(|e| HostAccessError(e.to_string()))?;
            Ok(f(data))
        }
        _ => Err(HostAccessError("expected a cpu tensor".into())),
    }
}

struct Mutate<F>(std::cell::RefCell<Option<F>>);

impl<F: FnOnce(&mut [u8])> InplaceOp1 for Mutate<F> {
    fn name(&self) -> &'static str {
        "wick-host-mutate"
    }
    fn cpu_fwd(&self, storage: &mut CpuStorage, layout: &Layout) -> candle_core::Result<()> {
        let data = bytes_mut(storage, layout)?;
        if let Some(f) = self.0.borrow_mut().take() {
            f(data);
        }
        Ok(())
    }
}

impl<F: FnOnce(&mut [u8], &[u8])> InplaceOp2 for Mutate<F> {
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
        let src = bytes(src, src_l)?;
        let data = bytes_mut(dst, dst_l)?;
        if let Some(f) = self.0.borrow_mut().take() {
            f(data, src);
        }
        Ok(())
    }
}

/// Runs `f` on the bytes of a contiguous tensor, mutably, in place.
///
/// The tensor's storage is written for everyone holding it: only use it on buffers this
/// code owns (collective outputs, flat gradient buckets).
pub(crate) fn with_bytes_mut<R>(
    t: &Tensor,
    f: impl FnOnce(&mut [u8]) -> R,
) -> Result<R, HostAccessError> {
    check(t)?;
    if let Some(host) = staged(t)? {
        let out = with_bytes_mut(&host, f)?;
        write_back(t, &host)?;
        return Ok(out);
    }
    let mut out = None;
    let op = Mutate(std::cell::RefCell::new(Some(|d: &mut [u8]| {
        out = Some(f(d));
    })));
    t.inplace_op1(&op)
        .map_err(|e| HostAccessError(e.to_string()))?;
    drop(op);
    out.ok_or_else(|| HostAccessError("in-place access did not run".into()))
}

/// Runs `f` on `dst`'s bytes (mutably) and `src`'s bytes; the two must have the same dtype
/// and must not share storage.
pub(crate) fn with_bytes_mut_from<R>(
    dst: &Tensor,
    src: &Tensor,
    f: impl FnOnce(&mut [u8], &[u8]) -> R,
) -> Result<R, HostAccessError> {
    check(dst)?;
    check(src)?;
    if dst.dtype() != src.dtype() {
        return Err(HostAccessError(format!(
            "input is {:?} but output is {:?}",
            src.dtype(),
            dst.dtype()
        )));
    }
    let (host_dst, host_src) = (staged(dst)?, staged(src)?);
    if host_dst.is_some() || host_src.is_some() {
        let d = host_dst.as_ref().unwrap_or(dst);
        let out = with_bytes_mut_from(d, host_src.as_ref().unwrap_or(src), f)?;
        if host_dst.is_some() {
            write_back(dst, d)?;
        }
        return Ok(out);
    }
    let mut out = None;
    let op = Mutate(std::cell::RefCell::new(Some(|d: &mut [u8], s: &[u8]| {
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

    fn floats(b: &[u8]) -> Vec<f32> {
        b.chunks_exact(4)
            .map(|c| f32::from_ne_bytes([c[0], c[1], c[2], c[3]]))
            .collect()
    }

    #[test]
    fn reads_and_writes_views() {
        let t = Tensor::arange(0f32, 10., &Device::Cpu).unwrap();
        let view = t.narrow(0, 2, 3).unwrap();
        assert_eq!(with_bytes(&view, floats).unwrap(), vec![2., 3., 4.]);
        with_bytes_mut(&view, |d| d.fill(0)).unwrap();
        assert_eq!(t.to_vec1::<f32>().unwrap()[1..6], [1., 0., 0., 0., 5.]);
        let src = Tensor::new(&[7f32, 8., 9.], &Device::Cpu).unwrap();
        with_bytes_mut_from(&view, &src, |d, s| d.copy_from_slice(s)).unwrap();
        assert_eq!(t.to_vec1::<f32>().unwrap()[2..5], [7., 8., 9.]);
    }

    #[test]
    fn half_precision_is_two_bytes_an_element() {
        let t = Tensor::ones(5, DType::BF16, &Device::Cpu).unwrap();
        assert_eq!(with_bytes(&t, |b| b.len()).unwrap(), 10);
    }

    #[test]
    fn refuses_strided_mixed_and_unsupported_dtypes() {
        let t = Tensor::zeros((3, 4), DType::F32, &Device::Cpu).unwrap();
        assert!(with_bytes(&t.t().unwrap(), |_| ()).is_err());
        let u = Tensor::zeros(4, DType::U32, &Device::Cpu).unwrap();
        assert!(with_bytes(&u, |_| ())
            .unwrap_err()
            .0
            .contains("f32, bf16, f16 or u8"));
        assert!(check_reducible(DType::U8).is_err());
        assert!(check_reducible(DType::BF16).is_ok());
        let h = Tensor::zeros(4, DType::F16, &Device::Cpu).unwrap();
        let f = Tensor::zeros(4, DType::F32, &Device::Cpu).unwrap();
        assert!(with_bytes_mut_from(&h, &f, |_, _| ())
            .unwrap_err()
            .0
            .contains("F32"));
    }
}
