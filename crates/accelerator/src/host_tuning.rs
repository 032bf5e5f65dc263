//! Process-wide settings for training on the host CPU, which a library must not make
//! behind its user's back: [`tune_host_process`] makes them when a program asks, first
//! thing in its `main` (the `wick` program and wick's examples do).
//!
//! - Candle's element-wise pool. Candle runs large element-wise ops on a pool of its own
//!   (`CANDLE_NUM_THREADS` - 1 workers, all cores by default), whose workers spin between
//!   ops and whose callers spin until they finish; it knows nothing of rayon's pools, in
//!   which wick's ranks and Candle's matmul run. Beside them its workers only take cores
//!   away (`examples/throughput` ran every strategy 1.1 to 1.7 times faster without them on
//!   2 cores). Candle reads the variable once, when it first makes the pool, and offers no
//!   call to size it, so the setting is `CANDLE_NUM_THREADS=1`, unless the user set it.
//! - glibc's malloc thresholds. A training step allocates and frees the same large buffers
//!   (activations, gradients, matmul outputs of a few MB) every step. glibc serves a buffer
//!   above its mmap threshold (128 KiB at first, raised as mapped buffers are freed) with a
//!   fresh `mmap`, and gives a heap's free top back to the kernel once it passes the trim
//!   threshold (twice the mmap threshold): either way the next step's buffers are new
//!   pages, and every page costs a fault and a zeroing on first touch. So both thresholds
//!   are fixed high: buffers up to 32 MiB (the most glibc lets a thread's heap hold) come
//!   from a heap, and up to 1 GiB of freed memory stays at the main heap's top.
//! - glibc's heap pad. A thread other than the first allocates from an arena of 64 MiB
//!   heaps, and glibc unmaps a heap as soon as all of it is free, whatever the trim
//!   threshold, unless the arena is to keep a pad of free memory (`M_TOP_PAD`) that the
//!   heap below cannot hold. A rank runs on a pool's thread, so whether its step's buffers
//!   came back as new pages every step depended on which arena that thread drew: the GPT
//!   at d_model 512 on one rank faulted in 0-460 pages a step in some runs and 2.9-32
//!   thousand in others, whose steps were up to 15% slower (docs/performance.md). The pad
//!   is 64 MiB, a whole heap, so no heap is unmapped; at the main heap it is address
//!   space that glibc reserves ahead, not memory, until a buffer is written there; the
//!   main heap keeps the pad when it trims, which with a 128 MiB trim threshold gave back
//!   and took again 67 MiB a step, hence the threshold of 1 GiB.
//! - glibc's malloc arenas. glibc gives threads that contend for a heap new arenas, up to
//!   8 per core, and each keeps its own freed memory: ranks as threads with their pools
//!   spread a step's buffers over many arenas, and each holds its slack. So the arenas are
//!   capped at the number of cores, as many as can allocate at once. At the SmolLM2-135M
//!   shape with QLoRA under fsdp at W=2, recomputed, on 2 cores, a run's peak resident set
//!   was 885-915 MiB over three runs with glibc's default and 723-779 over four with two
//!   arenas, at the same speed (docs/performance.md, "Peak resident set").
//!
//! A process whose user tuned malloc (any of glibc's `MALLOC_*` variables, or a
//! `glibc.malloc` tunable in `GLIBC_TUNABLES`) keeps what it asked for. (The same four
//! settings in glibc's environment variables, `MALLOC_MMAP_THRESHOLD_=33554432`,
//! `MALLOC_TRIM_THRESHOLD_=1073741824`, `MALLOC_TOP_PAD_=67108864` and `MALLOC_ARENA_MAX`
//! at the number of cores, are what `scripts/perf-report.sh` and
//! `scripts/real-size-rows.sh` give PyTorch.)

use std::sync::OnceLock;

/// Buffers up to this size come from a heap (glibc's own upper bound for the threshold).
#[cfg(all(target_os = "linux", target_env = "gnu"))]
const MMAP_THRESHOLD: libc::c_int = 32 << 20;
/// Freed memory kept at the main heap's top before it goes back to the kernel.
#[cfg(all(target_os = "linux", target_env = "gnu"))]
const TRIM_THRESHOLD: libc::c_int = 1 << 30;
/// Free memory an arena keeps when it shrinks: one whole heap of a thread's arena
/// (glibc's `HEAP_MAX_SIZE` on 64-bit hosts), so that none is unmapped between steps.
#[cfg(all(target_os = "linux", target_env = "gnu"))]
const TOP_PAD: libc::c_int = 64 << 20;

