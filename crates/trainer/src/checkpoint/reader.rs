//! Loading: a checkpoint directory opened and checked as a whole, then read by parameter
//! name at any world size.

use super::files::checksum;
use super::manifest::{FileRecord, GroupRecord, Manifest};
use super::save::rank_ranges;
use super::CheckpointError;
use candle_core::{Device, Shape, Tensor};
use std::collections::{BTreeMap, HashMap};
use std::ops::Range;
use std::path::{Path, PathBuf};
use wick_core::{FileError, LossScale, SafetensorsFile, StateReader, PARAM_KIND};

/// An opened checkpoint: the manifest and every rank file, checked against each other
/// before anything is read (so a bad checkpoint fails on every rank alike, before any state
/// changes).
pub struct Checkpoint {
    dir: PathBuf,
    manifest: Manifest,
    files: Vec<SafetensorsFile>,
    /// Parameter name -> (group index, offset in the group, shape).
    index: HashMap<String, (usize, usize, Vec<usize>)>,
}

impl Checkpoint {
    /// Opens the checkpoint `path` names: a checkpoint directory, a checkpoint root (its
    /// `last` file names the checkpoint), or that `last` file
    /// ([`resolve_checkpoint`](super::resolve_checkpoint)). An error about a checkpoint
    /// reached through `last` says so.
    pub fn open(path: impl AsRef<Path>) -> Result<Self, CheckpointError> {
        let resolved = super::path::resolve(path.as_ref())?;
        Self::open_dir(resolved.dir.clone()).map_err(|e| resolved.explain(e))
    }

    /// The checkpoint that `root`'s `last` file names, opened and checked whole; `None` when
    /// `root` has no `last` file (nothing saved there yet, or no such directory). A `last`
    /// that names a missing or damaged checkpoint is an error, never taken for "none".
    pub fn latest(root: impl AsRef<Path>) -> Result<Option<Self>, CheckpointError> {
        let last = root.as_ref().join(super::LAST_FILE);
        match last.try_exists() {
            Ok(false) => Ok(None),
            _ => Self::open(&last).map(Some),
        }
    }

    fn open_dir(dir: PathBuf) -> Result<Self, CheckpointError> {
        let manifest = Manifest::read(&dir)?;
        let files = manifest
            .files
            .iter()
            .map(|f| open_checked(&dir.join(&f.name), f))
            .collect::<Result<Vec<_>, _>>()?;
        for a in &manifest.attachments {
            if a.name.contains(['/', '\\']) || a.name.starts_with('.') {
                return Err(CheckpointError::manifest(
                    dir.join(super::manifest::MANIFEST_FILE),
                    "attachments",
                    format!("'{}' is not a file name", a.name),
                ));
            }
            check_recorded(&dir.join(&a.name), a)?;
        }
        let kinds: Vec<&str> = std::iter::once(PARAM_KIND)
            .chain(manifest.optimizer.state_kinds.iter().map(String::as_str))
            .collect();
        // Each file's recorded ranges, parsed once for all groups.
        let recorded = files
            .iter()
            .map(rank_ranges)
            .collect::<Result<Vec<_>, _>>()?;
        for group in &manifest.groups {
            check_pieces(group, &files, &recorded, &kinds)?;
        }
        let mut index = HashMap::new();
        for (g, group) in manifest.groups.iter().enumerate() {
            for p in &group.params {
                if index
                    .insert(p.name.clone(), (g, p.offset, p.shape.clone()))
                    .is_some()
                {
                    return Err(CheckpointError::manifest(
                        dir.join(super::manifest::MANIFEST_FILE),
                        "groups",
                        format!("parameter '{}' appears twice", p.name),
                    ));
                }
            }
        }
        Ok(Checkpoint {
            dir,
            manifest,
            files,
            index,
        })
    }

    /// The manifest.
    pub fn manifest(&self) -> &Manifest {
        &self.manifest
    }

    /// The directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The file saved beside the state as `name`
    /// ([`ModelCheckpoint::with_attachment`](super::ModelCheckpoint::with_attachment)), checked
    /// whole when the checkpoint was opened; `None` if the checkpoint has none by that name.
    pub fn attachment(&self, name: &str) -> Option<PathBuf> {
        self.manifest
            .attachments
            .iter()
            .any(|a| a.name == name)
            .then(|| self.dir.join(name))
    }

    /// Every parameter's name and shape, in the saved order.
    pub fn parameters(&self) -> impl Iterator<Item = (&str, &[usize])> {
        self.manifest.groups.iter().flat_map(|g| {
            g.params
                .iter()
                .map(|p| (p.name.as_str(), p.shape.as_slice()))
        })
    }

    /// Checks the checkpoint holds exactly the parameters `model` has, with the same shapes
    /// (a checkpoint of another model is refused by name).
    pub fn check_model(&self, model: &[(String, Shape)]) -> Result<(), CheckpointError> {
        let mismatch = |message: String| CheckpointError::Mismatch {
            path: self.dir.clone(),
            message,
        };
        for (name, shape) in model {
            match self.index.get(name) {
                None => {
                    return Err(mismatch(format!(
                        "parameter '{name}' of the model is not in the checkpoint (saved from another model?)"
                    )))
                }
                Some((_, _, saved)) if saved.as_slice() != shape.dims() => {
                    return Err(mismatch(format!(
                        "parameter '{name}': checkpoint shape {saved:?}, model shape {:?}",
                        shape.dims()
                    )))
                }
                _ => {}
            }
        }
        if let Some((extra, _)) = self
            .parameters()
            .find(|(n, _)| !model.iter().any(|(m, _)| m == n))
        {
            return Err(mismatch(format!(
                "parameter '{extra}' of the checkpoint is not in the model (saved from another model?)"
            )));
        }
        Ok(())
    }

