//! Shard math for a unit's quantized frozen parameters: their stored blocks in one
//! [`BlockFormat`] (which decode alone) dealt to the ranks whole, so that a block and its
//! scales never straddle two ranks.
//!
//! The parameters' stored bytes, in order and end to end, make the unit's packed buffer.
//! Rank r owns one run of whole blocks of it, cut at the first block boundary at or after
//! r/W of its bytes. The all-gather needs equal shards, so each is padded to the longest;
//! the gathered buffer is packed again ([`BlockLayout::pack`]), and each parameter's bytes
//! are one view of it.

use candle_core::{Shape, Tensor};
use std::ops::Range;
use wick_core::BlockFormat;

/// Parameter `name`'s f32 values of `shape`, decoded from its `format` blocks `stored` (a
/// u8 tensor), on their device.
pub(crate) fn decoded(
    format: BlockFormat,
    name: &str,
    stored: &Tensor,
    shape: &Shape,
) -> candle_core::Result<Tensor> {
    (format.decode_tensor(stored, shape))
        .map_err(|e| candle_core::Error::Msg(format!("parameter '{name}': {e}")))
}

/// One quantized parameter's place in the packed buffer.
#[derive(Debug, Clone, PartialEq)]
pub struct BlockEntry {
    /// The parameter's full name.
    pub name: String,
    /// The shape of its values.
    pub shape: Shape,
    /// Its first byte in the packed buffer.
    pub offset: usize,
    /// Its stored bytes ([`BlockFormat::stored_len`] of its element count).
    pub len: usize,
}

impl BlockEntry {
    /// The number of values it holds.
    pub fn numel(&self) -> usize {
        self.shape.elem_count()
    }

    /// Its stored bytes as a view of the packed buffer `packed`.
    pub fn view(&self, packed: &Tensor) -> candle_core::Result<Tensor> {
        packed.narrow(0, self.offset, self.len)
    }

    /// The values that the stored bytes `bytes` (relative to its own first byte, at block
    /// boundaries of `format`) hold.
    fn values_of(&self, format: BlockFormat, bytes: Range<usize>) -> Range<usize> {
        let value = |byte: usize| match byte == self.len {
            true => self.numel(),
            false => byte / format.block_bytes() * format.block_values(),
        };
        value(bytes.start)..value(bytes.end)
    }
}

/// Where every quantized parameter of a unit lies in its packed buffer, and which rank
/// owns which blocks.
#[derive(Debug, Clone, PartialEq)]
pub struct BlockLayout {
    format: BlockFormat,
    entries: Vec<BlockEntry>,
    /// Rank r owns bytes `bounds[r]..bounds[r + 1]` of the packed buffer.
    bounds: Vec<usize>,
}

impl BlockLayout {
    /// Lays out `params` (name, shape), stored in `format`, in order for `world_size` ranks.
    pub fn new(
        format: BlockFormat,
        params: impl IntoIterator<Item = (String, Shape)>,
        world_size: usize,
    ) -> Self {
        assert!(world_size > 0, "a world has at least one rank");
        let mut offset = 0;
        let entries: Vec<BlockEntry> = params
            .into_iter()
            .map(|(name, shape)| {
                let len = format.stored_len(shape.elem_count());
                let e = BlockEntry {
                    name,
                    shape,
                    offset,
                    len,
                };
                offset += len;
                e
            })
            .collect();
        let total = offset;
        // Rank r's run starts at the first block boundary at or after r/W of the bytes.
        let block_start_from = |ideal: usize| {
            let Some(e) = entries.iter().find(|e| ideal < e.offset + e.len) else {
                return total;
            };
            let within = ideal.saturating_sub(e.offset);
            let start = within.div_ceil(format.block_bytes()) * format.block_bytes();
            e.offset + start.min(e.len)
        };
        let bounds = (0..=world_size)
            .map(|r| block_start_from((r * total).div_ceil(world_size)))
            .collect();
        BlockLayout {
            format,
            entries,
            bounds,
        }
    }

    /// The form its blocks are stored in.
    pub fn format(&self) -> BlockFormat {
        self.format
    }

    /// The parameters, in order.
    pub fn entries(&self) -> &[BlockEntry] {
        &self.entries
    }

    /// The parameter called `name`.
    pub fn entry(&self, name: &str) -> Option<&BlockEntry> {
        self.entries.iter().find(|e| e.name == name)
    }

    /// The values the parameters hold together.
    pub fn numel(&self) -> usize {
        self.entries.iter().map(BlockEntry::numel).sum()
    }

    /// The ranks this layout is cut for.
    pub fn world_size(&self) -> usize {
        self.bounds.len() - 1
    }

