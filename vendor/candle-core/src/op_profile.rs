//! The time each class of op takes, for profiling a training step (wick's copy only).
//!
//! Off until [`set_enabled`]`(true)`; while off an op pays one relaxed atomic load. While on,
//! every op that goes through a storage (`Storage`'s methods: matmul, copies, element-wise
//! and reduction kernels, index ops, custom ops) is timed on the thread that calls it, and
//! its time is added to its class. Times are exclusive: an op that runs other ops (a custom
//! op's forward, which may build a small graph) counts only its own time, and the inner
//! ops count in their classes. A [`scope`] counts everything inside it as its own class
//! (an optimizer step). Ops run during [`Tensor::backward`](crate::Tensor::backward) are
//! told apart ([`in_backward`]), so a matmul there counts as `matmul_backward`.
//!
//! On CUDA an op's time is its launch, not its run: the kernels are asynchronous.

use std::cell::RefCell;
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

static ENABLED: AtomicBool = AtomicBool::new(false);

/// Every thread's totals, so that [`take`] sees them all.
static THREADS: OnceLock<Mutex<Vec<Arc<Mutex<Totals>>>>> = OnceLock::new();

/// Time and count per class.
type Totals = HashMap<&'static str, (Duration, u64)>;

struct Frame {
    class: &'static str,
    start: Instant,
    /// A scope: the ops inside it are not timed on their own.
    scope: bool,
    /// An op inside a scope: not timed.
    silent: bool,
}

struct ThreadState {
    stack: Vec<Frame>,
    backward: usize,
    totals: Arc<Mutex<Totals>>,
}

thread_local! {
    static STATE: RefCell<ThreadState> = RefCell::new({
        let totals = Arc::new(Mutex::new(Totals::new()));
        let threads = THREADS.get_or_init(|| Mutex::new(Vec::new()));
        threads.lock().unwrap_or_else(|e| e.into_inner()).push(totals.clone());
        ThreadState { stack: Vec::new(), backward: 0, totals }
    });
}

/// Turns profiling on or off for every thread.
pub fn set_enabled(on: bool) {
    ENABLED.store(on, Ordering::Relaxed);
}

/// Whether profiling is on.
pub fn enabled() -> bool {
    ENABLED.load(Ordering::Relaxed)
}

/// Every class's total time and count since the last call, summed over threads; resets them.
pub fn take() -> Vec<(&'static str, Duration, u64)> {
    let mut sum = Totals::new();
    if let Some(threads) = THREADS.get() {
        for t in threads.lock().unwrap_or_else(|e| e.into_inner()).iter() {
            for (class, (time, count)) in t.lock().unwrap_or_else(|e| e.into_inner()).drain() {
                let entry = sum.entry(class).or_default();
                entry.0 += time;
                entry.1 += count;
            }
        }
    }
    let mut out: Vec<_> = sum.into_iter().map(|(c, (t, n))| (c, t, n)).collect();
    out.sort_by(|a, b| b.1.cmp(&a.1));
    out
}

/// Times the op it guards (see [`op`]).
#[must_use]
pub struct Timed(());

impl Drop for Timed {
    fn drop(&mut self) {
        STATE.with(|s| {
            let mut s = s.borrow_mut();
            let now = Instant::now();
            let Some(frame) = s.stack.pop() else {
                return;
            };
            // An op inside a scope was never timed: the scope's time runs on.
            if frame.silent {
                return;
            }
            {
                let mut totals = s.totals.lock().unwrap_or_else(|e| e.into_inner());
                let entry = totals.entry(frame.class).or_default();
                entry.0 += now - frame.start;
                entry.1 += 1;
            }
            // The enclosing op resumes its own time.
            if let Some(parent) = s.stack.last_mut() {
                parent.start = now;
            }
        });
    }
}

fn enter(class: &'static str, scope: bool) -> Option<Timed> {
    if !enabled() {
        return None;
    }
    STATE.with(|s| {
        let mut s = s.borrow_mut();
        let now = Instant::now();
        let inside_scope = s.stack.last().is_some_and(|f| f.scope || f.silent);
        if let Some(parent) = s.stack.last() {
            if !inside_scope {
                // The enclosing op's time so far is its own; it stops while this one runs.
                let (class, spent) = (parent.class, now - parent.start);
                let mut totals = s.totals.lock().unwrap_or_else(|e| e.into_inner());
                totals.entry(class).or_default().0 += spent;
            }
        }
        s.stack.push(Frame {
            class,
            start: now,
            scope,
            silent: inside_scope,
        });
    });
    Some(Timed(()))
}

/// Times an op of `class` until the guard drops (nothing while profiling is off).
pub fn op(class: &'static str) -> Option<Timed> {
    enter(class, false)
}

/// Counts everything until the guard drops as `class`, ops included.
pub fn scope(class: &'static str) -> Option<Timed> {
    enter(class, true)
}

/// Whether this thread is inside a backward pass.
pub fn in_backward() -> bool {
    enabled() && STATE.with(|s| s.borrow().backward > 0)
}

/// Marks this thread as inside a backward pass until the guard drops.
pub(crate) struct Backward(bool);

impl Backward {
    pub(crate) fn enter() -> Self {
        let on = enabled();
        if on {
            STATE.with(|s| s.borrow_mut().backward += 1);
        }
        Backward(on)
    }
}

impl Drop for Backward {
    fn drop(&mut self) {
        if self.0 {
            STATE.with(|s| s.borrow_mut().backward -= 1);
        }
    }
}

/// The class of a matmul, by where it runs.
pub(crate) fn matmul_class() -> &'static str {
    if in_backward() {
        "matmul_backward"
    } else {
        "matmul"
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn times_are_exclusive_and_scopes_take_their_ops() {
        set_enabled(true);
        take();
        {
            let _outer = op("outer");
            std::thread::sleep(Duration::from_millis(20));
            {
                let _inner = op("inner");
                std::thread::sleep(Duration::from_millis(30));
            }
        }
        {
            let _s = scope("scope");
            let _inner = op("inner");
            std::thread::sleep(Duration::from_millis(10));
        }
        set_enabled(false);
        let got: HashMap<_, _> = take().into_iter().map(|(c, t, n)| (c, (t, n))).collect();
        let ms = |c: &str| got[c].0.as_millis();
        assert!((20..29).contains(&ms("outer")), "{got:?}");
        assert!((30..39).contains(&ms("inner")), "{got:?}");
        assert_eq!(got["inner"].1, 1, "the op inside the scope is not its own");
        assert!((10..19).contains(&ms("scope")), "{got:?}");
    }
}
