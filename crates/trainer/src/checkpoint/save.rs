//! Saving: every rank writes its own file into a temporary directory, then a record of it
//! (length, checksum, ranges); once every record is there, rank 0 writes the manifest last
//! and renames the directory into place. Until that rename the checkpoint does not exist
//! under its name; after it, it is whole. A save begins at a step boundary with each
//! rank's state copied to host memory ([`begin`]); the files are written then
//! ([`save`]), or on a thread of their own while training goes on ([`super::PendingSave`]).

use super::fault::{SaveFault, SavePoint};
use super::files::{checksum, sync_dir, temporary, write_atomic, write_safetensors};
use super::manifest::{
    DataPosition, FileRecord, GroupRecord, LossScaleRecord, LrScheduleRecord, Manifest,
    OptimizerRecord, ParamRecord, PieceRecord, RngRecord, FORMAT, FORMAT_VERSION, MANIFEST_FILE,
};
use super::model_checkpoint::ModelCheckpoint;
use super::CheckpointError;
use crate::TrainerError;
use std::collections::BTreeMap;
use std::ops::Range;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use wick_core::{
    Collective, CollectiveExt, LrSchedule, OptimizerConfig, RankState, RankStrategy,
    SafetensorsFile, PARAM_KIND,
};

/// What the trainer records beside the strategy's state.
pub(crate) struct SaveInfo<'a> {
    pub(crate) step: usize,
    pub(crate) epoch: usize,
    pub(crate) skipped_steps: usize,
    pub(crate) seed: u64,
    pub(crate) optimizer: &'a OptimizerConfig,
    pub(crate) data: DataPosition,
    pub(crate) metrics: BTreeMap<String, f64>,
    /// The run's log directory, if it logs.
    pub(crate) run: Option<String>,
    /// Files saved beside the state, by name.
    pub(crate) attachments: &'a [(String, Arc<Vec<u8>>)],
}

/// The file rank `rank` writes.
pub(crate) fn rank_file(rank: usize) -> String {
    format!("rank-{rank}.safetensors")
}

const RANGES_KEY: &str = "wick.ranges";

/// Calls `fault` at `point`, where `path` is the file or directory being saved: an `Err`
/// from it is an error of `path`, as a real failure there would be.
fn fault_at(
    fault: Option<&SaveFault>,
    point: SavePoint,
    path: &Path,
) -> Result<(), CheckpointError> {
    match fault.map(|f| f(point)) {
        Some(Err(message)) => Err(CheckpointError::Io {
            path: path.to_path_buf(),
            cause: std::io::Error::other(format!("injected fault at {point:?}: {message}")),
        }),
        _ => Ok(()),
    }
}

/// Begins the save of checkpoint `dir` on every rank (a collective: all ranks call it, at
/// the same step): the temporary directory made, and this rank's state copied to host
/// memory, so that training may change it at once. Returns this rank's file to write
/// ([`RankWrite::write`], here or on a thread of its own) and, on rank 0, the manifest to
/// write once every rank's file is whole ([`Commit::commit`]).
pub(crate) fn begin(
    world: &dyn Collective,
    strategy: &dyn RankStrategy,
    dir: &Path,
    info: &SaveInfo<'_>,
    checkpoints: &ModelCheckpoint,
) -> Result<(RankWrite, Option<Commit>), TrainerError> {
    let rank = world.rank();
    if dir.exists() {
        return Err(CheckpointError::Mismatch {
            path: dir.to_path_buf(),
            message: "already exists; a checkpoint is never overwritten".into(),
        }
        .into());
    }
    let tmp = temporary(dir);
    if rank == 0 {
        if tmp.exists() {
            // A save that crashed before its rename left it; it was never a checkpoint.
            std::fs::remove_dir_all(&tmp).map_err(CheckpointError::io(&tmp))?;
        }
        std::fs::create_dir_all(&tmp).map_err(CheckpointError::io(&tmp))?;
    }
    world.barrier()?;
    let state = strategy.save_state()?;
    let write = RankWrite::of(&tmp, rank, &state, checkpoints.fault())?;
    let commit = (rank == 0).then(|| Commit {
        dir: dir.to_path_buf(),
        tmp,
        manifest: draft_manifest(strategy, world.world_size(), &state, info),
        attachments: info.attachments.to_vec(),
        checkpoints: checkpoints.clone(),
    });
    Ok((write, commit))
}

/// Saves the checkpoint `dir` from every rank, all of it before returning (a collective),
/// and points `last` at it.
pub(crate) fn save(
    world: &dyn Collective,
    strategy: &dyn RankStrategy,
    dir: &Path,
    info: &SaveInfo<'_>,
    checkpoints: &ModelCheckpoint,
) -> Result<(), TrainerError> {
    let (write, commit) = begin(world, strategy, dir, info, checkpoints)?;
    write.write()?;
    world.barrier()?;
    if let Some(commit) = commit {
        commit.commit()?;
    }
    world.barrier()?;
    Ok(())
}

