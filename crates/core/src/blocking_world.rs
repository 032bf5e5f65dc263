//! `BlockingWorld`: a world whose calls started ahead complete when they are issued, as on
//! an engine without a progress engine. With it a step communicates what it did before any
//! overlap (DeepSpeed's `overlap_comm: false`): the same calls, in the same order, each
//! waited for where it is issued. The numbers do not change.

use crate::{Call, Collective, CollectiveError, Position, Work};
use std::sync::Arc;

/// `inner`, every call started on it made as the blocking call instead.
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
    fn position(&self) -> Position {
        self.inner.position()
    }
    /// The inner world's blocking form of the call.
    fn start(&self, call: Call<'_>) -> Result<Work, CollectiveError> {
        self.inner.run(call)?;
        Ok(Work::done())
    }
    fn run(&self, call: Call<'_>) -> Result<(), CollectiveError> {
        self.inner.run(call)
    }
    fn split(&self, color: usize) -> Result<Arc<dyn Collective>, CollectiveError> {
        Ok(BlockingWorld::over(self.inner.split(color)?))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::CollectiveExt;
    use crate::ReduceOp;
    use candle_core::Tensor;
    use std::sync::Mutex;

    /// Records each call it is given (`run:` for a blocking one) and each wait, its started
    /// calls pending until waited.
    #[derive(Default)]
    struct Calls(Arc<Mutex<Vec<String>>>);

    impl Collective for Calls {
        fn position(&self) -> Position {
            Position::new(0, 1)
        }
        fn start(&self, call: Call<'_>) -> Result<Work, CollectiveError> {
            let (log, name) = (self.0.clone(), call.name());
            log.lock().unwrap().push(name.to_string());
            Ok(Work::pending(move || {
                log.lock().unwrap().push(format!("wait:{name}"));
                Ok(())
            }))
        }
        fn run(&self, call: Call<'_>) -> Result<(), CollectiveError> {
            self.0.lock().unwrap().push(format!("run:{}", call.name()));
            Ok(())
        }
    }

    #[test]
    fn started_calls_run_as_the_blocking_ones() {
        let calls = Calls::default();
        let log = calls.0.clone();
        let world = BlockingWorld::over(Arc::new(calls));
        let t = Tensor::zeros(2, candle_core::DType::F32, &candle_core::Device::Cpu).unwrap();
        let reduce = world.all_reduce_start(&t, ReduceOp::Sum).unwrap();
        let scatter = world.reduce_scatter_start(&t, &t, ReduceOp::Mean).unwrap();
        // Both completed before the caller waits for either.
        assert_eq!(
            *log.lock().unwrap(),
            ["run:all_reduce", "run:reduce_scatter"]
        );
        scatter.wait().unwrap();
        reduce.wait().unwrap();
        world.all_gather_start(&t, &t).unwrap().wait().unwrap();
        assert_eq!(log.lock().unwrap().len(), 3);
    }
}
