//! The two waits of an exchange between ranks as threads, which also know which ranks
//! failed or left, so that waiting on a rank that will never arrive ends in an error
//! instead of a hang, and no rank ever leaves while a peer may still read its buffers.
//!
//! An exchange is: publish, [`RankBarrier::open`], copy from peers, [`Closing`] (dropped).
//! - The opening wait is where a call can fail (a peer failed, left, or time ran out). A
//!   rank that gives up there withdraws its arrival under the lock, so the generation can
//!   never complete without it, and no peer ever reads the buffers of a rank that left.
//! - Past the opening wait every rank of the world is in the exchange, and what is left
//!   is bounded local work (copies between published buffers). The closing wait therefore
//!   waits for every rank unconditionally: cutting it short on a failure or a timeout
//!   would return to a caller that frees buffers a peer is still copying from. The
//!   [`Closing`] guard arrives on drop, so a panic inside the copies arrives too.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};
use wick_core::{lock, CollectiveError};

#[derive(Default)]
struct State {
    /// Ranks waiting at the opening wait of the current call.
    opened: usize,
    /// Ranks that arrived at the closing wait of the current call.
    closed: usize,
    /// Bumped each time every rank passed the opening wait.
    open_generation: u64,
    /// Bumped each time every rank passed the closing wait.
    close_generation: u64,
    failure: Option<(usize, String)>,
    left: Vec<bool>,
}

/// The opening and closing waits of `size` ranks' exchanges, with failure and departure
/// tracking.
pub(crate) struct RankBarrier {
    size: usize,
    /// Each rank's name in errors: its rank in the world the split worlds come from.
    names: Vec<usize>,
    /// Whether each rank of that first world waits in an opening wait, of this world or
    /// of any split from the same first world: a timeout names the ranks in none (they
    /// stalled), not those blocked in another world's call.
    waiting: Arc<[AtomicBool]>,
    state: Mutex<State>,
    wake: Condvar,
    timeout: Duration,
}

/// A rank past the opening wait: dropping it waits until every rank is past its copies.
#[must_use = "dropping it at once ends the exchange before this rank's copies"]
pub(crate) struct Closing<'a> {
    barrier: &'a RankBarrier,
}

impl Drop for Closing<'_> {
    fn drop(&mut self) {
        self.barrier.close();
    }
}

impl RankBarrier {
    /// The waits of ranks that errors name `names` (one each), which `waiting` flags (by
    /// name) while they wait.
    pub(crate) fn new(names: Vec<usize>, waiting: Arc<[AtomicBool]>, timeout: Duration) -> Self {
        let size = names.len();
        RankBarrier {
            size,
            names,
            waiting,
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

    fn wait_timeout<'a>(
        &self,
        state: MutexGuard<'a, State>,
        left: Duration,
    ) -> MutexGuard<'a, State> {
        self.wake
            .wait_timeout(state, left)
            .unwrap_or_else(|p| p.into_inner())
            .0
    }

