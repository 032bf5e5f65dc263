//! The checkpoint manifest (`manifest.json`): what was saved, by whom, and where every
//! element of every parameter lies.

use super::CheckpointError;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::path::Path;
use wick_core::{Decay, LossScale, LrSchedule};

/// The `format` field of every wick checkpoint.
pub const FORMAT: &str = "wick-checkpoint";
/// The manifest layout this version writes and reads.
pub const FORMAT_VERSION: u32 = 1;
/// The manifest's file name inside a checkpoint directory.
pub const MANIFEST_FILE: &str = "manifest.json";

/// A checkpoint's manifest.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Manifest {
    /// Always [`FORMAT`].
    pub format: String,
    /// [`FORMAT_VERSION`] when written by this version.
    pub format_version: u32,
    /// Optimizer steps taken (the trainer's global step).
    pub step: usize,
    /// The epoch the next step belongs to.
    pub epoch: usize,
    /// Steps skipped for inf or NaN gradients before it (written when there were any).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub skipped_steps: usize,
    /// Ranks that saved it.
    pub world_size: usize,
    /// The strategy that saved it.
    pub strategy: String,
    /// The optimizer.
    pub optimizer: OptimizerRecord,
    /// What makes the run's random choices: the seed of parameter init and data order.
    pub rng: RngRecord,
    /// Where the data loader stands.
    pub data: DataPosition,
    /// Metrics at the time of saving (averaged over ranks).
    pub metrics: BTreeMap<String, f64>,
    /// The log directory of the run that saved it, as that run named it (such as
    /// `runs/char-gpt-v1`): a run resumed from it with the same log dir and run name
    /// continues that directory's metrics. Absent when the run logged nothing.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub run: Option<String>,
    /// The flat groups and the ranks' pieces of them.
    pub groups: Vec<GroupRecord>,
    /// The rank files, by rank.
    pub files: Vec<FileRecord>,
    /// Files saved beside the state ([`ModelCheckpoint::with_attachment`](super::ModelCheckpoint::with_attachment)),
    /// such as a model's `config.json` and `tokenizer.json`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub attachments: Vec<FileRecord>,
}

/// Whether a count is 0, to leave it out of the manifest.
fn is_zero(n: &usize) -> bool {
    *n == 0
}

/// A file of the checkpoint: its name in the checkpoint directory, length and checksum, so
/// that a truncated or corrupted file is refused before it is read.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct FileRecord {
    /// File name.
    pub name: String,
    /// Length in bytes.
    pub bytes: u64,
    /// CRC-32 (IEEE) of the whole file.
    pub crc32: u32,
}

/// The optimizer, its hyper-parameters and its step.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct OptimizerRecord {
    /// `adamw` or `sgd`.
    pub kind: String,
    /// Hyper-parameters by name (`lr`, `beta1`, ...; booleans as 0/1).
    pub hyper_parameters: BTreeMap<String, f64>,
    /// Steps taken (AdamW's bias correction depends on it).
    pub step: usize,
    /// State saved per parameter besides `param` (`exp_avg`, ...); empty before the first step.
    pub state_kinds: Vec<String>,
    /// The learning-rate schedule (absent: constant). A resumed run continues it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lr_schedule: Option<LrScheduleRecord>,
    /// The dynamic loss scale of a `16-mixed` run.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub loss_scale: Option<LossScaleRecord>,
}

/// A learning-rate schedule ([`LrSchedule`]).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct LrScheduleRecord {
    /// Steps of linear warmup.
    pub warmup_steps: usize,
    /// `constant`, `cosine` or `linear`.
    pub decay: String,
    /// The step at which the decay reaches the floor.
    pub total_steps: usize,
    /// The floor, as a fraction of the base rate.
    pub min_lr_ratio: f64,
}

impl From<&LrSchedule> for LrScheduleRecord {
    fn from(s: &LrSchedule) -> Self {
        LrScheduleRecord {
            warmup_steps: s.warmup_steps,
            decay: s.decay.name().into(),
            total_steps: s.total_steps,
            min_lr_ratio: s.min_lr_ratio,
        }
    }
}

impl LrScheduleRecord {
    /// The schedule, or a message naming the bad field.
    pub fn schedule(&self) -> Result<LrSchedule, String> {
        let decay = Decay::from_name(&self.decay).ok_or_else(|| {
            format!(
                "lr_schedule.decay '{}' is not one of {}",
                self.decay,
                Decay::NAMES.join(", ")
            )
        })?;
        let schedule = LrSchedule {
            warmup_steps: self.warmup_steps,
            decay,
            total_steps: self.total_steps,
            min_lr_ratio: self.min_lr_ratio,
        };
        schedule.validate().map(|()| schedule)
    }
}

