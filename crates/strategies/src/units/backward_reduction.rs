//! Gradient sync for strategies that reduce inside backward: on micro-batches before the
//! last one of an optimizer step, a unit's full gradient is kept locally (summed) instead of
//! reduce-scattered; the last micro-batch reduces the sum once.
//!
//! A unit's reduce-scatter is issued as soon as its backward has the gradient, and left in
//! flight while backward goes on to the unit before it (FSDP2's overlap). At most
//! [`MAX_IN_FLIGHT`] are in flight: issuing one more first waits for the oldest, so a rank
//! holds a bounded number of full unit gradients and receive buffers whatever the depth of
//! the model (with every call left to the step, MPI's processes held about twice the
//! model in f32). The strategy waits for the rest once the loss's backward returns. Calls
//! are waited for in the order they were issued, the same on every rank.

use candle_core::backprop::GradStore;
use candle_core::{DType, Result, Tensor};
use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;
use wick_core::{lock, Collective, CollectiveExt, GradSync, ReduceOp, Work};

/// How many reduce-scatters may be in flight at once: one, as FSDP2 keeps, which still
/// overlaps a unit's reduction with the backward of the unit before it.
const MAX_IN_FLIGHT: usize = 1;

/// A shard's gradient being reduce-scattered: the shard it belongs to, the buffer the
/// collective fills and the call to wait on.
struct InFlight {
    shard: Tensor,
    grad: Tensor,
    work: Work,
}

/// The reductions of one backward: those in flight, oldest first, and the shards' f32
/// gradients of those already waited for (or the first error met).
#[derive(Default)]
struct Reductions {
    in_flight: VecDeque<InFlight>,
    done: GradStore,
    first_error: Option<wick_core::Error>,
}

impl Reductions {
    /// Waits for `call` and adds its gradient to `done`, or records its error. After an
    /// error, later calls are still waited for, so none is left writing into a buffer.
    fn complete(&mut self, InFlight { shard, grad, work }: InFlight) {
        // A collective's error keeps its type (a peer's failure stays one).
        let waited = work.wait().map_err(wick_core::Error::from);
        let done = &mut self.done;
        let added = waited.and_then(|()| {
            let grad = grad.to_dtype(DType::F32)?;
            let total = match done.remove(&shard) {
                // A shard reached twice in one backward (a unit applied twice).
                Some(previous) => (previous + grad)?,
                None => grad,
            };
            done.insert(&shard, total);
            Ok(())
        });
        if let Err(e) = added {
            self.first_error.get_or_insert(e);
        }
    }
}

/// Whether backward reduces now, the local gradients kept until it does, and the
/// reductions of the current backward.
pub(crate) struct BackwardReduction {
    reduce_now: AtomicBool,
    kept: Mutex<HashMap<usize, Tensor>>,
    reductions: Mutex<Reductions>,
}

impl Default for BackwardReduction {
    fn default() -> Self {
        BackwardReduction {
            reduce_now: AtomicBool::new(true),
            kept: Mutex::default(),
            reductions: Mutex::default(),
        }
    }
}

impl BackwardReduction {
    /// Whether the backward starting now reduces (set by `Strategy::backward` from its
    /// argument, read by the autograd ops inside that backward).
    pub(crate) fn set(&self, sync: GradSync) {
        self.reduce_now
            .store(sync == GradSync::Reduce, Ordering::SeqCst);
    }

    /// Adds `grad` (unit `unit`'s full gradient) to what is kept; when syncing, returns the
    /// total to reduce now, else keeps it and returns `None`.
    pub(crate) fn settle(&self, unit: usize, grad: Tensor) -> Result<Option<Tensor>> {
        let mut kept = lock(&self.kept);
        let total = match kept.remove(&unit) {
            Some(previous) => (previous + grad)?,
            None => grad,
        };
        if self.reduce_now.load(Ordering::SeqCst) {
            Ok(Some(total))
        } else {
            kept.insert(unit, total);
            Ok(None)
        }
    }

