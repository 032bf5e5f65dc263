//! `ModelCheckpoint`: when to save during fit, which checkpoints to keep, and the `last`
//! pointer, as Lightning's callback of the same name.

use super::fault::SaveFault;
use super::files::{temporary, write_atomic};
use super::manifest::Manifest;
use super::CheckpointError;
use std::cmp::Ordering;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// The file in a checkpoint root that names the newest checkpoint.
pub const LAST_FILE: &str = "last";

/// Saves checkpoints under one root directory during [`Trainer::fit`](crate::Trainer::fit):
/// every N optimizer steps and at the end of fit, each as `step-<step>/`; keeps the last K
/// and the best K by a logged metric (the union of both; all when neither is set); and
/// points the file `last` at the newest, updated only after that checkpoint is complete.
///
/// A root belongs to one run. A fit that does not resume, given a root that already holds
/// checkpoints (a `last` file or `step-*` entries), saves under the first free version of
/// it instead, `<root>-v1`, `<root>-v2`, ..., and never touches the other run's
/// ([`Trainer::checkpoint_dir`](crate::Trainer::checkpoint_dir) tells which). A resumed fit
/// keeps saving under the root of the checkpoint it resumed from, when that is this root or
/// a version of it.
#[derive(Clone)]
pub struct ModelCheckpoint {
    root: PathBuf,
    every_n_steps: Option<usize>,
    save_at_end: bool,
    keep_last: Option<usize>,
    keep_best: Option<(usize, String, Mode)>,
    async_save: bool,
    fault: Option<SaveFault>,
    attachments: Vec<(String, Arc<Vec<u8>>)>,
}

/// Whether smaller or larger values of a monitored metric are better.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// Smaller is better (losses).
    Min,
    /// Larger is better (accuracies).
    Max,
}

impl ModelCheckpoint {
    /// Saves under `root` at the end of fit (add [`ModelCheckpoint::every_n_steps`] for more).
    pub fn new(root: impl Into<PathBuf>) -> Self {
        ModelCheckpoint {
            root: root.into(),
            every_n_steps: None,
            save_at_end: true,
            keep_last: None,
            keep_best: None,
            async_save: false,
            fault: None,
            attachments: Vec::new(),
        }
    }

    /// Also save after every `n` optimizer steps.
    pub fn every_n_steps(mut self, n: usize) -> Self {
        self.every_n_steps = Some(n.max(1));
        self
    }

    /// Whether to save when fit ends (default true).
    pub fn save_at_end(mut self, on: bool) -> Self {
        self.save_at_end = on;
        self
    }

    /// Keep only the `k` newest checkpoints (besides the best ones, if kept).
    pub fn keep_last(mut self, k: usize) -> Self {
        self.keep_last = Some(k);
        self
    }

    /// Keep the `k` best checkpoints by `metric` (as logged: `val_loss`, `train_loss`).
    pub fn keep_best(mut self, k: usize, metric: &str, mode: Mode) -> Self {
        self.keep_best = Some((k, metric.to_string(), mode));
        self
    }

    /// Write the checkpoints saved during fit in the background (Lightning's
    /// `AsyncCheckpointIO`): at the step boundary each rank copies its state to host
    /// memory and training goes on while a thread of its own writes it. At most one save is
    /// in flight: the next save, the end of fit and a preemption wait for it. A write that
    /// fails is an error at a later step boundary (or at the end of fit), naming the file.
    /// A checkpoint stays whole or absent as with blocking saves: `last` moves only once
    /// every rank's file is written. The save at the end of fit is written before fit
    /// returns either way. Costs a copy of the rank's state in host memory while it
    /// writes.
    pub fn async_save(mut self, on: bool) -> Self {
        self.async_save = on;
        self
    }

    /// Whether saves during fit are written in the background.
    pub(crate) fn is_async(&self) -> bool {
        self.async_save
    }

    /// Saves `bytes` as the file `name` in every checkpoint, beside the state, such as a
    /// model's `config.json` and `tokenizer.json` ([`Checkpoint::attachment`](super::Checkpoint::attachment)
    /// reads it back; the manifest records its length and checksum). `name` is a plain file
    /// name other than the checkpoint's own (`manifest.json`, `rank-<r>.safetensors`).
    pub fn with_attachment(mut self, name: &str, bytes: Vec<u8>) -> Self {
        self.attachments.retain(|(n, _)| n != name);
        self.attachments.push((name.to_string(), Arc::new(bytes)));
        self
    }

    /// The files saved beside the state.
    pub(crate) fn attachments(&self) -> &[(String, Arc<Vec<u8>>)] {
        &self.attachments
    }

