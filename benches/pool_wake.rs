//! What a parallel op pays to start when the pool's other threads have gone to sleep: the
//! time of a `rayon::join` of two empty tasks on a pool of two threads, one of them run by
//! the other thread, right after the last join and after the calling thread worked alone
//! for a while. A training step runs hundreds of parallel ops with serial work between
//! them (the op's dispatch, an allocation, autograd's bookkeeping); rayon's idle workers
//! spin briefly and then sleep, so each op after a long enough gap first wakes a worker.
//! Where waking a thread is slow (a virtual machine, where an idle vCPU may be halted),
//! that cost lands on every op: a question the d512 single-process row leaves on CPUs
//! where it lags (docs/performance.md).
//!
//! The same joins then run inside a single rank's pool, whose other threads keep looking
//! for work for 5 ms after a job (`Accelerator::with_worker_spin`), and with that spin off.
//!
//! `cargo bench --bench pool_wake`

use std::hint::black_box;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};
use wick::accelerator::Accelerator;

/// Joins timed per gap.
const SAMPLES: usize = 200;

/// Keeps the calling thread busy (not sleeping, as a step's serial work would) for `gap`.
fn work_alone(gap: Duration) {
    let start = Instant::now();
    while start.elapsed() < gap {
        black_box(());
    }
}

/// The median and the 90th percentile of `SAMPLES` joins after `gap` of serial work each,
/// in microseconds. The calling thread's task waits until the other one has started, so a
/// join ends only once another thread took its second task, as the halves of an op must
/// for the op to run on both cores (on its own the caller would run both tasks itself).
fn join_after(gap: Duration) -> (f64, f64) {
    let mut times: Vec<f64> = (0..SAMPLES)
        .map(|_| {
            work_alone(gap);
            let taken = AtomicBool::new(false);
            let start = Instant::now();
            rayon::join(
                || {
                    while !taken.load(Ordering::Acquire) {
                        std::hint::spin_loop();
                    }
                },
                || taken.store(true, Ordering::Release),
            );
            start.elapsed().as_secs_f64() * 1e6
        })
        .collect();
    times.sort_by(f64::total_cmp);
    (times[SAMPLES / 2], times[SAMPLES * 9 / 10])
}

/// The joins after each gap, printed under `label`.
fn report(label: &str) {
    join_after(Duration::ZERO);
    for micros in [0, 10, 50, 100, 500, 1000, 5000, 20000] {
        let (median, p90) = join_after(Duration::from_micros(micros));
        println!(
            "pool_wake {label} gap_us={micros} join_us median {median:.1} p90 {p90:.1} \
             ({SAMPLES} joins)"
        );
    }
}

fn main() {
    // A pool of rayon's own.
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(2)
        .build()
        .expect("a pool of two threads");
    pool.install(|| report("rayon"));
    // A single rank's pool (all the cores), its other threads spinning 5 ms after a job
    // (`Accelerator::with_worker_spin`, the default) or not at all.
    for spin_ms in [5, 0] {
        let label = format!("rank_pool worker_spin_ms={spin_ms}");
        let runs = Accelerator::cpu(1)
            .expect("one rank")
            .with_worker_spin(Duration::from_millis(spin_ms))
            .launch(|_| {
                report(&label);
                Ok::<_, wick::core::Error>(())
            });
        for run in runs {
            run.expect("the rank ran");
        }
    }
}
