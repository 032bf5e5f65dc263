//! `Preemption`: a fit that stops cleanly when a scheduler asks it to, as Lightning's SLURM
//! environment does.
//!
//! A signal only raises a flag. At the next step boundary the ranks agree on it with one
//! scalar all-reduce, so a signal that reached one process (as `kill` on one rank under
//! `mpirun` does) stops them all after the same optimizer step. Every rank then saves a
//! checkpoint of that step, and `fit` returns [`TrainerError::Interrupted`](crate::TrainerError::Interrupted).
//! A second signal while that happens ends the process at once with status 128 + the
//! signal: the checkpoint being written stays under its temporary name and `last` still
//! names the one before, since `last` moves only after a checkpoint is whole.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};

/// The signals [`Preemption::on_signals`] catches: SIGTERM (Slurm's preemption, its time
/// limit, `scancel`, `scontrol requeue`), SIGINT (Ctrl-C) and SIGUSR1 (`sbatch
/// --signal=USR1@90`, a warning ahead of the limit).
#[cfg(unix)]
pub const PREEMPTION_SIGNALS: [i32; 3] = [
    signal_hook::consts::SIGTERM,
    signal_hook::consts::SIGINT,
    signal_hook::consts::SIGUSR1,
];

/// A flag that asks a fit to stop after its current optimizer step and save; give it to
/// [`TrainerBuilder::preemption`](crate::TrainerBuilder::preemption). Clones share the flag.
#[derive(Clone, Debug, Default)]
pub struct Preemption {
    /// 0 while nothing asked; otherwise the signal that did.
    signal: Arc<AtomicUsize>,
}

impl Preemption {
    /// A preemption only [`Preemption::request`] asks for: for tests, or for an application
    /// that handles signals itself.
    pub fn manual() -> Self {
        Self::default()
    }

    /// Catches [`PREEMPTION_SIGNALS`] for the whole process. Handlers are installed once;
    /// later calls return the same flag.
    #[cfg(unix)]
    pub fn on_signals() -> std::io::Result<Self> {
        static CAUGHT: OnceLock<Preemption> = OnceLock::new();
        if let Some(p) = CAUGHT.get() {
            return Ok(p.clone());
        }
        let preemption = Preemption::default();
        let arrived = Arc::new(AtomicBool::new(false));
        for signal in PREEMPTION_SIGNALS {
            let status = 128 + signal;
            // Registered first, so it sees the flag as it was before this signal: set by
            // an earlier one, it ends the process.
            signal_hook::flag::register_conditional_shutdown(signal, status, arrived.clone())?;
            signal_hook::flag::register(signal, arrived.clone())?;
            let value = usize::try_from(signal).unwrap_or(usize::MAX);
            signal_hook::flag::register_usize(signal, preemption.signal.clone(), value)?;
        }
        Ok(CAUGHT.get_or_init(|| preemption).clone())
    }

    /// Asks for a stop as `signal` would.
    pub fn request(&self, signal: i32) {
        let value = usize::try_from(signal).unwrap_or(usize::MAX).max(1);
        self.signal.store(value, Ordering::SeqCst);
    }

    /// The signal that asked for a stop, if one did.
    pub fn requested(&self) -> Option<i32> {
        match self.signal.load(Ordering::SeqCst) {
            0 => None,
            s => Some(i32::try_from(s).unwrap_or(i32::MAX)),
        }
    }
}

/// How a rank's fit ended when a preemption stopped it: returned as a rank's output, not
/// its error, since the ranks stopped together (under a launcher a rank's error ends the
/// job), and made [`TrainerError::Interrupted`](crate::TrainerError::Interrupted) by the trainer.
pub(crate) struct Interruption {
    pub(crate) signal: Option<i32>,
    pub(crate) step: usize,
    pub(crate) checkpoint: Option<std::path::PathBuf>,
}

impl From<Interruption> for crate::TrainerError {
    fn from(i: Interruption) -> Self {
        crate::TrainerError::Interrupted {
            signal: i.signal,
            step: i.step,
            checkpoint: i.checkpoint,
        }
    }
}

/// A signal's usual name (`SIGTERM`), or its number.
pub(crate) fn signal_name(signal: i32) -> String {
    #[cfg(unix)]
    if let Some(name) = signal_hook::low_level::signal_name(signal) {
        return name.to_string();
    }
    format!("signal {signal}")
}

#[cfg(all(test, unix))]
mod tests {
    use super::*;

    #[test]
    fn a_request_is_seen_by_every_clone() {
        let p = Preemption::manual();
        let q = p.clone();
        assert_eq!(q.requested(), None);
        p.request(signal_hook::consts::SIGTERM);
        assert_eq!(q.requested(), Some(signal_hook::consts::SIGTERM));
        assert_eq!(signal_name(signal_hook::consts::SIGTERM), "SIGTERM");
    }
}
