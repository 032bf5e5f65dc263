//! `ThreadWorld`: W ranks as threads of one process. This file holds the world (its shared
//! call slots and barrier, launching ranks, failure and departure, split sub-worlds);
//! `thread_comm.rs` holds one rank's collectives over it.

use crate::barrier::RankBarrier;
use crate::thread_comm::ThreadComm;
use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use wick_core::lock;

/// How long a rank waits for its peers before a collective fails with a timeout.
const DEFAULT_TIMEOUT: Duration = Duration::from_secs(600);

/// What one rank published for the call in progress. Written by its owner before the first
/// barrier and read by peers after it; the barrier's lock orders the accesses.
#[derive(Default)]
pub(crate) struct Slot {
    op: AtomicUsize,
    arg: AtomicUsize,
    dtype: AtomicUsize,
    src: AtomicUsize,
    src_len: AtomicUsize,
    dst: AtomicUsize,
    dst_len: AtomicUsize,
}

#[derive(Clone, Copy)]
pub(crate) struct Published {
    pub(crate) op: usize,
    pub(crate) arg: usize,
    /// The element type (`thread_comm::dtype_code`); lengths count elements.
    pub(crate) dtype: usize,
    pub(crate) src: *const u8,
    pub(crate) src_len: usize,
    pub(crate) dst: *mut u8,
    pub(crate) dst_len: usize,
}

impl Slot {
    pub(crate) fn publish(&self, p: Published) {
        self.op.store(p.op, Ordering::Relaxed);
        self.arg.store(p.arg, Ordering::Relaxed);
        self.dtype.store(p.dtype, Ordering::Relaxed);
        self.src.store(p.src as usize, Ordering::Relaxed);
        self.src_len.store(p.src_len, Ordering::Relaxed);
        self.dst.store(p.dst as usize, Ordering::Relaxed);
        self.dst_len.store(p.dst_len, Ordering::Relaxed);
    }

    pub(crate) fn read(&self) -> Published {
        Published {
            op: self.op.load(Ordering::Relaxed),
            arg: self.arg.load(Ordering::Relaxed),
            dtype: self.dtype.load(Ordering::Relaxed),
            src: self.src.load(Ordering::Relaxed) as *const u8,
            src_len: self.src_len.load(Ordering::Relaxed),
            dst: self.dst.load(Ordering::Relaxed) as *mut u8,
            dst_len: self.dst_len.load(Ordering::Relaxed),
        }
    }
}

pub(crate) struct Shared {
    pub(crate) size: usize,
    pub(crate) slots: Vec<Slot>,
    pub(crate) barrier: RankBarrier,
    pub(crate) timeout: Duration,
    /// Worlds split from this one, keyed by (split call, color), with their members' ranks
    /// here: a failure or departure here is passed on to them.
    pub(crate) children: Mutex<HashMap<(u64, usize), Child>>,
}

/// A world split from another: its members' ranks in the parent, and the world.
pub(crate) type Child = (Vec<usize>, ThreadWorld);

/// A world of ranks that are threads of this process.
#[derive(Clone)]
pub struct ThreadWorld {
    shared: Arc<Shared>,
}

/// Why a rank of [`ThreadWorld::run`] did not return a value.
#[derive(Debug, thiserror::Error)]
pub enum RankError<E> {
    /// The rank's closure returned an error.
    #[error("{0}")]
    Failed(E),
    /// The rank's closure panicked.
    #[error("panicked: {0}")]
    Panicked(String),
}

impl ThreadWorld {
    /// A world of `size` ranks (at least 1).
    pub fn new(size: usize) -> Self {
        Self::with_timeout(size, DEFAULT_TIMEOUT)
    }

    /// A world whose collectives give up after `timeout` without progress.
    pub fn with_timeout(size: usize, timeout: Duration) -> Self {
        assert!(size > 0, "a world needs at least one rank");
        ThreadWorld {
            shared: Arc::new(Shared {
                size,
                slots: (0..size).map(|_| Slot::default()).collect(),
                barrier: RankBarrier::new(size, timeout),
                timeout,
                children: Mutex::default(),
            }),
        }
    }

    /// The number of ranks.
    pub fn size(&self) -> usize {
        self.shared.size
    }

    /// The handle rank `rank` uses to take part in collectives.
    pub fn comm(&self, rank: usize) -> ThreadComm {
        assert!(rank < self.shared.size, "rank {rank} out of range");
        ThreadComm::new(rank, self.shared.clone())
    }

    fn children(&self) -> Vec<Child> {
        let children = lock(&self.shared.children);
        children.values().cloned().collect()
    }

    /// Records that `rank` finished; worlds split from this one see it leave too.
    fn leave(&self, rank: usize) {
        self.shared.barrier.leave(rank);
        for (members, child) in self.children() {
            if let Some(sub) = members.iter().position(|&m| m == rank) {
                child.leave(sub);
            }
        }
    }

    /// Records that `rank` failed: every pending and later collective of the other ranks
    /// returns an error naming it.
    pub fn fail(&self, rank: usize, reason: impl Into<String>) {
        let reason = reason.into();
        self.shared.barrier.fail(rank, reason.clone());
        for (_, child) in self.children() {
            child.fail(rank, reason.clone());
        }
    }

    /// Runs `f` on every rank, each on its own thread, and returns each rank's outcome in
    /// rank order. A rank that errors or panics is reported to the others at once, so none
    /// of them hangs waiting for it.
    pub fn run<T, E, F>(&self, f: F) -> Vec<Result<T, RankError<E>>>
    where
        T: Send,
        E: std::fmt::Display + Send,
        F: Fn(ThreadComm) -> Result<T, E> + Sync,
    {
        std::thread::scope(|scope| {
            let handles: Vec<_> = (0..self.size())
                .map(|rank| {
                    let f = &f;
                    let comm = self.comm(rank);
                    std::thread::Builder::new()
                        .name(format!("wick-rank-{rank}"))
                        .spawn_scoped(scope, move || self.run_rank(rank, comm, f))
                        .expect("spawning a rank thread")
                })
                .collect();
            handles
                .into_iter()
                .map(|h| {
                    h.join()
                        .unwrap_or_else(|p| Err(RankError::Panicked(panic_message(&p))))
                })
                .collect()
        })
    }

    fn run_rank<T, E: std::fmt::Display, F: Fn(ThreadComm) -> Result<T, E>>(
        &self,
        rank: usize,
        comm: ThreadComm,
        f: &F,
    ) -> Result<T, RankError<E>> {
        let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| f(comm)));
        match outcome {
            Ok(Ok(value)) => {
                self.leave(rank);
                Ok(value)
            }
            Ok(Err(e)) => {
                self.fail(rank, e.to_string());
                Err(RankError::Failed(e))
            }
            Err(payload) => {
                let message = panic_message(&payload);
                self.fail(rank, format!("panicked: {message}"));
                Err(RankError::Panicked(message))
            }
        }
    }
}

pub(crate) fn panic_message(payload: &Box<dyn std::any::Any + Send>) -> String {
    if let Some(s) = payload.downcast_ref::<&str>() {
        s.to_string()
    } else if let Some(s) = payload.downcast_ref::<String>() {
        s.clone()
    } else {
        "unknown panic payload".to_string()
    }
}
