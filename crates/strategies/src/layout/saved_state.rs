//! Between a strategy's buffers and a checkpoint's flat ranges ([`wick_core::RankState`]):
//! the copies out for saving and the reads back for loading.

use crate::layout::flat_layout::FlatLayout;
use candle_core::{DType, Device, Result, Tensor};
use std::ops::Range;
use wick_core::{FlatGroup, StateReader};

/// The group a layout saves as: its parameters in order, without padding.
pub(crate) fn flat_group(name: String, layout: &FlatLayout) -> FlatGroup {
    FlatGroup {
        name,
        params: layout
            .entries()
            .iter()
            .map(|e| (e.name.clone(), e.shape.clone()))
            .collect(),
    }
}

/// Elements `range` of the concatenation of whole per-parameter `tensors` (one per entry).
pub(crate) fn concat_range(
    layout: &FlatLayout,
    tensors: &[Tensor],
    range: Range<usize>,
) -> Result<Tensor> {
    let parts = layout
        .pieces_in(range)
        .map(|(i, _, within, _)| {
            tensors[i]
                .flatten_all()?
                .narrow(0, within.start, within.len())
        })
        .collect::<Result<Vec<_>>>()?;
    match parts.is_empty() {
        true => Tensor::zeros(0, DType::F32, &Device::Cpu),
        false => Tensor::cat(&parts, 0)?.to_device(&Device::Cpu),
    }
}

/// The real elements at the front of a rank's padded shard: the part a checkpoint keeps.
pub(crate) fn shard_prefix(shard: &Tensor, len: usize) -> Result<Tensor> {
    shard.narrow(0, 0, len)?.to_device(&Device::Cpu)?.copy()
}

/// Rank `rank`'s padded shard of `layout` (saved as `group`) for state `kind`, read back:
/// the elements it owns, zero-padded (padding is zero in every buffer wick keeps).
pub(crate) fn read_shard(
    reader: &dyn StateReader,
    kind: &str,
    (layout, group): (&FlatLayout, &FlatGroup),
    rank: usize,
    device: &Device,
) -> Result<Tensor> {
    let owned = layout.owned(rank);
    let values = reader.read(kind, &group.params, owned.clone())?;
    let padding = layout.shard_len() - owned.len();
    let values = match padding {
        0 => values,
        n => Tensor::cat(&[values, Tensor::zeros(n, DType::F32, &Device::Cpu)?], 0)?,
    };
    values.to_device(device)
}

/// Every parameter of `group` read back whole, in its shape.
pub(crate) fn read_whole(
    reader: &dyn StateReader,
    kind: &str,
    group: &FlatGroup,
    device: &Device,
) -> Result<Vec<Tensor>> {
    group
        .params
        .iter()
        .map(|(name, shape)| {
            reader
                .read(
                    kind,
                    &[(name.clone(), shape.clone())],
                    0..shape.elem_count(),
                )?
                .reshape(shape)?
                .to_device(device)
        })
        .collect()
}

/// The optimizer kinds to restore: those this optimizer keeps, or none when the checkpoint
/// was saved before the first step. A checkpoint with other kinds was saved by another
/// optimizer.
pub(crate) fn kinds_to_restore(
    reader: &dyn StateReader,
    expected: &'static [&'static str],
) -> Result<&'static [&'static str]> {
    let saved = reader.optimizer_kinds();
    if saved.is_empty() {
        return Ok(&[]);
    }
    if saved.len() != expected.len() || expected.iter().any(|k| !saved.iter().any(|s| s == k)) {
        candle_core::bail!(
            "optimizer state in the checkpoint is {saved:?} but this optimizer keeps {expected:?}: it was saved with another optimizer"
        )
    }
    Ok(expected)
}