/// A dynamic loss scaler's state ([`LossScale`]).
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq)]
pub struct LossScaleRecord {
    /// The scale.
    pub scale: f64,
    /// Good steps since the scale last changed.
    pub growth_tracker: usize,
    /// Steps skipped for inf or NaN gradients.
    pub skipped_steps: usize,
}

impl From<LossScale> for LossScaleRecord {
    fn from(s: LossScale) -> Self {
        LossScaleRecord {
            scale: s.scale,
            growth_tracker: s.growth_tracker,
            skipped_steps: s.skipped_steps,
        }
    }
}

impl From<LossScaleRecord> for LossScale {
    fn from(s: LossScaleRecord) -> Self {
        LossScale {
            scale: s.scale,
            growth_tracker: s.growth_tracker,
            skipped_steps: s.skipped_steps,
        }
    }
}

/// Random state: wick draws parameter init and each epoch's data order from one seed.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct RngRecord {
    /// The seed.
    pub seed: u64,
    /// How the seed orders an epoch ([`EpochOrder::SHUFFLE`](crate::EpochOrder::SHUFFLE));
    /// checkpoints from before it was recorded shuffled by [`FISHER_YATES`].
    #[serde(default = "fisher_yates")]
    pub shuffle: String,
}

/// The shuffle of wick 0.2 and before: a list of every sample, shuffled by Fisher-Yates.
pub const FISHER_YATES: &str = "fisher-yates-xorshift64";

fn fisher_yates() -> String {
    FISHER_YATES.into()
}

/// The data loader's position: the next optimizer step is batch `batch` of epoch `epoch`.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct DataPosition {
    /// Epoch.
    pub epoch: usize,
    /// Optimizer step within the epoch.
    pub batch: usize,
    /// Global batch size.
    pub batch_size: usize,
    /// Micro-batches per optimizer step.
    pub accumulate: usize,
    /// Samples in the training set.
    pub dataset_len: usize,
}

/// One flat group: its parameters end to end, and which rank file holds which elements.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct GroupRecord {
    /// Group name; rank files hold `<name>.<kind>` tensors.
    pub name: String,
    /// Elements of all parameters.
    pub numel: usize,
    /// The parameters, in order.
    pub params: Vec<ParamRecord>,
    /// Rank files' pieces, by start.
    pub pieces: Vec<PieceRecord>,
}

/// A parameter's place in its group.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct ParamRecord {
    /// The model's own name.
    pub name: String,
    /// Full shape.
    pub shape: Vec<usize>,
    /// Stored dtype (`F32`).
    pub dtype: String,
    /// First element in the group's flat buffer.
    pub offset: usize,
}

/// Elements `[start, end)` of a group, held by `rank`'s file.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct PieceRecord {
    /// The rank that wrote it (index into [`Manifest::files`]).
    pub rank: usize,
    /// First element.
    pub start: usize,
    /// One past the last.
    pub end: usize,
}

impl Manifest {
    /// The steps skipped for inf or NaN gradients before this checkpoint: its typed field,
    /// or for a manifest written before that field existed, the count among its metrics.
    pub fn skipped_steps_before(&self) -> usize {
        let in_metrics = self.metrics.get("skipped_steps").map_or(0, |&n| n as usize);
        self.skipped_steps.max(in_metrics)
    }

    /// Reads and checks `dir/manifest.json`: format, version, and that each group's
    /// parameters and pieces describe its elements exactly once.
    pub fn read(dir: &Path) -> Result<Manifest, CheckpointError> {
        let path = dir.join(MANIFEST_FILE);
        if !dir.is_dir() {
            let message = match dir.exists() {
                true => "a file, not a checkpoint directory",
                false => "no such directory",
            };
            return Err(CheckpointError::NotACheckpoint {
                path: dir.to_path_buf(),
                message: message.into(),
            });
        }
        if !path.is_file() {
            return Err(CheckpointError::NotACheckpoint {
                path: dir.to_path_buf(),
                message: format!(
                    "it has no {MANIFEST_FILE} (a checkpoint) and no `last` file (a checkpoint root)"
                ),
            });
        }
        let text = std::fs::read_to_string(&path).map_err(CheckpointError::io(&path))?;
        // The two identifying fields first, so a manifest of another format or version says so
        // rather than failing on a field it does not have.
        #[derive(Deserialize)]
        struct Head {
            format: Option<String>,
            format_version: Option<u64>,
        }
        let head: Head = serde_json::from_str(&text)
            .map_err(|e| CheckpointError::manifest(&path, "(json)", e.to_string()))?;
        if head.format.as_deref() != Some(FORMAT) {
            return Err(CheckpointError::manifest(
                &path,
                "format",
                format!("expected \"{FORMAT}\", found {:?}", head.format),
            ));
        }
        if head.format_version != Some(FORMAT_VERSION as u64) {
            return Err(CheckpointError::manifest(
                &path,
                "format_version",
                format!(
                    "this wick reads version {FORMAT_VERSION}, found {:?}",
                    head.format_version
                ),
            ));
        }
        let manifest: Manifest = serde_json::from_str(&text).map_err(|e| {
            // serde names the missing or mistyped field in its message.
            CheckpointError::manifest(&path, "(json)", e.to_string())
        })?;
        manifest.check(&path)?;
        Ok(manifest)
    }

