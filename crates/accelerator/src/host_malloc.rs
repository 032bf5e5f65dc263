//! glibc's malloc settings for training on the host.
//!
//! A training step allocates and frees the same large buffers (activations, gradients,
//! matmul outputs of a few MB) every step. glibc serves a buffer above its mmap threshold
//! (128 KiB at first, raised as mapped buffers are freed) with a fresh `mmap`, and gives a
//! heap's free top back to the kernel once it passes the trim threshold (twice the mmap
//! threshold): either way the next step's buffers are new pages, and every page costs a
//! fault and a zeroing on first touch. So the first accelerator of a process fixes both
//! thresholds high: buffers up to 32 MiB (the most glibc lets a thread's heap hold) come
//! from the heap, and up to 128 MiB of freed memory stays there for the next step.
//!
//! A process whose user tuned malloc (any of glibc's `MALLOC_*` variables, or a
//! `glibc.malloc` tunable in `GLIBC_TUNABLES`) keeps what it asked for.

/// Buffers up to this size come from a heap (glibc's own upper bound for the threshold).
#[cfg(all(target_os = "linux", target_env = "gnu"))]
const MMAP_THRESHOLD: libc::c_int = 32 << 20;
/// Freed memory kept at a heap's top before it goes back to the kernel.
#[cfg(all(target_os = "linux", target_env = "gnu"))]
const TRIM_THRESHOLD: libc::c_int = 128 << 20;

/// Fixes glibc's mmap and trim thresholds once per process unless the user tuned malloc
/// (see the module's text). Elsewhere than glibc it does nothing.
pub(crate) fn keep_freed_host_memory() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        if user_tuned_malloc(std::env::vars_os()) {
            return;
        }
        #[cfg(all(target_os = "linux", target_env = "gnu"))]
        // SAFETY: mallopt only sets malloc's parameters; glibc takes its own lock.
        unsafe {
            libc::mallopt(libc::M_MMAP_THRESHOLD, MMAP_THRESHOLD);
            libc::mallopt(libc::M_TRIM_THRESHOLD, TRIM_THRESHOLD);
        }
    });
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
