//! `WaitClock`: a world that adds up the time its rank spends in collectives: inside every
//! blocking call, and inside the wait of every call started ahead. That is a step's exposed
//! communication: what a started call moved while the rank computed does not count, so
//! overlap shows as a smaller figure. It also counts waiting for a slower rank.

use crate::{Call, Collective, CollectiveError, Position, Work};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// `inner`, with the time spent in its calls added up (a split world adds to the same
/// clock).
pub struct WaitClock {
    inner: Arc<dyn Collective>,
    nanos: Arc<AtomicU64>,
}

impl WaitClock {
    /// `inner`, timed from zero.
    pub fn over(inner: Arc<dyn Collective>) -> Arc<Self> {
        Arc::new(WaitClock {
            inner,
            nanos: Arc::default(),
        })
    }

    /// The time spent in collectives so far.
    pub fn waited(&self) -> Duration {
        Duration::from_nanos(self.nanos.load(Ordering::Relaxed))
    }

    fn timed<T>(&self, call: impl FnOnce() -> T) -> T {
        add_time(&self.nanos, call)
    }

    /// A started call, its start timed now and its wait when it comes.
    fn started(
        &self,
        start: impl FnOnce() -> Result<Work, CollectiveError>,
    ) -> Result<Work, CollectiveError> {
        let work = self.timed(start)?;
        let nanos = self.nanos.clone();
        Ok(Work::pending(move || add_time(&nanos, || work.wait())))
    }
}

fn add_time<T>(nanos: &AtomicU64, call: impl FnOnce() -> T) -> T {
    // Under the vendored candle-core's profiler, collectives are a class of their own: the
    // op that issued one (a gather op) does not count its time.
    #[cfg(candle_op_profile)]
    let _profiled = candle_core::op_profile::scope("collective");
    let start = Instant::now();
    let out = call();
    let spent = u64::try_from(start.elapsed().as_nanos()).unwrap_or(u64::MAX);
    nanos.fetch_add(spent, Ordering::Relaxed);
    out
}

impl Collective for WaitClock {
    fn position(&self) -> Position {
        self.inner.position()
    }
    fn start(&self, call: Call<'_>) -> Result<Work, CollectiveError> {
        self.started(|| self.inner.start(call))
    }
    fn run(&self, call: Call<'_>) -> Result<(), CollectiveError> {
        self.timed(|| self.inner.run(call))
    }
    fn split(&self, color: usize) -> Result<Arc<dyn Collective>, CollectiveError> {
        let inner = self.timed(|| self.inner.split(color))?;
        Ok(Arc::new(WaitClock {
            inner,
            nanos: self.nanos.clone(),
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::CollectiveExt;
    use crate::ReduceOp;
    use candle_core::Tensor;

    /// A world whose every call takes 5 ms, in its wait.
    struct Slow;

    impl Slow {
        fn nap() -> Result<(), CollectiveError> {
            std::thread::sleep(Duration::from_millis(5));
            Ok(())
        }
    }

    impl Collective for Slow {
        fn position(&self) -> Position {
            Position::new(0, 1)
        }
        fn start(&self, _: Call<'_>) -> Result<Work, CollectiveError> {
            Ok(Work::pending(Self::nap))
        }
    }

    #[test]
    fn counts_blocking_calls_and_waits_not_the_time_between() {
        let clock = WaitClock::over(Arc::new(Slow));
        let t = Tensor::zeros(4, candle_core::DType::F32, &candle_core::Device::Cpu).unwrap();
        clock.all_reduce_in_place(&t, ReduceOp::Sum).unwrap();
        let work = clock.all_reduce_start(&t, ReduceOp::Sum).unwrap();
        // Time between the start and the wait is the rank's own (compute), not waiting.
        std::thread::sleep(Duration::from_millis(300));
        work.wait().unwrap();
        let waited = clock.waited();
        // Two naps, and never the 300 ms between start and wait.
        assert!(waited >= Duration::from_millis(10), "{waited:?}");
        assert!(waited < Duration::from_millis(300), "{waited:?}");
    }
}
