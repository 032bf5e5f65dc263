//! The compute threads each rank may use when ranks are threads of one process.
//!
//! Candle's CPU matmul (gemm) runs on the rayon pool of the thread that calls it. With W
//! ranks as threads all calling into one global pool of as many threads as cores, the W
//! rank threads run their own ops beside that pool's workers: up to W + cores busy threads
//! on `cores` cores. A budget gives each rank a pool of its own, of `cores / W` threads
//! (at least 1), and runs the rank inside it, so that the ranks together never ask for
//! more threads than there are cores.
//!
//! Candle also runs large element-wise ops on a pool of its own (`CANDLE_NUM_THREADS` - 1
//! workers, all cores by default), whose workers spin between ops and whose callers spin
//! until they finish; that pool knows nothing of rayon's. Beside the ranks and gemm's
//! workers they only take cores away: `examples/throughput` ran every strategy 1.1 to
//! 1.7 times faster without them on 2 cores. So the first accelerator wick makes sets
//! `CANDLE_NUM_THREADS=1` (no such workers) unless the variable is set already.

use wick_core::{Error, Result};

/// How many compute threads each rank gets.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ThreadBudget {
    /// `max(1, cores / ranks)` when ranks are threads and there are several; one rank
    /// uses Candle's global pool (all cores).
    #[default]
    Auto,
    /// This many threads per rank.
    PerRank(usize),
    /// Every rank on Candle's one global pool (no budget; what Candle does by itself).
    Shared,
}

impl ThreadBudget {
    /// `n` threads per rank (at least 1).
    pub fn per_rank(n: usize) -> Result<Self> {
        match n {
            0 => Err(Error::config(
                "threads_per_rank",
                "must be at least 1, got 0",
            )),
            n => Ok(ThreadBudget::PerRank(n)),
        }
    }

    /// The threads each of `ranks` rank threads gets; `None`: leave the rank on Candle's
    /// global pool.
    pub(crate) fn threads(self, ranks: usize) -> Option<usize> {
        match self {
            ThreadBudget::PerRank(n) => Some(n),
            ThreadBudget::Auto if ranks > 1 => {
                let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
                Some((cores / ranks).max(1))
            }
            ThreadBudget::Auto | ThreadBudget::Shared => None,
        }
    }
}

/// Keeps Candle's element-wise pool to the calling thread (`CANDLE_NUM_THREADS=1`) unless
/// the user set it; done once, before Candle makes the pool, which it does at its first
/// large element-wise op.
pub(crate) fn quiet_candle_elementwise_pool() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        if std::env::var_os("CANDLE_NUM_THREADS").is_none() {
            std::env::set_var("CANDLE_NUM_THREADS", "1");
        }
    });
}

/// Runs `f` inside a pool of `threads` threads (on one of them), or here when `None`.
pub(crate) fn run_within<T: Send>(threads: Option<usize>, f: impl FnOnce() -> T + Send) -> T {
    let pool = threads.and_then(|n| {
        rayon::ThreadPoolBuilder::new()
            .num_threads(n)
            .thread_name(|i| format!("wick-rank-compute-{i}"))
            .build()
            .ok()
    });
    match pool {
        Some(pool) => pool.install(f),
        None => f(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn auto_splits_the_cores_and_leaves_one_rank_alone() {
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        assert_eq!(ThreadBudget::Auto.threads(1), None);
        assert_eq!(ThreadBudget::Shared.threads(4), None);
        assert_eq!(ThreadBudget::Auto.threads(2), Some((cores / 2).max(1)));
        assert_eq!(ThreadBudget::Auto.threads(4 * cores), Some(1));
        assert_eq!(ThreadBudget::per_rank(3).unwrap().threads(8), Some(3));
        assert!(ThreadBudget::per_rank(0).is_err());
    }

    #[test]
    fn a_rank_runs_inside_its_pool() {
        assert_eq!(run_within(Some(3), rayon::current_num_threads), 3);
        assert_eq!(run_within(None, || 7), 7);
    }
}
