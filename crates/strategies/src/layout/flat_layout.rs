//! Shard math for flat parameter buffers, in one place.
//!
//! A unit's parameters, in registration order, are laid end to end in one buffer that is
//! right-padded to a multiple of the world size W; rank r owns elements [r*S, (r+1)*S) with
//! S = padded / W. Uneven sizes are the normal case: a 7x13 weight on 4 ranks spans ranks.

use candle_core::{Shape, Tensor};
use std::ops::Range;

/// Rank r's contiguous range of a padded flat buffer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ShardRange {
    /// First element owned.
    pub start: usize,
    /// One past the last element owned.
    pub end: usize,
}

impl ShardRange {
    /// The number of elements.
    pub fn len(&self) -> usize {
        self.end - self.start
    }

    /// Whether the range is empty.
    pub fn is_empty(&self) -> bool {
        self.start == self.end
    }
}

/// One parameter's place in a flat buffer.
#[derive(Debug, Clone, PartialEq)]
pub struct FlatEntry {
    /// The parameter's full name.
    pub name: String,
    /// Its shape.
    pub shape: Shape,
    /// Its first element in the flat buffer.
    pub offset: usize,
}

impl FlatEntry {
    /// The number of elements.
    pub fn numel(&self) -> usize {
        self.shape.elem_count()
    }

    /// The elements it covers in the flat buffer.
    pub fn range(&self) -> Range<usize> {
        self.offset..self.offset + self.numel()
    }

    /// The parameter's view of the (gathered) flat buffer `flat`, in its own shape.
    pub fn view(&self, flat: &Tensor) -> candle_core::Result<Tensor> {
        flat.narrow(0, self.offset, self.numel())?
            .reshape(self.shape.clone())
    }
}

/// Where every parameter of a unit lives in its flat buffer, and who owns what.
#[derive(Debug, Clone, PartialEq)]
pub struct FlatLayout {
    entries: Vec<FlatEntry>,
    numel: usize,
    world_size: usize,
}

impl FlatLayout {
    /// Lays out `params` (name, shape) in order for `world_size` ranks.
    pub fn new(params: impl IntoIterator<Item = (String, Shape)>, world_size: usize) -> Self {
        assert!(world_size > 0, "a world has at least one rank");
        let mut offset = 0;
        let entries = params
            .into_iter()
            .map(|(name, shape)| {
                let e = FlatEntry {
                    name,
                    shape,
                    offset,
                };
                offset += e.numel();
                e
            })
            .collect();
        FlatLayout {
            entries,
            numel: offset,
            world_size,
        }
    }

    /// The parameters, in order.
    pub fn entries(&self) -> &[FlatEntry] {
        &self.entries
    }

    /// Every parameter's view of the gathered flat buffer `flat`, with its name.
    pub fn views(&self, flat: &Tensor) -> candle_core::Result<Vec<(String, Tensor)>> {
        let view = |e: &FlatEntry| Ok((e.name.clone(), e.view(flat)?));
        self.entries.iter().map(view).collect()
    }

    /// The parameter called `name`.
    pub fn entry(&self, name: &str) -> Option<&FlatEntry> {
        self.entries.iter().find(|e| e.name == name)
    }

    /// Real elements (without padding).
    pub fn numel(&self) -> usize {
        self.numel
    }

    /// The buffer length: `numel` rounded up to a multiple of the world size.
    pub fn padded(&self) -> usize {
        self.numel.div_ceil(self.world_size) * self.world_size
    }

    /// Elements per rank, S.
    pub fn shard_len(&self) -> usize {
        self.padded() / self.world_size
    }

    /// The ranks this layout is cut for.
    pub fn world_size(&self) -> usize {
        self.world_size
    }

    /// Rank `rank`'s range of the padded buffer.
    pub fn shard(&self, rank: usize) -> ShardRange {
        let s = self.shard_len();
        ShardRange {
            start: rank * s,
            end: (rank + 1) * s,
        }
    }

    /// For each parameter that overlaps rank `rank`'s shard, in order: its index, its entry,
    /// the overlapping elements within the parameter, and where they start within the shard.
    pub fn pieces(
        &self,
        rank: usize,
    ) -> impl Iterator<Item = (usize, &FlatEntry, Range<usize>, usize)> + '_ {
        let shard = self.shard(rank);
        self.pieces_in(shard.start..shard.end)
    }

    /// As [`FlatLayout::pieces`], for any range of the flat buffer: positions are relative
    /// to `range.start`.
    pub fn pieces_in(
        &self,
        range: Range<usize>,
    ) -> impl Iterator<Item = (usize, &FlatEntry, Range<usize>, usize)> + '_ {
        self.entries.iter().enumerate().filter_map(move |(i, e)| {
            let start = e.offset.max(range.start);
            let end = (e.offset + e.numel()).min(range.end);
            (start < end).then(|| (i, e, start - e.offset..end - e.offset, start - range.start))
        })
    }

    /// Rank `rank`'s range without the padding: the real elements it owns.
    pub fn owned(&self, rank: usize) -> Range<usize> {
        let s = self.shard(rank);
        s.start.min(self.numel)..s.end.min(self.numel)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn layout(w: usize) -> FlatLayout {
        FlatLayout::new(
            [
                ("w".to_string(), Shape::from((7, 13))),
                ("b".to_string(), Shape::from(7)),
            ],
            w,
        )
    }

    #[test]
    fn pads_to_a_multiple_of_the_world() {
        for w in 1..=5 {
            let l = layout(w);
            assert_eq!(l.numel(), 98);
            assert_eq!(l.padded() % w, 0);
            assert!(l.padded() - l.numel() < w);
            assert_eq!(l.shard_len() * w, l.padded());
        }
        assert_eq!(layout(4).padded(), 100);
        assert_eq!(layout(3).shard(2), ShardRange { start: 66, end: 99 });
    }

    #[test]
    fn pieces_cover_every_element_exactly_once() {
        for w in 1..=5 {
            let l = layout(w);
            let mut seen = vec![0; l.numel()];
            for r in 0..w {
                let mut shard_pos = 0;
                for (_, e, within, at) in l.pieces(r) {
                    assert!(at >= shard_pos, "pieces come in shard order");
                    shard_pos = at + within.len();
                    assert!(shard_pos <= l.shard_len());
                    for i in within {
                        seen[e.offset + i] += 1;
                    }
                }
            }
            assert!(seen.iter().all(|&n| n == 1), "w={w}");
        }
    }

    #[test]
    fn a_rank_may_own_only_padding() {
        let l = FlatLayout::new([("tiny".to_string(), Shape::from(2))], 4);
        assert_eq!(l.padded(), 4);
        assert_eq!(l.pieces(3).count(), 0);
        assert_eq!(l.pieces(1).next().unwrap().2, 1..2);
    }
}