    /// The opening wait: blocks until all ranks arrived, or fails (withdrawing this rank's
    /// arrival) when a rank failed, left or time ran out. On success the returned guard
    /// must live until this rank's copies are done.
    pub(crate) fn open(
        &self,
        rank: usize,
        op: &'static str,
    ) -> Result<Closing<'_>, CollectiveError> {
        let mut state = self.lock();
        if let Some(e) = self.gone(&state, rank, op) {
            return Err(e);
        }
        state.opened += 1;
        self.set_waiting(rank, true);
        if state.opened == self.size {
            state.opened = 0;
            self.names
                .iter()
                .for_each(|&n| self.waiting[n].store(false, Ordering::SeqCst));
            state.open_generation = state.open_generation.wrapping_add(1);
            self.wake.notify_all();
            return Ok(Closing { barrier: self });
        }
        let generation = state.open_generation;
        let deadline = Instant::now() + self.timeout;
        loop {
            if state.open_generation != generation {
                return Ok(Closing { barrier: self });
            }
            let now = Instant::now();
            let error = self.gone(&state, rank, op).or_else(|| {
                (now >= deadline).then(|| CollectiveError::Timeout {
                    rank: self.names[rank],
                    op,
                    seconds: self.timeout.as_secs(),
                    missing: (0..self.waiting.len())
                        .filter(|&r| {
                            r != self.names[rank] && !self.waiting[r].load(Ordering::SeqCst)
                        })
                        .collect(),
                })
            });
            if let Some(error) = error {
                // Withdrawn under the same lock that completes a generation: the ranks
                // still waiting can no longer pass without this one.
                state.opened -= 1;
                self.set_waiting(rank, false);
                return Err(error);
            }
            state = self.wait_timeout(state, deadline - now);
        }
    }

    fn set_waiting(&self, rank: usize, on: bool) {
        self.waiting[self.names[rank]].store(on, Ordering::SeqCst);
    }

    /// Why the ranks can no longer all meet: a failure, or a rank that left.
    fn gone(&self, state: &State, rank: usize, op: &'static str) -> Option<CollectiveError> {
        if let Some((failed, reason)) = &state.failure {
            return Some(CollectiveError::PeerFailed {
                rank: *failed,
                reason: reason.clone(),
            });
        }
        state
            .left
            .iter()
            .position(|&l| l)
            .map(|gone| CollectiveError::PeerLeft {
                rank: self.names[gone],
                waiting: self.names[rank],
                op,
            })
    }

    /// The closing wait: blocks until every rank arrived. Neither a failure nor the time
    /// ends it: every rank is past the opening wait, so each arrives after bounded local
    /// work (or when its guard is dropped by a panic), and returning earlier would let the
    /// caller free buffers a peer still copies from.
    fn close(&self) {
        let mut state = self.lock();
        state.closed += 1;
        if state.closed == self.size {
            state.closed = 0;
            state.close_generation = state.close_generation.wrapping_add(1);
            self.wake.notify_all();
            return;
        }
        let generation = state.close_generation;
        while state.close_generation == generation {
            state = self.wait_timeout(state, self.timeout);
        }
    }

    /// Records that `rank` failed; every waiting and later opening wait errors with its
    /// reason. Only the first failure is kept: later ones are usually consequences of it.
    pub(crate) fn fail(&self, rank: usize, reason: String) {
        let mut state = self.lock();
        if state.failure.is_none() {
            state.failure = Some((rank, reason));
        }
        self.wake.notify_all();
    }

    /// The wait flags this world shares with the worlds split from the same first one.
    pub(crate) fn waiting(&self) -> Arc<[AtomicBool]> {
        self.waiting.clone()
    }

    /// How errors name `rank`.
    pub(crate) fn name(&self, rank: usize) -> usize {
        self.names[rank]
    }

    /// Records in `child` (a world of `members`, ranks here) the failure here if one of
    /// them failed, and which of them left.
    pub(crate) fn pass_on(&self, child: &RankBarrier, members: &[usize]) {
        let state = self.lock();
        if let Some((failed, reason)) = &state.failure {
            if members.iter().any(|&m| self.names[m] == *failed) {
                child.fail(*failed, reason.clone());
            }
        }
        for (sub, &m) in members.iter().enumerate() {
            if state.left[m] {
                child.leave(sub);
            }
        }
    }

    /// The failure recorded, if any.
    #[cfg(test)]
    pub(crate) fn failure(&self) -> Option<(usize, String)> {
        self.lock().failure.clone()
    }

    /// Records that `rank` finished and will make no more calls.
    pub(crate) fn leave(&self, rank: usize) {
        let mut state = self.lock();
        state.left[rank] = true;
        self.wake.notify_all();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicBool, Ordering};

    /// A barrier of ranks 0 and 1 whose waits time out after `timeout`.
    fn two_ranks(timeout: Duration) -> Arc<RankBarrier> {
        let flags = (0..2).map(|_| AtomicBool::new(false)).collect();
        Arc::new(RankBarrier::new(vec![0, 1], flags, timeout))
    }

    #[test]
    fn a_failure_does_not_end_the_closing_wait_while_a_peer_copies() {
        let barrier = two_ranks(Duration::from_millis(50));
        let copied = Arc::new(AtomicBool::new(false));
        let peer = {
            let (barrier, copied) = (barrier.clone(), copied.clone());
            std::thread::spawn(move || {
                let closing = barrier.open(1, "test").unwrap();
                // Longer than the timeout: the closing wait must outlast it too.
                std::thread::sleep(Duration::from_millis(300));
                copied.store(true, Ordering::SeqCst);
                drop(closing);
            })
        };
        let closing = barrier.open(0, "test").unwrap();
        barrier.fail(1, "boom".into());
        drop(closing);
        assert!(
            copied.load(Ordering::SeqCst),
            "rank 0 left the exchange while rank 1 was still copying"
        );
        peer.join().unwrap();
        // The failure ends the next opening wait, at once.
        let e = barrier.open(0, "test").err().unwrap().to_string();
        assert!(e.contains("rank 1 failed"), "{e}");
    }

    #[test]
    fn a_timed_out_opening_wait_withdraws_its_arrival() {
        let barrier = two_ranks(Duration::from_millis(50));
        let e = barrier.open(0, "test").err().unwrap().to_string();
        assert!(
            e.contains("timed out") && e.contains("waiting for rank 1"),
            "{e}"
        );
        // Rank 1 comes late: without rank 0's withdrawal it would complete the generation
        // alone and read the buffers of a rank that has returned.
        let e = barrier.open(1, "test").err().unwrap().to_string();
        assert!(e.contains("timed out"), "{e}");
    }

    #[test]
    fn a_panic_inside_the_copies_still_arrives_at_the_closing_wait() {
        let barrier = two_ranks(Duration::from_secs(600));
        let peer = {
            let barrier = barrier.clone();
            std::thread::spawn(move || {
                let _closing = barrier.open(1, "test").unwrap();
                panic!("inside the copies");
            })
        };
        let closing = barrier.open(0, "test").unwrap();
        drop(closing);
        assert!(peer.join().is_err());
    }
}
