//! Gradient sync for strategies that reduce inside backward: on micro-batches before the
//! last one of an optimizer step, a unit's full gradient is kept locally (summed) instead of
//! reduce-scattered; the last micro-batch reduces the sum once.
//!
//! A unit's reduce-scatter is issued as soon as its backward has the gradient, and left in
//! flight while backward goes on to the units before it (FSDP2's overlap); the strategy
//! waits for all of them, in the order they were issued, once the loss's backward returns.

use candle_core::backprop::GradStore;
use candle_core::{DType, Result, Tensor};
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;
use wick_core::{lock, Collective, GradSync, ReduceOp, Work};

/// A shard's gradient being reduce-scattered: the shard it belongs to, the buffer the
/// collective fills and the call to wait on.
struct InFlight {
    shard: Tensor,
    grad: Tensor,
    work: Work,
}

/// Whether backward reduces now, the local gradients kept until it does, and the
/// reductions in flight.
pub(crate) struct KeptGrads {
    sync: AtomicBool,
    kept: Mutex<HashMap<usize, Tensor>>,
    in_flight: Mutex<Vec<InFlight>>,
}

impl Default for KeptGrads {
    fn default() -> Self {
        KeptGrads {
            sync: AtomicBool::new(true),
            kept: Mutex::default(),
            in_flight: Mutex::default(),
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

    /// Issues the reduce-scatter (mean over ranks, in `grad`'s dtype) of a unit's full flat
    /// gradient into a gradient for `shard`, which [`KeptGrads::finish`] hands out.
    pub(crate) fn reduce_scatter(
        &self, world: &dyn Collective, shard: &Tensor, grad: &Tensor,
    ) -> Result<()> {
        let shard_grad = Tensor::zeros(shard.elem_count(), grad.dtype(), grad.device())?;
        let work = world
            .reduce_scatter_start(grad, &shard_grad, ReduceOp::Mean)
            .map_err(candle_core::Error::from)?;
        lock(&self.in_flight).push(InFlight {
            shard: shard.clone(),
            grad: shard_grad,
            work,
        });
        Ok(())
    }

    /// Waits for every reduction in flight, in the order they were issued (the same on
    /// every rank), and returns the shards' f32 gradients. Waits for all of them even after
    /// one failed, so none is left writing into a buffer after this returns.
    pub(crate) fn finish(&self) -> wick_core::Result<GradStore> {
        let in_flight = std::mem::take(&mut *lock(&self.in_flight));
        let mut store = GradStore::default();
        let mut first_error = None;
        for InFlight { shard, grad, work } in in_flight {
            // A collective's error keeps its type (a peer's failure stays one).
            let waited = work.wait().map_err(wick_core::Error::from);
            let added = waited.and_then(|()| {
                let grad = grad.to_dtype(DType::F32)?;
                let total = match store.remove(&shard) {
                    // A shard reached twice in one backward (a unit applied twice).
                    Some(previous) => (previous + grad)?,
                    None => grad,
                };
                store.insert(&shard, total);
                Ok(())
            });
            if let Err(e) = added {
                first_error.get_or_insert(e);
            }
        }
        match first_error {
            Some(e) => Err(e),
            None => Ok(store),
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