    /// Rank `rank`'s bytes of the packed buffer.
    pub fn owned(&self, rank: usize) -> Range<usize> {
        self.bounds[rank]..self.bounds[rank + 1]
    }

    /// Bytes a shard takes with its padding: the most any rank owns.
    pub fn shard_len(&self) -> usize {
        (0..self.world_size())
            .map(|r| self.owned(r).len())
            .max()
            .unwrap_or(0)
    }

    /// The gathered buffer's length: every rank's padded shard.
    pub fn padded(&self) -> usize {
        self.shard_len() * self.world_size()
    }

    /// For each parameter with blocks in rank `rank`'s shard, in order: its index, its
    /// entry, the values those blocks hold, and where their bytes start in the shard.
    pub fn pieces(
        &self,
        rank: usize,
    ) -> impl Iterator<Item = (usize, &BlockEntry, Range<usize>, usize)> + '_ {
        let owned = self.owned(rank);
        self.entries.iter().enumerate().filter_map(move |(i, e)| {
            let start = e.offset.max(owned.start);
            let end = (e.offset + e.len).min(owned.end);
            (start < end).then(|| {
                let values = e.values_of(self.format, start - e.offset..end - e.offset);
                (i, e, values, start - owned.start)
            })
        })
    }

    /// The packed buffer from the gathered one (every rank's padded shard, in rank order).
    /// Rank 0 always owns the first block, so where one rank owns every block the packed
    /// buffer is the gathered one's start, a view from its first byte.
    pub fn pack(&self, gathered: &Tensor) -> candle_core::Result<Tensor> {
        let shard_len = self.shard_len();
        let parts = (0..self.world_size())
            .filter(|&r| !self.owned(r).is_empty())
            .map(|r| gathered.narrow(0, r * shard_len, self.owned(r).len()))
            .collect::<candle_core::Result<Vec<_>>>()?;
        match parts.len() {
            0 => gathered.narrow(0, 0, 0),
            _ => Tensor::cat(&parts, 0),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::{DType, Device};

    fn layout(format: BlockFormat, w: usize) -> BlockLayout {
        let shapes = [
            ("q", Shape::from((576, 576))),
            ("tiny", Shape::from(7)),
            ("up", Shape::from((64, 1024))),
        ];
        BlockLayout::new(format, shapes.map(|(n, s)| (n.to_string(), s)), w)
    }

    #[test]
    fn ranks_own_whole_blocks_covering_every_value_once() {
        for (format, w) in BlockFormat::ALL
            .into_iter()
            .flat_map(|f| (1..=6).map(move |w| (f, w)))
        {
            let l = layout(format, w);
            let total: usize = l.entries().iter().map(|e| e.len).sum();
            assert_eq!(l.owned(0).start, 0);
            assert_eq!(l.owned(w - 1).end, total);
            let mut seen: Vec<Vec<u8>> = l.entries().iter().map(|e| vec![0; e.numel()]).collect();
            for r in 0..w {
                let mut at = 0;
                for (i, e, values, shard_at) in l.pieces(r) {
                    assert_eq!(shard_at, at, "pieces are contiguous in the shard");
                    at += format.stored_len(values.len());
                    assert!(
                        values.start.is_multiple_of(format.block_values()),
                        "{format} w={w}: {} cut inside a block",
                        e.name
                    );
                    seen[i][values].iter_mut().for_each(|n| *n += 1);
                }
                assert_eq!(at, l.owned(r).len(), "{format} w={w} r={r}");
                assert!(at <= l.shard_len());
            }
            assert!(seen.iter().flatten().all(|&n| n == 1), "{format} w={w}");
            // The bytes are shared out near evenly: no rank owns a block more than its part.
            let part = total.div_ceil(w);
            assert!(
                l.shard_len() <= part + format.block_bytes(),
                "{format} w={w}"
            );
        }
    }

    #[test]
    fn the_gathered_buffer_packs_back_to_the_parameters_bytes() {
        for w in 1..=6 {
            let l = layout(BlockFormat::Q4K, w);
            let total = l.owned(w - 1).end;
            let packed: Vec<u8> = (0..total).map(|i| (i % 251) as u8).collect();
            let mut gathered = vec![0u8; l.padded()];
            for r in 0..w {
                let owned = l.owned(r);
                let at = r * l.shard_len();
                gathered[at..at + owned.len()].copy_from_slice(&packed[owned]);
            }
            let gathered = Tensor::new(gathered, &Device::Cpu).unwrap();
            let back = l.pack(&gathered).unwrap();
            assert_eq!(back.dtype(), DType::U8);
            assert_eq!(back.to_vec1::<u8>().unwrap(), packed, "w={w}");
        }
    }
}
