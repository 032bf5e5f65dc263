//! `PendingSave`: a checkpoint whose files are written on a thread of their own while
//! training goes on (`ModelCheckpoint::async_save`), as Lightning's `AsyncCheckpointIO` and
//! PyTorch DCP's `async_save` do.
//!
//! The save began at a step boundary with this rank's state copied to host memory
//! ([`super::save::begin`]). A writer thread writes the rank's file and its record; rank 0
//! commits (manifest, rename, `last`) once every rank's record is there. At each later
//! step boundary [`PendingSave::poll`] brings a failed write out as this rank's error,
//! naming the file, and lets rank 0 commit when it can; no collective is spent. The next
//! save, the end of fit and a preemption [`wait_and_commit`](PendingSave::wait_and_commit) it: every rank
//! waits for its writer and the ranks agree that all files are whole before rank 0 commits.
//! A fit that fails waits for the writer too (on drop), and rank 0 still commits a
//! checkpoint whose every file is whole; what failed is printed, never lost.

use super::save::{Commit, RankWrite};
use super::CheckpointError;
use crate::TrainerError;
use candle_core::{Device, Tensor};
use std::path::PathBuf;
use std::thread::JoinHandle;
use wick_core::{Collective, CollectiveError, CollectiveExt, ReduceOp};

/// A rank's writer: its thread, or why none could be started (an error at the join, as a
/// failed write is, so the ranks still agree on the save).
enum Writer {
    Thread(JoinHandle<Result<(), CheckpointError>>),
    NotStarted(std::io::Error),
}

impl Writer {
    fn is_finished(&self) -> bool {
        match self {
            Writer::Thread(thread) => thread.is_finished(),
            Writer::NotStarted(_) => true,
        }
    }
}

/// A save in flight on one rank.
pub(crate) struct PendingSave {
    dir: PathBuf,
    /// This rank's writer, until its outcome is taken.
    writer: Option<Writer>,
    /// Rank 0's commit, until it is done.
    commit: Option<Commit>,
}

impl PendingSave {
    /// Starts writing `write` on a thread of its own.
    pub(crate) fn start(write: RankWrite, commit: Option<Commit>, dir: PathBuf) -> Self {
        let writer = match std::thread::Builder::new()
            .name("wick-checkpoint-writer".into())
            .spawn(move || write.write())
        {
            Ok(thread) => Writer::Thread(thread),
            Err(cause) => Writer::NotStarted(cause),
        };
        PendingSave {
            dir,
            writer: Some(writer),
            commit,
        }
    }

    /// At a step boundary (no collective): this rank's failed write is its error now; rank
    /// 0 commits once every rank's file is whole.
    pub(crate) fn poll(&mut self) -> Result<(), TrainerError> {
        if self.writer.as_ref().is_some_and(Writer::is_finished) {
            self.join()?;
        }
        if self.writer.is_none() && self.commit.as_ref().is_some_and(Commit::ready) {
            self.commit.take().expect("checked").commit()?;
        }
        Ok(())
    }

    /// Waits for every rank's file (a collective: every rank that started this save calls
    /// it, `device` being its world's) and commits: the checkpoint is whole and `last`
    /// names it when this returns.
    pub(crate) fn wait_and_commit(
        mut self,
        world: &dyn Collective,
        device: &Device,
    ) -> Result<(), TrainerError> {
        let own = self.join();
        // One slot per rank: which ranks could not write their file.
        let mut slots = vec![0f32; world.world_size()];
        slots[world.rank()] = f32::from(u8::from(own.is_err()));
        let slots = Tensor::from_vec(slots, world.world_size(), device)?;
        world.all_reduce_in_place(&slots, ReduceOp::Sum)?;
        own?;
        if let Some(rank) = slots.to_vec1::<f32>()?.iter().position(|&f| f > 0.0) {
            // That rank's own error names its file; this one only follows from it.
            return Err(CollectiveError::PeerFailed {
                rank,
                reason: format!(
                    "it could not write its file of checkpoint {}",
                    self.dir.display()
                ),
            }
            .into());
        }
        if let Some(commit) = self.commit.take() {
            commit.commit()?;
        }
        world.barrier()?;
        Ok(())
    }

    /// Waits for this rank's writer, once; its outcome.
    fn join(&mut self) -> Result<(), CheckpointError> {
        let failed = |cause| CheckpointError::Io {
            path: self.dir.clone(),
            cause,
        };
        match self.writer.take() {
            Some(Writer::Thread(writer)) => writer.join().unwrap_or_else(|_| {
                Err(failed(std::io::Error::other(
                    "the checkpoint writer panicked",
                )))
            }),
            Some(Writer::NotStarted(cause)) => Err(failed(std::io::Error::other(format!(
                "no thread could be started to write it: {cause}"
            )))),
            None => Ok(()),
        }
    }
}

impl Drop for PendingSave {
    /// A fit that ends with an error still waits for the write in flight, and commits it
    /// when every rank's file is whole; what fails here is logged, since the fit's own
    /// error is the one returned.
    fn drop(&mut self) {
        let joined = self.join();
        let committed = match self.commit.take() {
            Some(commit) if commit.ready() => commit.commit(),
            _ => Ok(()),
        };
        for e in [joined, committed].into_iter().filter_map(Result::err) {
            log::warn!("checkpoint {} was not saved: {e}", self.dir.display());
        }
    }
}
