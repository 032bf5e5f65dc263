//! A rank's shard of a unit's quantized frozen parameters, made without the whole of any.
//!
//! Each rank quantizes only the whole stored blocks it owns ([`BlockLayout`]). A ggml
//! block's bytes depend on its own values alone. An NF4 block's also depend on one number
//! of its whole parameter, the offset (the mean of all its absmaxes): each rank computes
//! the absmaxes of its own blocks, one all-reduce adds them into every rank's copy (each
//! place has one rank's value and zeros elsewhere, so the sum is exact), and every rank
//! takes the same mean. The shards are then, byte for byte, the parameter quantized whole
//! and cut at block boundaries, for every world size.

use crate::layout::block_layout::BlockLayout;
use crate::layout::init::{param_blocks, param_values};
use candle_core::{Device, Tensor};
use wick_core::{
    nf4_absmax, nf4_offset, Collective, CollectiveExt, ParamInit, ReduceOp, NF4_BLOCK,
};

/// Rank `world.rank()`'s shard of `layout` (padded to its shard length), parameter i's
/// blocks made from `inits[i]` under `seed` (or read as its weights hold them). For NF4 a
/// collective: every rank of `world` calls it for the same unit at the same point.
pub(crate) fn block_shard(
    layout: &BlockLayout,
    inits: &[&ParamInit],
    seed: u64,
    world: &dyn Collective,
    device: &Device,
) -> candle_core::Result<Tensor> {
    let format = layout.format();
    let mut shard = vec![0u8; layout.shard_len()];
    let mut put = |at: usize, bytes: &[u8]| shard[at..at + bytes.len()].copy_from_slice(bytes);
    if !format.needs_weight_offset() {
        // A block of its own values alone: made (or read as the weights hold it) apart.
        for (param, entry, range, at) in layout.pieces(world.rank()) {
            let of = (entry.name.as_str(), &entry.shape);
            put(at, &param_blocks(inits[param], seed, of, format, range)?);
        }
    } else {
        let pieces: Vec<Piece> = layout
            .pieces(world.rank())
            .map(|(param, entry, range, at)| {
                let first = range.start;
                let values = param_values(inits[param], seed, &entry.name, &entry.shape, range)?;
                Ok(Piece {
                    param,
                    first,
                    at,
                    values,
                })
            })
            .collect::<candle_core::Result<_>>()?;
        let offsets = nf4_offsets(layout, &pieces, world, device)?;
        for p in &pieces {
            put(p.at, &format.quantize(&p.values, Some(offsets[p.param]))?);
        }
    }
    let len = shard.len();
    Tensor::from_vec(shard, len, device)
}

/// This rank's values of one NF4 parameter's blocks.
struct Piece {
    /// The parameter's index in the layout.
    param: usize,
    /// The first value's index in the parameter.
    first: usize,
    /// Where the blocks' bytes start in the shard.
    at: usize,
    values: Vec<f32>,
}

/// Each NF4 parameter's offset, the mean of all its absmaxes, from this rank's `pieces`
/// and one all-reduce.
fn nf4_offsets(
    layout: &BlockLayout,
    pieces: &[Piece],
    world: &dyn Collective,
    device: &Device,
) -> candle_core::Result<Vec<f32>> {
    // Parameter i's absmaxes start at absmax_at[i] in the unit's vector of all of them.
    let mut absmax_at = vec![0];
    for e in layout.entries() {
        absmax_at.push(absmax_at[absmax_at.len() - 1] + e.numel().div_ceil(NF4_BLOCK));
    }
    let mut absmax = vec![0f32; absmax_at[absmax_at.len() - 1]];
    for p in pieces {
        let at = absmax_at[p.param] + p.first / NF4_BLOCK;
        let own = nf4_absmax(&p.values);
        absmax[at..at + own.len()].copy_from_slice(&own);
    }
    let len = absmax.len();
    let all = Tensor::from_vec(absmax, len, device)?;
    world
        .all_reduce_in_place(&all, ReduceOp::Sum)
        .map_err(candle_core::Error::from)?;
    let absmax: Vec<f32> = all.to_vec1()?;
    Ok((0..layout.entries().len())
        .map(|i| nf4_offset(&absmax[absmax_at[i]..absmax_at[i + 1]]))
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::Shape;
    use candle_nn::Init;
    use wick_core::{BlockFormat, Call, CollectiveError, Position, SoloWorld, Work};

    /// Rank `rank` of `size`, whose all-reduce checks this rank's part of the absmaxes
    /// against `all` (every other place zero) and hands back `all`, as the ranks' sum.
    struct AbsmaxWorld {
        rank: usize,
        size: usize,
        all: Vec<f32>,
    }

    impl Collective for AbsmaxWorld {
        fn position(&self) -> Position {
            Position::new(self.rank, self.size)
        }
        fn start(&self, call: Call<'_>) -> Result<Work, CollectiveError> {
            let Call::AllReduce { tensor, .. } = call else {
                panic!("only the absmaxes' all-reduce is expected");
            };
            let mine: Vec<f32> = tensor.to_vec1().unwrap();
            for (m, a) in mine.iter().zip(&self.all) {
                assert!(
                    *m == 0.0 || m == a,
                    "rank {} put {m} where {a} belongs",
                    self.rank
                );
            }
            let all = Tensor::new(self.all.as_slice(), tensor.device()).unwrap();
            tensor.slice_set(&all, 0, 0).unwrap();
            Ok(Work::done())
        }
    }

    #[test]
    fn shards_are_the_whole_parameters_quantized_and_cut_at_blocks() {
        for format in BlockFormat::ALL {
            shards_of(format);
        }
    }

    fn shards_of(format: BlockFormat) {
        let params = [
            ("w", Shape::from((300, 130))),
            ("b", Shape::from(77)),
            ("v", Shape::from((64, 512))),
        ];
        let layout_of = |w: usize| {
            let params = params.iter().map(|(n, s)| (n.to_string(), s.clone()));
            BlockLayout::new(format, params, w)
        };
        let init = ParamInit::Init(Init::Randn {
            mean: 0.0,
            stdev: 0.02,
        });
        let inits = [&init, &init, &init];
        let values: Vec<Vec<f32>> = params
            .iter()
            .map(|(name, shape)| param_values(&init, 7, name, shape, 0..shape.elem_count()))
            .collect::<candle_core::Result<_>>()
            .unwrap();
        let whole: Vec<u8> = (values.iter())
            .flat_map(|v| format.quantize(v, None).unwrap())
            .collect();
        let all: Vec<f32> = values.iter().flat_map(|v| nf4_absmax(v)).collect();
        let solo = block_shard(&layout_of(1), &inits, 7, &SoloWorld, &Device::Cpu).unwrap();
        assert_eq!(solo.to_vec1::<u8>().unwrap(), whole, "{format}");
        for w in [2, 3, 4, 7] {
            let layout = layout_of(w);
            let mut packed = Vec::new();
            for rank in 0..w {
                let all = all.clone();
                let world = AbsmaxWorld { rank, size: w, all };
                let shard = block_shard(&layout, &inits, 7, &world, &Device::Cpu).unwrap();
                let shard: Vec<u8> = shard.to_vec1().unwrap();
                assert_eq!(shard.len(), layout.shard_len());
                packed.extend_from_slice(&shard[..layout.owned(rank).len()]);
            }
            assert_eq!(packed, whole, "{format} w={w}");
        }
    }
}
