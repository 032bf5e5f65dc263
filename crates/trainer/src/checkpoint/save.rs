//! Saving: every rank writes its own file into a temporary directory, rank 0 writes the
//! manifest last and renames the directory into place. Until that rename the checkpoint
//! does not exist under its name; after it, it is whole.

use super::files::{checksum, sync_dir, temporary, write_atomic, write_safetensors};
use super::manifest::{
    DataPosition, FileRecord, GroupRecord, LossScaleRecord, LrScheduleRecord, Manifest,
    OptimizerRecord, ParamRecord, PieceRecord, RngRecord, FORMAT, FORMAT_VERSION, MANIFEST_FILE,
};
use super::CheckpointError;
use crate::TrainerError;
use std::collections::BTreeMap;
use std::ops::Range;
use std::path::Path;
use std::sync::Arc;
use wick_core::{
    Collective, LrSchedule, OptimizerConfig, RankState, SafetensorsFile, Strategy, PARAM_KIND,
};

/// A moment in a save at which a fault can be injected (for crash tests).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SavePoint {
    /// Rank `rank` has written its file.
    RankFile {
        /// The rank.
        rank: usize,
    },
    /// Rank 0 is about to write the manifest.
    Manifest,
    /// Rank 0 is about to rename the finished directory into place.
    Commit,
}

/// Called at each [`SavePoint`]; an `Err` aborts the save there, as a crash would.
pub type SaveFault = Arc<dyn Fn(SavePoint) -> Result<(), String> + Send + Sync>;

/// What the trainer records beside the strategy's state.
pub(crate) struct SaveInfo<'a> {
    pub(crate) step: usize,
    pub(crate) epoch: usize,
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

fn fault_at(fault: Option<&SaveFault>, point: SavePoint) -> Result<(), CheckpointError> {
    match fault.map(|f| f(point)) {
        Some(Err(message)) => Err(CheckpointError::Io {
            path: format!("{point:?}").into(),
            cause: std::io::Error::other(format!("injected fault: {message}")),
        }),
        _ => Ok(()),
    }
}

/// Saves the checkpoint `dir` from every rank (a collective: all ranks call it).
pub(crate) fn save(
    world: &dyn Collective,
    strategy: &dyn Strategy,
    dir: &Path,
    info: &SaveInfo<'_>,
    fault: Option<&SaveFault>,
) -> Result<(), TrainerError> {
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
    write_rank_file(&tmp.join(rank_file(rank)), &state)?;
    fault_at(fault, SavePoint::RankFile { rank })?;
    world.barrier()?;

    if rank == 0 {
        let mut manifest = manifest(strategy, world.world_size(), &state, &tmp, info)?;
        for (name, bytes) in info.attachments {
            let path = tmp.join(name);
            write_atomic(&path, |out| {
                std::io::Write::write_all(out, bytes).map_err(CheckpointError::io(&path))
            })?;
            let (bytes, crc32) = checksum(&path)?;
            manifest.attachments.push(FileRecord {
                name: name.clone(),
                bytes,
                crc32,
            });
        }
        fault_at(fault, SavePoint::Manifest)?;
        let text = serde_json::to_string_pretty(&manifest).expect("a manifest serializes");
        write_atomic(&tmp.join(MANIFEST_FILE), |out| {
            std::io::Write::write_all(out, text.as_bytes())
                .map_err(CheckpointError::io(tmp.join(MANIFEST_FILE)))
        })?;
        fault_at(fault, SavePoint::Commit)?;
        std::fs::rename(&tmp, dir).map_err(CheckpointError::io(dir))?;
        if let Some(parent) = dir.parent() {
            sync_dir(parent)?;
        }
    }
    world.barrier()?;
    Ok(())
}

/// One safetensors file of `<group>.<kind>` tensors, with each group's range in the header.
fn write_rank_file(path: &Path, state: &RankState) -> Result<(), TrainerError> {
    let mut tensors = Vec::new();
    let mut data = Vec::new();
    let mut ranges = BTreeMap::new();
    for g in state.groups.iter().filter(|g| !g.range.is_empty()) {
        ranges.insert(g.group.name.clone(), [g.range.start, g.range.end]);
        for (kind, t) in &g.tensors {
            tensors.push((format!("{}.{kind}", g.group.name), vec![t.elem_count()]));
            data.push(t.clone());
        }
    }
    let metadata = BTreeMap::from([(
        RANGES_KEY.to_string(),
        serde_json::to_string(&ranges).expect("ranges serialize"),
    )]);
    write_safetensors(path, &tensors, &metadata, |i| {
        data[i]
            .to_dtype(candle_core::DType::F32)
            .and_then(|t| t.to_vec1::<f32>())
            .map_err(|e| CheckpointError::Mismatch {
                path: path.to_path_buf(),
                message: format!("tensor '{}': {e}", tensors[i].0),
            })
    })?;
    Ok(())
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

/// The manifest, with every rank's pieces read back from the files just written.
fn manifest(
    strategy: &dyn Strategy,
    world_size: usize,
    state: &RankState,
    tmp: &Path,
    info: &SaveInfo<'_>,
) -> Result<Manifest, CheckpointError> {
    let mut files = Vec::new();
    let mut pieces: Vec<Vec<PieceRecord>> = vec![Vec::new(); state.groups.len()];
    for r in 0..world_size {
        let name = rank_file(r);
        let path = tmp.join(&name);
        let (bytes, crc32) = checksum(&path)?;
        files.push(FileRecord { name, bytes, crc32 });
        let ranges = rank_ranges(&SafetensorsFile::open(&path)?)?;
        for (g, group) in state.groups.iter().enumerate() {
            if let Some(range) = ranges.get(&group.group.name) {
                pieces[g].push(PieceRecord {
                    rank: r,
                    start: range.start,
                    end: range.end,
                });
            }
        }
    }
    let groups = state
        .groups
        .iter()
        .zip(pieces)
        .map(|(g, mut pieces)| {
            pieces.sort_by_key(|p| p.start);
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
                pieces,
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
    Ok(Manifest {
        format: FORMAT.into(),
        format_version: FORMAT_VERSION,
        step: info.step,
        epoch: info.epoch,
        world_size,
        strategy: strategy.name().to_string(),
        optimizer: optimizer_record(info.optimizer, state, state_kinds),
        rng: RngRecord { seed: info.seed },
        data: info.data.clone(),
        metrics: info.metrics.clone(),
        run: info.run.clone(),
        groups,
        files,
        attachments: Vec::new(),
    })
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
