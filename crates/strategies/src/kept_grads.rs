//! Gradient sync for strategies that reduce inside backward: on micro-batches before the
//! last one of an optimizer step, a unit's full gradient is kept locally (summed) instead of
//! reduce-scattered; the last micro-batch reduces the sum once.

use candle_core::{Result, Tensor};
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;
use wick_core::{lock, GradSync};

/// Whether backward reduces now, and the local gradients kept until it does.
pub(crate) struct KeptGrads {
    sync: AtomicBool,
    kept: Mutex<HashMap<usize, Tensor>>,
}

impl Default for KeptGrads {
    fn default() -> Self {
        KeptGrads {
            sync: AtomicBool::new(true),
            kept: Mutex::default(),
        }
    }
}

impl KeptGrads {
    /// Whether the backward starting now reduces (set by `Strategy::backward` from its
    /// argument, read by the autograd ops inside that backward).
    pub(crate) fn set(&self, sync: GradSync) {
        self.sync.store(sync == GradSync::Reduce, Ordering::SeqCst);
    }

    /// Adds `grad` (unit `unit`'s full gradient) to what is kept; when syncing, returns the
    /// total to reduce now, else keeps it and returns `None`.
    pub(crate) fn settle(&self, unit: usize, grad: Tensor) -> Result<Option<Tensor>> {
        let mut kept = lock(&self.kept);
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
        let kept = lock(&self.kept);
        kept.values()
            .map(|t| t.elem_count() * t.dtype().size_in_bytes())
            .sum()
    }
}
