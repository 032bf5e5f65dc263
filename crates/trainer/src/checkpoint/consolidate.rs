//! One plain safetensors file from a sharded checkpoint, streamed a parameter at a time.

use super::files::write_safetensors;
use super::{Checkpoint, CheckpointError};
use candle_core::Shape;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use wick_core::{StateReader, PARAM_KIND};

/// Writes the parameters of the checkpoint `dir` to `out` as one safetensors file under the
/// model's own names, readable by candle's `VarBuilder::from_mmaped_safetensors` or Python's
/// `safetensors` with no wick code. With `with_optimizer`, the optimizer state goes beside it
/// to `<out stem>.optimizer.safetensors` as `<name>.<kind>` tensors. One process does it,
/// reading one parameter at a time (peak memory about the largest parameter). Returns the
/// files written.
pub fn consolidate(
    dir: impl AsRef<Path>,
    out: impl AsRef<Path>,
    with_optimizer: bool,
) -> Result<Vec<PathBuf>, CheckpointError> {
    let checkpoint = Checkpoint::open(dir)?;
    let out = out.as_ref();
    let params: Vec<(String, Vec<usize>)> = checkpoint
        .parameters()
        .map(|(n, s)| (n.to_string(), s.to_vec()))
        .collect();
    let manifest = checkpoint.manifest();
    let metadata = BTreeMap::from([
        ("format".to_string(), "pt".to_string()),
        ("wick.step".to_string(), manifest.step.to_string()),
    ]);
    let mut written = vec![out.to_path_buf()];
    write_safetensors(out, &params, &metadata, |i| {
        read_whole(&checkpoint, PARAM_KIND, &params[i])
    })?;
    if with_optimizer {
        let path = out.with_extension("optimizer.safetensors");
        let kinds = &manifest.optimizer.state_kinds;
        let mut metadata = metadata.clone();
        metadata.insert("optimizer".into(), manifest.optimizer.kind.clone());
        metadata.insert("step".into(), manifest.optimizer.step.to_string());
        // Every kind's tensors, parameter by parameter; one file for all kinds.
        let entries: Vec<(String, Vec<usize>, &str, usize)> = kinds
            .iter()
            .flat_map(|k| {
                params
                    .iter()
                    .enumerate()
                    .map(move |(i, (n, s))| (format!("{n}.{k}"), s.clone(), k.as_str(), i))
            })
            .collect();
        let names: Vec<(String, Vec<usize>)> = entries
            .iter()
            .map(|(n, s, _, _)| (n.clone(), s.clone()))
            .collect();
        write_safetensors(&path, &names, &metadata, |i| {
            let (_, _, kind, p) = &entries[i];
            read_whole(&checkpoint, kind, &params[*p])
        })?;
        written.push(path);
    }
    Ok(written)
}

/// One parameter's state `kind`, whole.
fn read_whole(
    checkpoint: &Checkpoint,
    kind: &str,
    (name, shape): &(String, Vec<usize>),
) -> Result<Vec<f32>, CheckpointError> {
    let shape = Shape::from(shape.clone());
    let numel = shape.elem_count();
    checkpoint
        .read(kind, &[(name.clone(), shape)], 0..numel)
        .and_then(|t| t.to_vec1::<f32>())
        .map_err(|e| CheckpointError::Mismatch {
            path: checkpoint.dir().to_path_buf(),
            message: format!("parameter '{name}': {e}"),
        })
}
