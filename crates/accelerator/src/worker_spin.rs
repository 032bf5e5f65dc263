//! `WorkerSpin`: the other threads of a rank's pool keep looking for work for a while after
//! their last job, as OpenMP's threads spin between parallel regions, instead of going to
//! sleep after rayon's few dozen microseconds.
//!
//! A step runs hundreds of parallel ops with serial work between them (dispatch, an
//! allocation, autograd's bookkeeping). An idle rayon worker sleeps within 50 µs, so each
//! op after a longer gap first wakes one, and on a virtual machine that took 18-67 µs
//! against 0.3-0.9 µs for a worker still looking (`cargo bench --bench pool_wake`, an AMD
//! EPYC VM, 2026-12-07; docs/performance.md has what it does to a step).
//!
//! Each worker but the rank's own runs one spinning job for the rank's whole run: it
//! takes whatever work the pool has (`rayon::yield_now`: its own queue, its broadcasts,
//! the others' queues, injected jobs, exactly what an idle worker looks for), yields the
//! core between looks, so that a busier thread on the same core goes first, and after
//! `spin` without work naps, 20 µs and then twice as long each time up to 250 µs. While it
//! naps rayon counts the worker as busy and does not wake it, so a job waits for the nap
//! to end or is run by the thread that queued it (as a join's second half is when nobody
//! steals it): after a pause longer than `spin`, the first op waited 93-120 µs (median)
//! where a sleeping rayon worker took 40-67.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// [`crate::Accelerator::with_worker_spin`]'s default: longer than the gaps between a
/// step's ops, short beside a pause (a checkpoint, a wait for a peer), where the worker
/// naps.
pub(crate) const DEFAULT_WORKER_SPIN: Duration = Duration::from_millis(5);

/// A napping worker's first sleep between two looks for work; each next one is twice as
/// long, up to [`LONGEST_NAP`].
const FIRST_NAP: Duration = Duration::from_micros(20);

/// How long a napping worker sleeps between two looks at most (the timer adds its slack):
/// about the longest a job waits for it after a long pause, where a sleeping rayon worker
/// took 18-67 µs to wake (`pool_wake`), against 4000 looks a second while the rank does
/// nothing in parallel.
const LONGEST_NAP: Duration = Duration::from_micros(250);

/// The spinning jobs of the pool this was made in; they end when it is dropped.
pub(crate) struct WorkerSpin {
    jobs: Arc<Jobs>,
}

/// What the spinning jobs share with their [`WorkerSpin`].
#[derive(Default)]
struct Jobs {
    stop: AtomicBool,
    /// How many are in their loop.
    running: AtomicUsize,
}

impl WorkerSpin {
    /// Starts a spinning job on every other worker of the current pool, each spinning
    /// `spin` after its last job before it naps; `None` for a zero `spin`, outside a pool,
    /// or in a pool of one thread.
    pub(crate) fn start(spin: Duration) -> Option<WorkerSpin> {
        let me = rayon::current_thread_index()?;
        if spin.is_zero() || rayon::current_num_threads() < 2 {
            return None;
        }
        let jobs = Arc::new(Jobs::default());
        let shared = jobs.clone();
        rayon::spawn_broadcast(move |worker| {
            if worker.index() != me {
                shared.running.fetch_add(1, Ordering::AcqRel);
                shared.spin(spin);
                shared.running.fetch_sub(1, Ordering::AcqRel);
            }
        });
        Some(WorkerSpin { jobs })
    }
}

impl Drop for WorkerSpin {
    fn drop(&mut self) {
        self.jobs.stop.store(true, Ordering::Release);
    }
}

impl Jobs {
    /// Runs the pool's work as it comes until stopped, spinning `spin` after each job,
    /// then napping between looks.
    fn spin(&self, spin: Duration) {
        let mut last_job = Instant::now();
        let mut nap = FIRST_NAP;
        while !self.stop.load(Ordering::Acquire) {
            match rayon::yield_now() {
                Some(rayon::Yield::Executed) => {
                    last_job = Instant::now();
                    nap = FIRST_NAP;
                }
                _ if last_job.elapsed() < spin => std::thread::yield_now(),
                _ => {
                    std::thread::sleep(nap);
                    nap = (2 * nap).min(LONGEST_NAP);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rayon::prelude::*;

    fn pool(threads: usize) -> rayon::ThreadPool {
        rayon::ThreadPoolBuilder::new()
            .num_threads(threads)
            .build()
            .unwrap()
    }

    #[test]
    fn the_pool_does_its_work_with_spinning_workers_and_broadcasts_reach_them() {
        let sum: u64 = pool(3).install(|| {
            let _spin = WorkerSpin::start(Duration::from_millis(50)).expect("a pool of 3");
            // The spinners take the halves of joins, parallel loops and broadcasts (one
            // copy a worker, which only that worker can run).
            let indices = rayon::broadcast(|worker| worker.index());
            assert_eq!(indices, vec![0, 1, 2]);
            // After a nap too, work still gets done.
            std::thread::sleep(Duration::from_millis(80));
            (0..100_000u64).into_par_iter().map(|i| i % 7).sum::<u64>()
        });
        assert_eq!(sum, (0..100_000u64).map(|i| i % 7).sum::<u64>());
    }

    #[test]
    fn a_spinning_worker_takes_the_second_half_of_a_join() {
        pool(2).install(|| {
            let _spin = WorkerSpin::start(Duration::from_secs(5)).expect("a pool of 2");
            let me = rayon::current_thread_index();
            let taken = AtomicBool::new(false);
            // Only another thread can run the second half while the first waits for it.
            let (_, other) = rayon::join(
                || {
                    while !taken.load(Ordering::Acquire) {
                        std::hint::spin_loop();
                    }
                },
                || {
                    taken.store(true, Ordering::Release);
                    rayon::current_thread_index()
                },
            );
            assert_ne!(other, me);
        });
    }

    #[test]
    fn no_spin_without_other_workers_or_time() {
        assert!(
            WorkerSpin::start(Duration::from_millis(5)).is_none(),
            "outside a pool"
        );
        pool(1).install(|| assert!(WorkerSpin::start(Duration::from_millis(5)).is_none()));
        pool(2).install(|| assert!(WorkerSpin::start(Duration::ZERO).is_none()));
    }

    #[test]
    fn the_spinners_end_with_the_run_even_when_it_panics() {
        let jobs = pool(3).install(|| {
            let spin = WorkerSpin::start(Duration::from_secs(600)).unwrap();
            let jobs = spin.jobs.clone();
            // Both other workers are in their loop before the run ends.
            let started = Instant::now();
            while jobs.running.load(Ordering::Acquire) < 2 {
                assert!(
                    started.elapsed() < Duration::from_secs(60),
                    "spinners never started"
                );
                std::thread::yield_now();
            }
            let panicked = std::panic::catch_unwind(std::panic::AssertUnwindSafe(move || {
                let _spin = spin;
                panic!("inside the run");
            }));
            assert!(panicked.is_err());
            jobs
        });
        let ended = Instant::now();
        while jobs.running.load(Ordering::Acquire) > 0 {
            assert!(
                ended.elapsed() < Duration::from_secs(60),
                "a spinner outlived its run"
            );
            std::thread::yield_now();
        }
    }
}
