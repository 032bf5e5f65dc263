//! Locking that outlives a panicking holder.

use std::sync::{Mutex, MutexGuard};

/// Locks `m`, and takes its data even when a thread panicked while holding it.
///
/// A rank that panics is reported through its world (every other rank's calls fail naming
/// it), so a second panic on the poisoned lock would only hide that report. The data
/// behind wick's locks is whole at every point a holder can panic: each guarded section
/// replaces or pushes values, it never leaves one half-written.
pub fn lock<T: ?Sized>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}