    fn check(&self, path: &Path) -> Result<(), CheckpointError> {
        let bad = |field: String, message: String| CheckpointError::manifest(path, field, message);
        if self.files.len() != self.world_size {
            return Err(bad(
                "files".into(),
                format!(
                    "{} files for world size {}",
                    self.files.len(),
                    self.world_size
                ),
            ));
        }
        if let Some(f) = self
            .files
            .iter()
            .find(|f| f.name.contains(['/', '\\']) || f.name.starts_with('.'))
        {
            return Err(bad(
                "files".into(),
                format!("'{}' is not a plain file name", f.name),
            ));
        }
        for (g, group) in self.groups.iter().enumerate() {
            let mut offset = 0usize;
            for (p, param) in group.params.iter().enumerate() {
                let numel = param
                    .shape
                    .iter()
                    .try_fold(1usize, |n, &d| n.checked_mul(d))
                    .ok_or_else(|| {
                        bad(format!("groups[{g}].params[{p}].shape"), "overflows".into())
                    })?;
                if param.offset != offset || param.dtype != "F32" {
                    return Err(bad(
                        format!("groups[{g}].params[{p}]"),
                        format!(
                            "parameter '{}' at offset {} dtype {}, expected offset {offset} dtype F32",
                            param.name, param.offset, param.dtype
                        ),
                    ));
                }
                offset = offset.checked_add(numel).ok_or_else(|| {
                    bad(
                        format!("groups[{g}].params[{p}]"),
                        "offset overflows".into(),
                    )
                })?;
            }
            if offset != group.numel {
                return Err(bad(
                    format!("groups[{g}].numel"),
                    format!("{} but its parameters hold {offset}", group.numel),
                ));
            }
            let mut covered = 0;
            for (i, piece) in group.pieces.iter().enumerate() {
                if piece.rank >= self.world_size
                    || piece.start != covered
                    || piece.end < piece.start
                {
                    return Err(bad(
                        format!("groups[{g}].pieces[{i}]"),
                        format!(
                            "rank {} elements {}..{}: pieces must cover the group in order from element {covered}",
                            piece.rank, piece.start, piece.end
                        ),
                    ));
                }
                covered = piece.end;
            }
            if covered != group.numel {
                return Err(bad(
                    format!("groups[{g}].pieces"),
                    format!("cover {covered} of {} elements", group.numel),
                ));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_schedule_record_round_trips_and_a_bad_one_names_the_field() {
        let schedule = LrSchedule::warmup_linear(3, 30, 0.05);
        let record = LrScheduleRecord::from(&schedule);
        assert_eq!(record.schedule(), Ok(schedule));
        let bad = LrScheduleRecord {
            decay: "sideways".into(),
            ..record.clone()
        };
        let e = bad.schedule().unwrap_err();
        assert!(
            e.contains("lr_schedule.decay") && e.contains("sideways"),
            "{e}"
        );
        let bad = LrScheduleRecord {
            min_lr_ratio: -1.0,
            ..record
        };
        assert!(bad.schedule().unwrap_err().contains("min_lr_ratio"));
    }

    #[test]
    fn a_manifest_from_before_the_shuffle_was_recorded_reads_as_fisher_yates() {
        let old: RngRecord = serde_json::from_str(r#"{"seed": 7}"#).unwrap();
        assert_eq!((old.seed, old.shuffle.as_str()), (7, FISHER_YATES));
        let now = RngRecord {
            seed: 7,
            shuffle: crate::EpochOrder::SHUFFLE.into(),
        };
        let read: RngRecord = serde_json::from_str(&serde_json::to_string(&now).unwrap()).unwrap();
        assert_eq!(read, now);
    }
}
