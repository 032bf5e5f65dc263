//! What a rank's device can tell about a stretch of work: its peak memory (a step's, for
//! the loggers' `peak_memory_gib`) and the rate of its matrix products (the peak the
//! loggers' model FLOPs utilisation is taken over; torchtitan reads a GPU's from a table,
//! but a CPU's depends on its cores and vector ISA, so it is measured).
//!
//! On the CPU the memory is the process's resident size at its largest since the last
//! reset, as a sampler thread sees it (every [`SAMPLE_EVERY`], and at each reading): every
//! rank that is a thread of the process counts in it. It does not touch the kernel's own
//! peak (`VmHWM`, which `/usr/bin/time` and a host program read): resetting that
//! (`/proc/self/clear_refs`) would change what the whole process reports. On a CUDA GPU it
//! is the peak of the device's default memory pool ([`cuda_memory_peak`]). Where neither
//! can be read there is no figure.

#[cfg(feature = "cuda")]
use crate::device::{cuda_memory_peak, reset_cuda_memory_peak};
use candle_core::{DType, Device, Result, Tensor};
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, OnceLock, PoisonError};
use std::time::Instant;

/// How often the CPU's resident size is sampled for a step's peak: a step's allocations
/// live far longer than this (a unit's gathered parameters, its activations).
pub const SAMPLE_EVERY: std::time::Duration = std::time::Duration::from_millis(5);

/// This process's resident size now (`VmRSS` in `/proc/self/status`).
fn resident_bytes() -> Option<u64> {
    status_bytes("VmRSS:")
}

/// A size `/proc/self/status` gives in kB, as bytes.
fn status_bytes(field: &str) -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with(field))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}

/// The largest resident size seen since the last reset, kept up by a sampler thread that
/// starts with the first use (none where the size cannot be read).
fn resident_peak() -> Option<&'static AtomicU64> {
    static PEAK: OnceLock<Option<&'static AtomicU64>> = OnceLock::new();
    *PEAK.get_or_init(|| {
        let peak: &'static AtomicU64 = Box::leak(Box::new(AtomicU64::new(resident_bytes()?)));
        std::thread::Builder::new()
            .name("wick-rss-sampler".into())
            .spawn(move || loop {
                std::thread::sleep(SAMPLE_EVERY);
                if let Some(now) = resident_bytes() {
                    peak.fetch_max(now, Ordering::Relaxed);
                }
            })
            .ok()?;
        Some(peak)
    })
}

/// Starts a new memory peak of `device`: from now on the peak counts from what is in use.
pub fn reset_memory_peak(device: &Device) {
    match device {
        Device::Cpu => {
            if let (Some(peak), Some(now)) = (resident_peak(), resident_bytes()) {
                peak.store(now, Ordering::Relaxed);
            }
        }
        #[cfg(feature = "cuda")]
        Device::Cuda(_) => {
            if let candle_core::DeviceLocation::Cuda { gpu_id } = device.location() {
                let _ = reset_cuda_memory_peak(gpu_id);
            }
        }
        _ => {}
    }
}

/// The peak bytes of `device`'s memory in use since the last [`reset_memory_peak`] (or
/// the first use), if it can be read.
pub fn memory_peak(device: &Device) -> Option<u64> {
    match device {
        Device::Cpu => {
            let now = resident_bytes()?;
            Some(
                resident_peak().map_or(now, |peak| peak.fetch_max(now, Ordering::Relaxed).max(now)),
            )
        }
        #[cfg(feature = "cuda")]
        Device::Cuda(_) => match device.location() {
            candle_core::DeviceLocation::Cuda { gpu_id } => {
                cuda_memory_peak(gpu_id).ok().map(|b| b as u64)
            }
            _ => None,
        },
        _ => None,
    }
}

/// The best f32 rate of Candle's matmul on `device`, in FLOP/s, as a model's layers run it
/// (on the CPU in the calling thread's rayon pool: a rank's thread budget): square
/// products of two sizes (1024 and 2048 on the CPU, 4096 and 8192 on a GPU), the best of
/// three each, the device synchronized around each. About 0.3 s on 2 CPU cores.
pub fn matmul_peak_flops(device: &Device) -> Result<f64> {
    let sizes = match device {
        Device::Cpu => [1024usize, 2048],
        _ => [4096, 8192],
    };
    let mut best = 0f64;
    for n in sizes {
        let a = Tensor::ones((n, n), DType::F32, device)?;
        for _ in 0..3 {
            device.synchronize()?;
            let start = Instant::now();
            let product = a.matmul(&a)?;
            device.synchronize()?;
            let seconds = start.elapsed().as_secs_f64().max(1e-9);
            drop(product);
            best = best.max(2.0 * (n * n * n) as f64 / seconds);
        }
    }
    Ok(best)
}

/// [`matmul_peak_flops`] for a rank of a world of `world_size` ranks, measured once per
/// process for each device, rank pool size and world size: a process that fits again in
/// the same shape (a test suite, a notebook, `fit` and then `fit` again) takes the first
/// figure rather than spending a second of every fit measuring, which at 4 ranks on 2
/// cores costs more than the small models' training itself.
pub fn rank_peak_flops(device: &Device, world_size: usize) -> Result<f64> {
    static MEASURED: Mutex<BTreeMap<(String, usize, usize), f64>> = Mutex::new(BTreeMap::new());
    let measured = || MEASURED.lock().unwrap_or_else(PoisonError::into_inner);
    let location = format!("{:?}", device.location());
    let key = (location, rayon::current_num_threads(), world_size);
    if let Some(&peak) = measured().get(&key) {
        return Ok(peak);
    }
    let peak = matmul_peak_flops(device)?;
    measured().insert(key, peak);
    Ok(peak)
}

#[cfg(all(test, target_os = "linux"))]
mod tests {
    use super::*;

    #[test]
    fn the_cpu_peak_follows_a_buffer_and_resets_below_it() {
        let cpu = Device::Cpu;
        reset_memory_peak(&cpu);
        let before = memory_peak(&cpu).unwrap();
        let big = vec![1u8; 256 << 20];
        std::hint::black_box(&big);
        let with = memory_peak(&cpu).unwrap();
        assert!(with >= before + (200 << 20), "{before} -> {with}");
        drop(big);
        let kernel_peak = || status_bytes("VmHWM:").unwrap();
        let process_peak = kernel_peak();
        reset_memory_peak(&cpu);
        let after = memory_peak(&cpu).unwrap();
        assert!(
            after + (200 << 20) <= with,
            "{with} -> {after} after the reset"
        );
        // The process's own peak, which a host program or /usr/bin/time reads, is not reset.
        assert!(
            kernel_peak() >= process_peak && process_peak + (200 << 20) > with,
            "the kernel's VmHWM was reset: {process_peak} -> {}",
            kernel_peak()
        );
    }

    #[test]
    fn the_matmul_peak_is_a_rate_a_cpu_can_have() {
        let flops = matmul_peak_flops(&Device::Cpu).unwrap();
        // Above a scalar core's, below what 2 sockets of AVX-512 cores could do.
        assert!(flops > 1e9 && flops < 1e14, "{flops}");
    }

    #[test]
    fn a_ranks_peak_is_measured_once_per_shape() {
        // A world size no other test uses, so the first call measures.
        let first = rank_peak_flops(&Device::Cpu, 1001).unwrap();
        assert!(first > 1e9, "{first}");
        // Timed again, the rate would differ in its low bits; kept, it is the same figure.
        let again = rank_peak_flops(&Device::Cpu, 1001).unwrap();
        assert_eq!(again.to_bits(), first.to_bits());
    }
}
