//! What a unit's parameters become on this rank when the unit closes: the requests kept
//! from wrap time, laid out and made into this rank's shards, each element from the
//! counter-based init, so the full parameters never exist.

use crate::layout::block_layout::BlockLayout;
use crate::layout::flat_layout::FlatLayout;
use crate::layout::init::param_values;
use crate::sharded::block_shard::block_shard;
use crate::units::unit_views::{FrozenPart, PartLayout};
use candle_core::{Device, Shape, Tensor, Var};
use wick_core::{BlockFormat, Collective, CollectiveExt, ParamInit};

/// A parameter request of a unit, kept from wrap time.
pub(crate) struct Request {
    pub(crate) name: String,
    pub(crate) shape: Shape,
    pub(crate) init: ParamInit,
    pub(crate) trainable: bool,
    /// Frozen and born quantized: the form of its blocks.
    pub(crate) quantize: Option<BlockFormat>,
}

/// This rank's parts of one unit, made from its requests.
#[derive(Clone)]
pub(crate) struct UnitShards {
    /// The trainable parameters' layout and shard (empty when all are frozen).
    pub(crate) layout: FlatLayout,
    pub(crate) shard: Var,
    /// The frozen parameters, when the unit has any: values, then each block format's.
    pub(crate) frozen: Vec<FrozenPart>,
}

impl UnitShards {
    /// Lays out `requests` and makes this rank's shards of them under `seed`. A
    /// collective where NF4 blocks are asked for: every rank of `world` calls it for the
    /// same unit at the same point.
    pub(crate) fn new(
        requests: &[Request],
        seed: u64,
        world: &dyn Collective,
        device: &Device,
    ) -> candle_core::Result<Self> {
        let (trainable, frozen): (Vec<&Request>, Vec<&Request>) =
            requests.iter().partition(|r| r.trainable);
        let (quantized, frozen): (Vec<&Request>, Vec<&Request>) =
            frozen.into_iter().partition(|r| r.quantize.is_some());
        let (layout, shard) = flat_shard(&trainable, seed, world, device)?;
        let shard = Var::from_tensor(&shard)?;
        let mut parts = Vec::new();
        if !frozen.is_empty() {
            let (layout, shard) = flat_shard(&frozen, seed, world, device)?;
            let layout = PartLayout::Values(layout);
            parts.push(FrozenPart { layout, shard });
        }
        for format in BlockFormat::ALL {
            let blocks: Vec<&Request> = (quantized.iter().copied())
                .filter(|r| r.quantize == Some(format))
                .collect();
            if !blocks.is_empty() {
                parts.push(block_part(format, &blocks, seed, world, device)?);
            }
        }
        Ok(UnitShards {
            layout,
            shard,
            frozen: parts,
        })
    }
}

/// Lays out `requests` in order and makes this rank's shard of them.
fn flat_shard(
    requests: &[&Request],
    seed: u64,
    world: &dyn Collective,
    device: &Device,
) -> candle_core::Result<(FlatLayout, Tensor)> {
    let layout = FlatLayout::new(
        requests.iter().map(|r| (r.name.clone(), r.shape.clone())),
        world.world_size(),
    );
    let mut shard = vec![0f32; layout.shard_len()];
    for (index, entry, within, at) in layout.pieces(world.rank()) {
        let init = &requests[index].init;
        let values = param_values(init, seed, &entry.name, &entry.shape, within)?;
        shard[at..at + values.len()].copy_from_slice(&values);
    }
    let len = shard.len();
    Ok((layout, Tensor::from_vec(shard, len, device)?))
}

/// Lays out `requests` (frozen, born quantized in `format`) in whole stored blocks and
/// makes this rank's blocks of them (for NF4 a collective over the unit's ranks).
fn block_part(
    format: BlockFormat,
    requests: &[&Request],
    seed: u64,
    world: &dyn Collective,
    device: &Device,
) -> candle_core::Result<FrozenPart> {
    let layout = BlockLayout::new(
        format,
        requests.iter().map(|r| (r.name.clone(), r.shape.clone())),
        world.world_size(),
    );
    let inits: Vec<&ParamInit> = requests.iter().map(|r| &r.init).collect();
    let shard = block_shard(&layout, &inits, seed, world, device)?;
    Ok(FrozenPart {
        layout: PartLayout::Blocks(layout),
        shard,
    })
}