    /// Calls `fault` at each [`SavePoint`](super::SavePoint) of every save; an `Err` aborts
    /// the save there as a crash would. For crash-safety tests.
    pub fn with_fault_injection(mut self, fault: SaveFault) -> Self {
        self.fault = Some(fault);
        self
    }

    /// The root directory.
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// The same rules saving under `root` (the root a fit resolved: a version of this one
    /// when this one holds another run's checkpoints).
    pub(crate) fn under(&self, root: PathBuf) -> Self {
        ModelCheckpoint {
            root,
            ..self.clone()
        }
    }

    pub(crate) fn fault(&self) -> Option<&SaveFault> {
        self.fault.as_ref()
    }

    /// Whether a save is due after optimizer step `step`.
    pub(crate) fn due(&self, step: usize) -> bool {
        self.every_n_steps.is_some_and(|n| step.is_multiple_of(n))
    }

    pub(crate) fn saves_at_end(&self) -> bool {
        self.save_at_end
    }

    /// Where the checkpoint of step `step` goes: `step-<step>`, or, when an earlier run
    /// saved that step under this root, `step-<step>-v1`, `-v2`, ... (a checkpoint is never
    /// overwritten).
    pub(crate) fn dir_for(&self, step: usize) -> PathBuf {
        let base = format!("step-{step:08}");
        (0..)
            .map(|v| match v {
                0 => self.root.join(&base),
                v => self.root.join(format!("{base}-v{v}")),
            })
            .find(|dir| !dir.exists())
            .expect("some version is free")
    }

    /// After a complete save of `dir` (rank 0 only): point `last` at it, then prune.
    pub(crate) fn committed(&self, dir: &Path) -> Result<(), CheckpointError> {
        let name = dir
            .file_name()
            .and_then(|n| n.to_str())
            .expect("checkpoint directories have plain names");
        write_atomic(&self.root.join(LAST_FILE), |out| {
            std::io::Write::write_all(out, name.as_bytes())
                .map_err(CheckpointError::io(self.root.join(LAST_FILE)))
        })?;
        self.prune(name)
    }

    /// Removes the checkpoints neither among the last K nor the best K (never `keep`).
    fn prune(&self, keep: &str) -> Result<(), CheckpointError> {
        if self.keep_last.is_none() && self.keep_best.is_none() {
            return Ok(());
        }
        let mut saved: Vec<(String, Manifest)> = Vec::new();
        let entries = std::fs::read_dir(&self.root).map_err(CheckpointError::io(&self.root))?;
        for entry in entries.flatten() {
            let name = entry.file_name().to_string_lossy().to_string();
            if !name.starts_with("step-") || name.ends_with(".tmp") {
                continue;
            }
            // Something that does not read as a checkpoint is not ours to delete.
            if let Ok(m) = Manifest::read(&entry.path()) {
                saved.push((name, m));
            }
        }
        let mut kept = vec![keep.to_string()];
        if let Some(k) = self.keep_last {
            // Newest first: by step, then by version (a later run's save of the same step).
            saved.sort_by_key(|(n, m)| std::cmp::Reverse((m.step, version(n))));
            kept.extend(saved.iter().take(k).map(|(n, _)| n.clone()));
        }
        if let Some((k, metric, mode)) = &self.keep_best {
            let mut scored: Vec<(&String, f64)> = saved
                .iter()
                .filter_map(|(n, m)| m.metrics.get(metric).map(|v| (n, *v)))
                .collect();
            scored.sort_by(|a, b| {
                let order = a.1.partial_cmp(&b.1).unwrap_or(Ordering::Equal);
                match mode {
                    Mode::Min => order,
                    Mode::Max => order.reverse(),
                }
            });
            kept.extend(scored.iter().take(*k).map(|(n, _)| (*n).clone()));
        }
        for (name, _) in saved.iter().filter(|(n, _)| !kept.contains(n)) {
            // Renamed first, so that a crash while its files go leaves no damaged
            // checkpoint under a checkpoint's name, only a temporary directory.
            let path = self.root.join(name);
            let doomed = temporary(&path);
            if doomed.exists() {
                std::fs::remove_dir_all(&doomed).map_err(CheckpointError::io(&doomed))?;
            }
            std::fs::rename(&path, &doomed).map_err(CheckpointError::io(&path))?;
            std::fs::remove_dir_all(&doomed).map_err(CheckpointError::io(&doomed))?;
        }
        Ok(())
    }
}

/// The `K` of a `step-N-vK` name; 0 for `step-N`.
fn version(name: &str) -> usize {
    name.rsplit_once("-v")
        .and_then(|(_, v)| v.parse().ok())
        .unwrap_or(0)
}
