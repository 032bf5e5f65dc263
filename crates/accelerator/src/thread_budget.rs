//! The compute threads each rank may use: when ranks are threads of one process, and,
//! asked for a number, when the rank is a process a launcher started.
//!
//! Candle's CPU matmul (gemm) runs on the rayon pool of the thread that calls it. With W
//! ranks as threads all calling into one global pool of as many threads as cores, the W
//! rank threads run their own ops beside that pool's workers: up to W + cores busy threads
//! on `cores` cores. A budget gives each rank a pool of its own, of `cores / W` threads
//! (at least 1), and runs the rank inside it, so that the ranks together never ask for
//! more threads than there are cores. A single rank gets a pool of all the cores the same
//! way: inside it the rank's own thread is one of the workers and works on each parallel op
//! itself, where from outside a pool it would hand every op to the workers and sleep until
//! they finish (the 20.2M Llama's single step ran 1.06x faster inside, 2026-12-07,
//! `docs/performance.md`). Several processes on one host have the same
//! problem, which the process cannot see (a launcher may start one per host or one per
//! core): there only [`ThreadBudget::PerRank`] makes a pool, as `torch.set_num_threads`
//! does in each of PyTorch's processes.
//!
//! The pool's other threads keep looking for work a while after each job instead of
//! sleeping at once ([`WorkerSpin`], `worker_spin.rs`), as OpenMP's threads do.
//!
//! Candle's own element-wise pool is a process-wide setting, left to the program: see
//! [`crate::tune_host_process`].

use crate::worker_spin::WorkerSpin;
use std::time::Duration;
use wick_core::{Error, Result};

/// How many compute threads each rank gets.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ThreadBudget {
    /// `max(1, cores / ranks)` when ranks are threads (all the cores for one rank).
    #[default]
    Auto,
    /// This many threads per rank, a thread or a launcher's process.
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
            ThreadBudget::Auto => {
                let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
                Some((cores / ranks.max(1)).max(1))
            }
            ThreadBudget::Shared => None,
        }
    }
}

/// Runs `f` inside a pool of `threads` threads (on one of them), whose other threads spin
/// `spin` after each job before they nap ([`WorkerSpin`]), or here when `None`.
pub(crate) fn run_within<T: Send>(
    threads: Option<usize>,
    spin: Duration,
    f: impl FnOnce() -> T + Send,
) -> T {
    let pool = threads.and_then(|n| {
        rayon::ThreadPoolBuilder::new()
            .num_threads(n)
            .thread_name(|i| format!("wick-rank-compute-{i}"))
            .build()
            .ok()
    });
    match pool {
        Some(pool) => pool.install(|| {
            let _spin = WorkerSpin::start(spin);
            f()
        }),
        None => f(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn auto_splits_the_cores_and_gives_one_rank_all_of_them() {
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        assert_eq!(ThreadBudget::Auto.threads(1), Some(cores));
        assert_eq!(ThreadBudget::Shared.threads(4), None);
        assert_eq!(ThreadBudget::Auto.threads(2), Some((cores / 2).max(1)));
        assert_eq!(ThreadBudget::Auto.threads(4 * cores), Some(1));
        assert_eq!(ThreadBudget::per_rank(3).unwrap().threads(8), Some(3));
        assert!(ThreadBudget::per_rank(0).is_err());
    }

    #[test]
    fn a_rank_runs_inside_its_pool() {
        let spin = Duration::from_millis(5);
        assert_eq!(run_within(Some(3), spin, rayon::current_num_threads), 3);
        assert_eq!(run_within(None, spin, || 7), 7);
    }
}
