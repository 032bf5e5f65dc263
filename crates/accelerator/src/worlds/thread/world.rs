//! `ThreadWorld`: W ranks as threads of one process. This file launches the ranks and
//! reports their failure and departure; `shared.rs` holds what they share, `comm.rs` one
//! rank's collectives.

use super::comm::ThreadComm;
use super::shared::Shared;
use std::sync::Arc;
use std::time::Duration;

/// How long a rank waits for its peers before a collective fails with a timeout.
const DEFAULT_TIMEOUT: Duration = Duration::from_secs(600);

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
            shared: Shared::new(size, timeout),
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

    /// Records that `rank` finished; worlds split from this one see it leave too.
    fn leave(&self, rank: usize) {
        self.shared.leave(rank);
    }

    /// Records that `rank` failed: every pending and later collective of the other ranks
    /// returns an error naming it.
    pub fn fail(&self, rank: usize, reason: impl Into<String>) {
        self.shared.fail(rank, rank, reason.into());
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
        self.run_each((0..self.size()).map(|_| ()).collect(), |comm, ()| f(comm))
    }

    /// [`ThreadWorld::run`] with an input of each rank's own: rank r's thread takes
    /// `inputs[r]` by value, so what a rank works on needs no lock to reach it.
    ///
    /// # Panics
    /// When `inputs` does not hold one input per rank.
    pub fn run_each<I, T, E, F>(&self, inputs: Vec<I>, f: F) -> Vec<Result<T, RankError<E>>>
    where
        I: Send,
        T: Send,
        E: std::fmt::Display + Send,
        F: Fn(ThreadComm, I) -> Result<T, E> + Sync,
    {
        assert_eq!(inputs.len(), self.size(), "one input per rank");
        std::thread::scope(|scope| {
            let handles: Vec<_> = inputs
                .into_iter()
                .enumerate()
                .map(|(rank, input)| {
                    let f = &f;
                    let comm = self.comm(rank);
                    std::thread::Builder::new()
                        .name(format!("wick-rank-{rank}"))
                        .spawn_scoped(scope, move || self.run_rank(rank, || f(comm, input)))
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

    fn run_rank<T, E: std::fmt::Display>(
        &self,
        rank: usize,
        f: impl FnOnce() -> Result<T, E>,
    ) -> Result<T, RankError<E>> {
        let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(f));
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