/// One rank's file of a checkpoint, its tensors copied to host memory: everything its
/// writing needs, so that it can run on a thread of its own while training goes on.
pub(crate) struct RankWrite {
    /// The temporary checkpoint directory.
    tmp: PathBuf,
    rank: usize,
    /// `<group>.<kind>` and the length of each tensor.
    tensors: Vec<(String, Vec<usize>)>,
    data: Vec<Vec<f32>>,
    /// Each group's range of its flat buffer.
    ranges: BTreeMap<String, [usize; 2]>,
    fault: Option<SaveFault>,
}

impl RankWrite {
    /// `state`'s tensors copied out, with each group's range; `fault` is called once the
    /// file is written ([`SavePoint::RankFile`]).
    fn of(
        tmp: &Path,
        rank: usize,
        state: &RankState,
        fault: Option<&SaveFault>,
    ) -> Result<Self, TrainerError> {
        let path = tmp.join(rank_file(rank));
        let mut tensors = Vec::new();
        let mut data = Vec::new();
        let mut ranges = BTreeMap::new();
        for g in state.groups.iter().filter(|g| !g.range.is_empty()) {
            ranges.insert(g.group.name.clone(), [g.range.start, g.range.end]);
            for (kind, t) in &g.tensors {
                let name = format!("{}.{kind}", g.group.name);
                let values = t
                    .to_dtype(candle_core::DType::F32)
                    .and_then(|t| t.to_vec1::<f32>())
                    .map_err(|e| CheckpointError::Mismatch {
                        path: path.clone(),
                        message: format!("tensor '{name}': {e}"),
                    })?;
                tensors.push((name, vec![values.len()]));
                data.push(values);
            }
        }
        Ok(RankWrite {
            tmp: tmp.to_path_buf(),
            rank,
            tensors,
            data,
            ranges,
            fault: fault.cloned(),
        })
    }

    /// Writes the rank file (a safetensors file of `<group>.<kind>` tensors, with each
    /// group's range in its header), then its record: length, checksum and ranges, which
    /// rank 0's [`Commit`] waits for. A record exists only beside a whole file.
    pub(crate) fn write(self) -> Result<(), CheckpointError> {
        let path = self.tmp.join(rank_file(self.rank));
        let metadata = BTreeMap::from([(
            RANGES_KEY.to_string(),
            serde_json::to_string(&self.ranges).expect("ranges serialize"),
        )]);
        let mut data = self.data.into_iter();
        let (bytes, crc32) = write_safetensors(&path, &self.tensors, &metadata, |_| {
            Ok(data.next().expect("one vector per tensor"))
        })?;
        fault_at(
            self.fault.as_ref(),
            SavePoint::RankFile { rank: self.rank },
            &path,
        )?;
        let record = RankRecord {
            file: FileRecord {
                name: rank_file(self.rank),
                bytes,
                crc32,
            },
            ranges: self.ranges,
        };
        let text = serde_json::to_string(&record).expect("a record serializes");
        let record_path = self.tmp.join(record_file(self.rank));
        write_atomic(&record_path, |out| {
            std::io::Write::write_all(out, text.as_bytes())
                .map_err(CheckpointError::io(&record_path))
        })
    }
}

/// What rank 0's commit learns of a rank's file without reading it.
#[derive(serde::Serialize, serde::Deserialize)]
struct RankRecord {
    file: FileRecord,
    ranges: BTreeMap<String, [usize; 2]>,
}

/// The record of rank `rank`'s file, in the temporary directory until the commit.
fn record_file(rank: usize) -> String {
    format!("rank-{rank}.record.json")
}

/// Rank 0's end of a save: once every rank's file is whole, the manifest written last,
/// the directory renamed into place, then `last` pointed at it and old ones pruned.
pub(crate) struct Commit {
    dir: PathBuf,
    tmp: PathBuf,
    /// Everything but the rank files and their pieces, which the records give.
    manifest: Manifest,
    attachments: Vec<(String, Arc<Vec<u8>>)>,
    checkpoints: ModelCheckpoint,
}

impl Commit {
    /// Whether every rank's file is whole (its record is there).
    pub(crate) fn ready(&self) -> bool {
        (0..self.manifest.world_size).all(|r| self.tmp.join(record_file(r)).is_file())
    }