/// What [`tune_host_process`] set; `false` where it kept the user's choice (or, for
/// malloc, where the C library is not glibc).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HostTuning {
    /// `CANDLE_NUM_THREADS=1` was set: Candle's element-wise pool has no workers.
    pub candle_pool_quieted: bool,
    /// glibc's mmap threshold is 32 MiB, its trim threshold 1 GiB, its heap pad 64 MiB,
    /// and its arenas at most one per core.
    pub malloc_thresholds: bool,
}

/// Makes this process's settings for training on the host CPU (see the module's text):
/// Candle's element-wise pool kept to the calling thread, and glibc's malloc keeping
/// freed memory for the next step, each unless the user chose otherwise. The first call
/// decides; later ones return what it did. Nothing in wick calls it: a program opts in.
///
/// # Safety
///
/// It may set an environment variable, so, as `std::env::set_var` requires, no other
/// thread may read or write the environment while it runs: call it first in `main`,
/// before any thread is started (Candle's and rayon's pools included).
pub unsafe fn tune_host_process() -> HostTuning {
    static DONE: OnceLock<HostTuning> = OnceLock::new();
    *DONE.get_or_init(|| {
        let candle_pool_quieted = std::env::var_os("CANDLE_NUM_THREADS").is_none();
        if candle_pool_quieted {
            // SAFETY: the caller runs this before any other thread touches the environment.
            #[allow(unused_unsafe)]
            unsafe {
                std::env::set_var("CANDLE_NUM_THREADS", "1")
            };
        }
        HostTuning {
            candle_pool_quieted,
            malloc_thresholds: keep_freed_host_memory(),
        }
    })
}

/// Fixes glibc's mmap and trim thresholds and its heap pad, and caps its arenas at the
/// cores, unless the user tuned malloc; whether it did.
fn keep_freed_host_memory() -> bool {
    if user_tuned_malloc(std::env::vars_os()) {
        return false;
    }
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        let arenas = libc::c_int::try_from(cores).unwrap_or(libc::c_int::MAX);
        // SAFETY: mallopt only sets malloc's parameters; glibc takes its own lock.
        unsafe {
            libc::mallopt(libc::M_MMAP_THRESHOLD, MMAP_THRESHOLD) == 1
                && libc::mallopt(libc::M_TRIM_THRESHOLD, TRIM_THRESHOLD) == 1
                && libc::mallopt(libc::M_TOP_PAD, TOP_PAD) == 1
                && libc::mallopt(libc::M_ARENA_MAX, arenas) == 1
        }
    }
    #[cfg(not(all(target_os = "linux", target_env = "gnu")))]
    false
}

/// The environment variables glibc's malloc reads (`mallopt(3)`).
const GLIBC_MALLOC_VARIABLES: [&str; 8] = [
    "MALLOC_ARENA_MAX",
    "MALLOC_ARENA_TEST",
    "MALLOC_CHECK_",
    "MALLOC_MMAP_MAX_",
    "MALLOC_MMAP_THRESHOLD_",
    "MALLOC_PERTURB_",
    "MALLOC_TOP_PAD_",
    "MALLOC_TRIM_THRESHOLD_",
];

/// Whether `vars` (the environment) tune glibc's malloc.
fn user_tuned_malloc(
    vars: impl IntoIterator<Item = (std::ffi::OsString, std::ffi::OsString)>,
) -> bool {
    vars.into_iter().any(|(name, value)| {
        let name = name.to_string_lossy();
        GLIBC_MALLOC_VARIABLES.contains(&name.as_ref())
            || (name == "GLIBC_TUNABLES" && value.to_string_lossy().contains("glibc.malloc."))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(vars: &[(&str, &str)]) -> Vec<(std::ffi::OsString, std::ffi::OsString)> {
        vars.iter().map(|(n, v)| (n.into(), v.into())).collect()
    }

    #[test]
    fn a_users_malloc_settings_are_kept() {
        assert!(user_tuned_malloc(env(&[("MALLOC_TRIM_THRESHOLD_", "0")])));
        assert!(user_tuned_malloc(env(&[("MALLOC_ARENA_MAX", "2")])));
        assert!(user_tuned_malloc(env(&[(
            "GLIBC_TUNABLES",
            "glibc.rtld.nns=2:glibc.malloc.perturb=0"
        )])));
    }

    #[test]
    fn other_variables_leave_the_choice_to_wick() {
        assert!(!user_tuned_malloc(env(&[
            ("PATH", "/usr/bin"),
            ("MALLOC_CONF", "narenas:1"),
            ("GLIBC_TUNABLES", "glibc.rtld.nns=2"),
        ])));
    }
}
