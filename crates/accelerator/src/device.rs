//! Which device a rank computes on, and the checks that the machine has it.

use candle_core::Device;
use wick_core::{Error, Result};

/// The kind of device every rank of a world computes on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[cfg_attr(feature = "clap", derive(clap::ValueEnum))]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[cfg_attr(feature = "serde", serde(rename_all = "lowercase"))]
pub enum DeviceKind {
    /// The host's CPU (the default; needs nothing).
    #[default]
    Cpu,
    /// A CUDA GPU per rank (the `cuda` feature).
    Cuda,
}

impl DeviceKind {
    /// The name the command line uses: `cpu` or `cuda`.
    pub fn name(self) -> &'static str {
        match self {
            DeviceKind::Cpu => "cpu",
            DeviceKind::Cuda => "cuda",
        }
    }

    /// Parses a command-line name (`cpu`, `cuda`).
    pub fn parse(name: &str) -> Result<Self> {
        match name {
            "cpu" => Ok(DeviceKind::Cpu),
            "cuda" | "gpu" => Ok(DeviceKind::Cuda),
            other => Err(Error::config(
                "accelerator",
                format!("unknown accelerator `{other}`: expected cpu or cuda"),
            )),
        }
    }
}

/// The number of CUDA GPUs this process sees. Without the `cuda` feature, or without a
/// driver or a GPU, this is an error that says so: wick never falls back to the CPU.
pub fn cuda_device_count() -> Result<usize> {
    #[cfg(feature = "cuda")]
    {
        use candle_core::cuda_backend::cudarc::driver::CudaContext;
        CudaContext::device_count()
            .map(|n| n.max(0) as usize)
            .map_err(|e| {
                Error::config(
                    "accelerator",
                    format!(
                        "cuda asked, but no CUDA device could be found (the driver said {:?})",
                        e.0
                    ),
                )
            })
    }
    #[cfg(not(feature = "cuda"))]
    Err(Error::config(
        "accelerator",
        "cuda asked, but this wick was built without the `cuda` feature: rebuild with \
         `--features cuda` (or `cuda,nccl`)",
    ))
}

/// Checks that GPU `highest` exists (ordinals `0..=highest` are used) for `ranks` ranks.
pub(crate) fn check_gpus(ranks: usize, highest: usize) -> Result<()> {
    let found = cuda_device_count()?;
    if highest >= found {
        return Err(Error::config(
            "devices",
            format!(
                "{ranks} CUDA ranks need GPU {highest}, but this machine has {found} \
                 GPU{}: pass at most --devices {found}",
                if found == 1 { "" } else { "s" }
            ),
        ));
    }
    Ok(())
}

/// The device of a rank: the CPU, or CUDA GPU `ordinal`.
pub(crate) fn rank_device(kind: DeviceKind, ordinal: usize) -> Result<Device> {
    match kind {
        DeviceKind::Cpu => Ok(Device::Cpu),
        DeviceKind::Cuda => Device::new_cuda(ordinal).map_err(|e| {
            Error::config(
                "accelerator",
                format!("cannot open CUDA GPU {ordinal}: {e}"),
            )
        }),
    }
}

/// The highest number of bytes in use at once in CUDA GPU `ordinal`'s default memory pool
/// since the last [`reset_cuda_memory_peak`] (or since the pool was made): the peak device
/// memory of everything that allocated through it, which is Candle's tensors when the GPU
/// supports stream-ordered allocation (cudarc then allocates with `cuMemAllocAsync`).
#[cfg(feature = "cuda")]
pub fn cuda_memory_peak(ordinal: usize) -> Result<usize> {
    used_mem_high(ordinal, false).map(|bytes| bytes as usize)
}

/// Starts a new peak for [`cuda_memory_peak`] at the bytes in use now.
#[cfg(feature = "cuda")]
pub fn reset_cuda_memory_peak(ordinal: usize) -> Result<()> {
    used_mem_high(ordinal, true).map(drop)
}

/// GPU `ordinal`'s default memory pool's high-water mark (`USED_MEM_HIGH`): read, or with
/// `reset` set to 0, which the driver takes as "start again from the bytes in use".
#[cfg(feature = "cuda")]
fn used_mem_high(ordinal: usize, reset: bool) -> Result<u64> {
    use candle_core::cuda_backend::cudarc::driver::{result, sys};
    let fail = |what: &str, e: sys::CUresult| {
        Error::config(
            "accelerator",
            format!("GPU {ordinal}: {what} failed ({e:?})"),
        )
    };
    let ok = sys::CUresult::CUDA_SUCCESS;
    result::init().map_err(|e| fail("cuInit", e.0))?;
    let mut device: sys::CUdevice = 0;
    let mut pool: sys::CUmemoryPool = std::ptr::null_mut();
    let mut value: u64 = 0;
    let high = sys::CUmemPool_attribute::CU_MEMPOOL_ATTR_USED_MEM_HIGH;
    // SAFETY: out-pointers to locals of the types the driver writes; USED_MEM_HIGH is a
    // cuuint64_t, and setting it takes 0.
    unsafe {
        match sys::cuDeviceGet(&mut device, ordinal as i32) {
            r if r == ok => {}
            e => return Err(fail("cuDeviceGet", e)),
        }
        match sys::cuDeviceGetDefaultMemPool(&mut pool, device) {
            r if r == ok => {}
            e => return Err(fail("cuDeviceGetDefaultMemPool", e)),
        }
        let at = (&mut value as *mut u64).cast();
        match reset {
            false => match sys::cuMemPoolGetAttribute(pool, high, at) {
                r if r == ok => Ok(value),
                e => Err(fail("cuMemPoolGetAttribute", e)),
            },
            true => match sys::cuMemPoolSetAttribute(pool, high, at) {
                r if r == ok => Ok(0),
                e => Err(fail("cuMemPoolSetAttribute", e)),
            },
        }
    }
}