    /// Writes the manifest from the ranks' records, renames the directory into place and
    /// points `last` at it. Every rank's file must be whole ([`Commit::ready`]).
    pub(crate) fn commit(mut self) -> Result<(), CheckpointError> {
        let (tmp, fault) = (&self.tmp, self.checkpoints.fault());
        let mut records = Vec::new();
        for r in 0..self.manifest.world_size {
            let path = tmp.join(record_file(r));
            let text = std::fs::read_to_string(&path).map_err(CheckpointError::io(&path))?;
            let record: RankRecord =
                serde_json::from_str(&text).map_err(|e| CheckpointError::Io {
                    path: path.clone(),
                    cause: std::io::Error::other(e),
                })?;
            records.push(record);
        }
        for group in &mut self.manifest.groups {
            group.pieces = (0..records.len())
                .filter_map(|r| {
                    let [start, end] = *records[r].ranges.get(&group.name)?;
                    Some(PieceRecord {
                        rank: r,
                        start,
                        end,
                    })
                })
                .collect();
            group.pieces.sort_by_key(|p| p.start);
        }
        self.manifest.files = records.into_iter().map(|r| r.file).collect();
        for (name, bytes) in &self.attachments {
            let path = tmp.join(name);
            write_atomic(&path, |out| {
                std::io::Write::write_all(out, bytes).map_err(CheckpointError::io(&path))
            })?;
            let (bytes, crc32) = checksum(&path)?;
            self.manifest.attachments.push(FileRecord {
                name: name.clone(),
                bytes,
                crc32,
            });
        }
        fault_at(fault, SavePoint::Manifest, &tmp.join(MANIFEST_FILE))?;
        let text = serde_json::to_string_pretty(&self.manifest).expect("a manifest serializes");
        write_atomic(&tmp.join(MANIFEST_FILE), |out| {
            std::io::Write::write_all(out, text.as_bytes())
                .map_err(CheckpointError::io(tmp.join(MANIFEST_FILE)))
        })?;
        for r in 0..self.manifest.world_size {
            let path = tmp.join(record_file(r));
            std::fs::remove_file(&path).map_err(CheckpointError::io(&path))?;
        }
        fault_at(fault, SavePoint::Commit, &self.dir)?;
        std::fs::rename(tmp, &self.dir).map_err(CheckpointError::io(&self.dir))?;
        if let Some(parent) = self.dir.parent() {
            sync_dir(parent)?;
        }
        self.checkpoints.committed(&self.dir)
    }
}

/// Each group's range as rank file `path` records it.
pub(crate) fn rank_ranges(
    file: &SafetensorsFile,
) -> Result<BTreeMap<String, Range<usize>>, CheckpointError> {
    let text = file
        .metadata()
        .and_then(|m| m.get(RANGES_KEY))
        .ok_or_else(|| {
            wick_core::FileError::new(file.path(), None, format!("no '{RANGES_KEY}' metadata"))
        })?;
    let ranges: BTreeMap<String, [usize; 2]> = serde_json::from_str(text).map_err(|e| {
        wick_core::FileError::new(file.path(), None, format!("bad '{RANGES_KEY}': {e}"))
    })?;
    Ok(ranges.into_iter().map(|(g, [s, e])| (g, s..e)).collect())
}

/// The manifest of the state being saved, without the rank files and their pieces: those
/// come from the ranks' records when the save commits.
fn draft_manifest(
    strategy: &dyn RankStrategy,
    world_size: usize,
    state: &RankState,
    info: &SaveInfo<'_>,
) -> Manifest {
    let groups = state
        .groups
        .iter()
        .map(|g| {
            let mut offset = 0;
            let params = g
                .group
                .params
                .iter()
                .map(|(name, shape)| {
                    let p = ParamRecord {
                        name: name.clone(),
                        shape: shape.dims().to_vec(),
                        dtype: "F32".into(),
                        offset,
                    };
                    offset += shape.elem_count();
                    p
                })
                .collect();
            GroupRecord {
                name: g.group.name.clone(),
                numel: g.group.numel(),
                params,
                pieces: Vec::new(),
            }
        })
        .collect();
    let state_kinds = state
        .groups
        .first()
        .map(|g| {
            g.tensors
                .iter()
                .map(|(k, _)| k.clone())
                .filter(|k| k != PARAM_KIND)
                .collect()
        })
        .unwrap_or_default();
    Manifest {
        format: FORMAT.into(),
        format_version: FORMAT_VERSION,
        step: info.step,
        epoch: info.epoch,
        skipped_steps: info.skipped_steps,
        world_size,
        strategy: strategy.name().to_string(),
        optimizer: optimizer_record(info.optimizer, state, state_kinds),
        rng: RngRecord {
            seed: info.seed,
            shuffle: crate::EpochOrder::SHUFFLE.into(),
        },
        data: info.data.clone(),
        metrics: info.metrics.clone(),
        run: info.run.clone(),
        groups,
        files: Vec::new(),
        attachments: Vec::new(),
    }
}

fn optimizer_record(
    config: &OptimizerConfig,
    state: &RankState,
    state_kinds: Vec<String>,
) -> OptimizerRecord {
    OptimizerRecord {
        kind: config.kind().into(),
        hyper_parameters: config
            .hyper_parameters()
            .into_iter()
            .map(|(k, v)| (k.to_string(), v))
            .collect(),
        step: state.optimizer_step,
        state_kinds,
        lr_schedule: (config.schedule != LrSchedule::constant())
            .then(|| LrScheduleRecord::from(&config.schedule)),
        loss_scale: state.loss_scale.map(LossScaleRecord::from),
    }
}
