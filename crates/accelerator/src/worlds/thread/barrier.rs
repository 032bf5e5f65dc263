//! A reusable barrier that also knows which ranks failed or left, so waiting on a rank that
//! will never arrive ends in an error instead of a hang.

use std::sync::{Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};
use wick_core::{lock, CollectiveError};

#[derive(Default)]
struct State {
    arrived: usize,
    generation: u64,
    failure: Option<(usize, String)>,
    left: Vec<bool>,
}

/// Generation-counting barrier for `size` ranks, with failure and departure tracking.
pub(crate) struct RankBarrier {
    size: usize,
    state: Mutex<State>,
    wake: Condvar,
    timeout: Duration,
}

impl RankBarrier {
    pub(crate) fn new(size: usize, timeout: Duration) -> Self {
        RankBarrier {
            size,
            state: Mutex::new(State {
                left: vec![false; size],
                ..State::default()
            }),
            wake: Condvar::new(),
            timeout,
        }
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // A panic while holding this lock cannot leave the counters half-updated (every
        // update is a single assignment), so a poisoned lock is still consistent.
        lock(&self.state)
    }

    /// Blocks until all ranks arrived, or fails when a rank failed, left or time ran out.
    pub(crate) fn wait(&self, rank: usize, op: &'static str) -> Result<(), CollectiveError> {
        let mut state = self.lock();
        if let Some((failed, reason)) = &state.failure {
            return Err(CollectiveError::PeerFailed {
                rank: *failed,
                reason: reason.clone(),
            });
        }
        state.arrived += 1;
        if state.arrived == self.size {
            state.arrived = 0;
            state.generation = state.generation.wrapping_add(1);
            self.wake.notify_all();
            return Ok(());
        }
        let generation = state.generation;
        let deadline = Instant::now() + self.timeout;
        loop {
            if state.generation != generation {
                return Ok(());
            }
            if let Some((failed, reason)) = &state.failure {
                return Err(CollectiveError::PeerFailed {
                    rank: *failed,
                    reason: reason.clone(),
                });
            }
            if let Some(gone) = state.left.iter().position(|&l| l) {
                return Err(CollectiveError::PeerLeft {
                    rank: gone,
                    waiting: rank,
                    op,
                });
            }
            let now = Instant::now();
            if now >= deadline {
                return Err(CollectiveError::Timeout {
                    rank,
                    op,
                    seconds: self.timeout.as_secs(),
                });
            }
            state = self
                .wake
                .wait_timeout(state, deadline - now)
                .unwrap_or_else(|p| p.into_inner())
                .0;
        }
    }

    /// Records that `rank` failed; every waiting and later call errors with its reason.
    /// Only the first failure is kept: later ones are usually consequences of it.
    pub(crate) fn fail(&self, rank: usize, reason: String) {
        let mut state = self.lock();
        if state.failure.is_none() {
            state.failure = Some((rank, reason));
        }
        self.wake.notify_all();
    }

    /// Records that `rank` finished and will make no more calls.
    pub(crate) fn leave(&self, rank: usize) {
        let mut state = self.lock();
        state.left[rank] = true;
        self.wake.notify_all();
    }
}
