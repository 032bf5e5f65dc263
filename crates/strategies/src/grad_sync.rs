//! Gradient sync for strategies that reduce inside backward: on micro-batches before the
//! last one of an optimizer step, a unit's full gradient is kept locally (summed) instead of
//! reduce-scattered; the last micro-batch reduces the sum once.

use candle_core::{Result, Tensor};
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;

/// Whether backward reduces now, and the local gradients kept until it does.
pub(crate) struct GradSync {
    sync: AtomicBool,
    kept: Mutex<HashMap<usize, Tensor>>,
}

impl Default for GradSync {
    fn default() -> Self {
        GradSync {
            sync: AtomicBool::new(true),
            kept: Mutex::default(),
        }
    }
}

impl GradSync {
    pub(crate) fn set(&self, sync: bool) {
        self.sync.store(sync, Ordering::SeqCst);
    }

    /// Adds `grad` (unit `unit`'s full gradient) to what is kept; when syncing, returns the
    /// total to reduce now, else keeps it and returns `None`.
    pub(crate) fn settle(&self, unit: usize, grad: Tensor) -> Result<Option<Tensor>> {
        let mut kept = self.kept.lock().unwrap_or_else(|p| p.into_inner());
        let total = match kept.remove(&unit) {
            Some(previous) => (previous + grad)?,
            None => grad,
        };
        if self.sync.load(Ordering::SeqCst) {
            Ok(Some(total))
        } else {
            kept.insert(unit, total);
            Ok(None)
        }
    }

    /// Bytes of gradients kept locally right now.
    pub(crate) fn kept_bytes(&self) -> usize {
        let kept = self.kept.lock().unwrap_or_else(|p| p.into_inner());
        kept.values()
            .map(|t| t.elem_count() * t.dtype().size_in_bytes())
            .sum()
    }
}