    /// Copies elements `range` of group `g`'s state `kind` into `out`.
    fn read_group(
        &self,
        g: usize,
        kind: &str,
        range: Range<usize>,
        out: &mut Vec<f32>,
    ) -> Result<(), FileError> {
        let group = &self.manifest.groups[g];
        let tensor = format!("{}.{kind}", group.name);
        for piece in &group.pieces {
            let (a, b) = (range.start.max(piece.start), range.end.min(piece.end));
            if a < b {
                let file = &self.files[piece.rank];
                out.extend(file.read_f32(&tensor, a - piece.start..b - piece.start)?);
            }
        }
        Ok(())
    }
}

/// The file `record` names, checked whole (length and checksum) and opened.
fn open_checked(path: &Path, record: &FileRecord) -> Result<SafetensorsFile, CheckpointError> {
    check_recorded(path, record)?;
    Ok(SafetensorsFile::open(path)?)
}

/// Checks that the file at `path` has the length and checksum `record` gives.
fn check_recorded(path: &Path, record: &FileRecord) -> Result<(), CheckpointError> {
    let refuse = |why: String| Err(FileError::new(path, None, why).into());
    let len = std::fs::metadata(path)
        .map_err(|e| FileError::new(path, None, format!("cannot read: {e}")))?
        .len();
    if len != record.bytes {
        let recorded = record.bytes;
        return refuse(format!(
            "{len} bytes, the manifest says {recorded} (truncated or replaced)"
        ));
    }
    let (_, crc32) = checksum(path)?;
    if crc32 != record.crc32 {
        let recorded = record.crc32;
        return refuse(format!(
            "checksum {crc32:08x}, the manifest says {recorded:08x} (corrupted)"
        ));
    }
    Ok(())
}

/// Each piece's file holds `<group>.<kind>` for every kind, f32, of the piece's length, and
/// records the same range in its header.
fn check_pieces(
    group: &GroupRecord,
    files: &[SafetensorsFile],
    recorded: &[BTreeMap<String, Range<usize>>],
    kinds: &[&str],
) -> Result<(), CheckpointError> {
    for piece in group.pieces.iter().filter(|p| p.end > p.start) {
        let file = &files[piece.rank];
        let recorded = &recorded[piece.rank];
        if recorded.get(&group.name) != Some(&(piece.start..piece.end)) {
            return Err(FileError::new(
                file.path(),
                None,
                format!(
                    "the manifest gives it elements {}..{} of group '{}', the file records {:?}",
                    piece.start,
                    piece.end,
                    group.name,
                    recorded.get(&group.name)
                ),
            )
            .into());
        }
        for kind in kinds {
            let name = format!("{}.{kind}", group.name);
            let shape = file.shape(&name)?;
            if shape != [piece.end - piece.start] {
                return Err(FileError::new(
                    file.path(),
                    Some(&name),
                    format!("shape {shape:?}, expected [{}]", piece.end - piece.start),
                )
                .into());
            }
            // Reading nothing checks the dtype without touching the data.
            file.read_f32(&name, 0..0)?;
        }
    }
    Ok(())
}

impl StateReader for Checkpoint {
    fn read(
        &self,
        kind: &str,
        params: &[(String, Shape)],
        range: Range<usize>,
    ) -> candle_core::Result<Tensor> {
        if kind != PARAM_KIND
            && !self
                .manifest
                .optimizer
                .state_kinds
                .iter()
                .any(|k| k == kind)
        {
            candle_core::bail!(
                "{}: no '{kind}' state saved (saved: {:?})",
                self.dir.display(),
                self.manifest.optimizer.state_kinds
            )
        }
        let mut out = Vec::with_capacity(range.len());
        let mut offset = 0;
        for (name, shape) in params {
            let numel = shape.elem_count();
            let (a, b) = (range.start.max(offset), range.end.min(offset + numel));
            if a < b {
                let Some((g, at, saved)) = self.index.get(name) else {
                    candle_core::bail!(
                        "{}: parameter '{name}' is not in the checkpoint",
                        self.dir.display()
                    )
                };
                if saved.as_slice() != shape.dims() {
                    candle_core::bail!(
                        "{}: parameter '{name}': checkpoint shape {saved:?}, model shape {:?}",
                        self.dir.display(),
                        shape.dims()
                    )
                }
                let within = (a - offset) + at..(b - offset) + at;
                self.read_group(*g, kind, within, &mut out)?;
            }
            offset += numel;
        }
        if out.len() != range.len() {
            candle_core::bail!(
                "{}: elements {range:?} of {} parameters asked, {} found",
                self.dir.display(),
                params.len(),
                out.len()
            )
        }
        let len = out.len();
        Tensor::from_vec(out, len, &Device::Cpu)
    }

    fn optimizer_kinds(&self) -> Vec<String> {
        self.manifest.optimizer.state_kinds.clone()
    }

    fn optimizer_step(&self) -> usize {
        self.manifest.optimizer.step
    }

    fn loss_scale(&self) -> Option<LossScale> {
        self.manifest.optimizer.loss_scale.map(LossScale::from)
    }
}
