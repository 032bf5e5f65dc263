//! `BlockingWorld`: a world whose calls started ahead complete when they are issued, as on
//! an engine without a progress engine. With it a step communicates what it did before any
//! overlap (DeepSpeed's `overlap_comm: false`): the same calls, in the same order, each
//! waited for where it is issued. The numbers do not change.

use crate::{Collective, CollectiveError, ReduceOp, Work};
use candle_core::Tensor;
use std::sync::Arc;

/// `inner`, with `all_gather_start`, `reduce_scatter_start` and `all_reduce_start` left at
/// their defaults (the blocking call, then a finished `Work`), and `inner`'s
/// `reduce_scatter_parts_start` waited for where it is issued.
pub struct BlockingWorld {
    inner: Arc<dyn Collective>,
}

impl BlockingWorld {
    /// `inner`, its started calls completed at once.
    pub fn over(inner: Arc<dyn Collective>) -> Arc<Self> {
        Arc::new(BlockingWorld { inner })
    }
}

impl Collective for BlockingWorld {
    fn rank(&self) -> usize {
        self.inner.rank()
    }
    fn world_size(&self) -> usize {
        self.inner.world_size()
    }
    fn all_gather_into(&self, shard: &Tensor, full: &Tensor) -> Result<(), CollectiveError> {
        self.inner.all_gather_into(shard, full)
    }
    fn reduce_scatter_into(
        &self,
        full: &Tensor,
        shard: &Tensor,
        op: ReduceOp,
    ) -> Result<(), CollectiveError> {
        self.inner.reduce_scatter_into(full, shard, op)
    }
    fn all_reduce_in_place(&self, tensor: &Tensor, op: ReduceOp) -> Result<(), CollectiveError> {
        self.inner.all_reduce_in_place(tensor, op)
    }
    fn broadcast_in_place(&self, tensor: &Tensor, root: usize) -> Result<(), CollectiveError> {
        self.inner.broadcast_in_place(tensor, root)
    }
    fn barrier(&self) -> Result<(), CollectiveError> {
        self.inner.barrier()
    }
    fn all_gather_host(&self, shard: &Tensor, full: &mut [u8]) -> Result<(), CollectiveError> {
        self.inner.all_gather_host(shard, full)
    }
    fn reduce_scatter_parts_start(
        &self,
        full: &Tensor,
        shard: &Tensor,
        parts: &[usize],
        op: ReduceOp,
    ) -> Result<Work, CollectiveError> {
        // The inner world's own way with uneven parts (padded or not), completed here.
        self.inner
            .reduce_scatter_parts_start(full, shard, parts, op)?
            .wait()?;
        Ok(Work::done())
    }
    fn split(&self, color: usize) -> Result<Arc<dyn Collective>, CollectiveError> {
        Ok(BlockingWorld::over(self.inner.split(color)?))
    }
    fn all_reduce_scalar(&self, value: f32, op: ReduceOp) -> Result<f32, CollectiveError> {
        self.inner.all_reduce_scalar(value, op)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Mutex;

    /// Records which of its methods ran; its started calls would stay pending.
    #[derive(Default)]
    struct Calls(Mutex<Vec<&'static str>>);

    impl Calls {
        fn note(&self, call: &'static str) -> Result<(), CollectiveError> {
            self.0.lock().unwrap().push(call);
            Ok(())
        }
    }

    impl Collective for Calls {
        fn rank(&self) -> usize {
            0
        }
        fn world_size(&self) -> usize {
            1
        }
        fn all_gather_into(&self, _: &Tensor, _: &Tensor) -> Result<(), CollectiveError> {
            self.note("all_gather")
        }
        fn reduce_scatter_into(
            &self,
            _: &Tensor,
            _: &Tensor,
            _: ReduceOp,
        ) -> Result<(), CollectiveError> {
            self.note("reduce_scatter")
        }
        fn all_reduce_in_place(&self, _: &Tensor, _: ReduceOp) -> Result<(), CollectiveError> {
            self.note("all_reduce")
        }
        fn broadcast_in_place(&self, _: &Tensor, _: usize) -> Result<(), CollectiveError> {
            self.note("broadcast")
        }
        fn barrier(&self) -> Result<(), CollectiveError> {
            self.note("barrier")
        }
        fn all_reduce_start(&self, _: &Tensor, _: ReduceOp) -> Result<Work, CollectiveError> {
            self.note("all_reduce_start")?;
            Ok(Work::pending(|| Ok(())))
        }
        fn reduce_scatter_start(
            &self,
            _: &Tensor,
            _: &Tensor,
            _: ReduceOp,
        ) -> Result<Work, CollectiveError> {
            self.note("reduce_scatter_start")?;
            Ok(Work::pending(|| Ok(())))
        }
    }

    #[test]
    fn started_calls_run_as_the_blocking_ones() {
        let calls = Arc::new(Calls::default());
        let world = BlockingWorld::over(calls.clone());
        let t = Tensor::zeros(2, candle_core::DType::F32, &candle_core::Device::Cpu).unwrap();
        world
            .all_reduce_start(&t, ReduceOp::Sum)
            .unwrap()
            .wait()
            .unwrap();
        world
            .reduce_scatter_start(&t, &t, ReduceOp::Mean)
            .unwrap()
            .wait()
            .unwrap();
        world.all_gather_start(&t, &t).unwrap().wait().unwrap();
        assert_eq!(
            *calls.0.lock().unwrap(),
            ["all_reduce", "reduce_scatter", "all_gather"]
        );
    }
}