    /// Issues the reduce-scatter (mean over ranks, in `grad`'s dtype) of a unit's full flat
    /// gradient into a gradient for `shard`, which [`BackwardReduction::wait_for_all`] hands out. Waits
    /// first for the oldest call if [`MAX_IN_FLIGHT`] are in flight.
    pub(crate) fn reduce_scatter(
        &self,
        world: &dyn Collective,
        shard: &Tensor,
        grad: &Tensor,
    ) -> Result<()> {
        let shard_grad = Tensor::zeros(shard.elem_count(), grad.dtype(), grad.device())?;
        let work = world
            .reduce_scatter_start(grad, &shard_grad, ReduceOp::Mean)
            .map_err(candle_core::Error::from)?;
        let mut reductions = lock(&self.reductions);
        reductions.in_flight.push_back(InFlight {
            shard: shard.clone(),
            grad: shard_grad,
            work,
        });
        while reductions.in_flight.len() > MAX_IN_FLIGHT {
            let oldest = reductions
                .in_flight
                .pop_front()
                .expect("more than one in flight");
            reductions.complete(oldest);
        }
        Ok(())
    }

    /// Waits for every reduction still in flight, in the order they were issued (the same
    /// on every rank), and returns the shards' f32 gradients of this backward. Waits for all
    /// of them even after one failed, so none is left writing into a buffer after this
    /// returns.
    pub(crate) fn wait_for_all(&self) -> wick_core::Result<GradStore> {
        let mut reductions = std::mem::take(&mut *lock(&self.reductions));
        while let Some(call) = reductions.in_flight.pop_front() {
            reductions.complete(call);
        }
        match reductions.first_error {
            Some(e) => Err(e),
            None => Ok(reductions.done),
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

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::Device;
    use std::sync::atomic::AtomicUsize;
    use std::sync::Arc;
    use wick_core::{Call, CollectiveError, Position, SoloWorld};

    /// A world of one whose calls stay in flight until waited for, counting how many are.
    #[derive(Default)]
    struct Deferred {
        now: Arc<AtomicUsize>,
        most: Arc<AtomicUsize>,
    }

    impl Collective for Deferred {
        fn position(&self) -> Position {
            Position::new(0, 1)
        }
        fn start(&self, call: Call<'_>) -> std::result::Result<Work, CollectiveError> {
            SoloWorld.start(call)?.wait()?;
            let now = self.now.fetch_add(1, Ordering::SeqCst) + 1;
            self.most.fetch_max(now, Ordering::SeqCst);
            let count = self.now.clone();
            Ok(Work::pending(move || {
                count.fetch_sub(1, Ordering::SeqCst);
                Ok(())
            }))
        }
    }

    #[test]
    fn at_most_one_reduction_stays_in_flight_and_every_gradient_comes_back() {
        let world = Deferred::default();
        let sync = BackwardReduction::default();
        let shards: Vec<Tensor> = (0..5)
            .map(|i| Tensor::zeros(3, DType::F32, &Device::Cpu).unwrap() + i as f64)
            .collect::<Result<_>>()
            .unwrap();
        for (i, shard) in shards.iter().enumerate() {
            let grad = Tensor::new(&[i as f32, 1., 2.], &Device::Cpu).unwrap();
            sync.reduce_scatter(&world, shard, &grad).unwrap();
            assert_eq!(world.now.load(Ordering::SeqCst), MAX_IN_FLIGHT);
        }
        // One more than the bound, for the moment between a start and the oldest's wait.
        assert_eq!(world.most.load(Ordering::SeqCst), MAX_IN_FLIGHT + 1);
        let store = sync.wait_for_all().unwrap();
        assert_eq!(world.now.load(Ordering::SeqCst), 0);
        for (i, shard) in shards.iter().enumerate() {
            let grad = store.get(shard).unwrap().to_vec1::<f32>().unwrap();
            assert_eq!(grad, [i as f32, 1., 2.]);
        }
    }
}
