//! All-gather prefetch for full sharding: while one unit computes, the next one's gather
//! (the next in forward, the previous in backward) is in flight.
//!
//! Each gather is issued with [`Collective::all_gather_start`] on the rank's own world and
//! waited on when its unit runs. Worlds with a progress engine (MPI's nonblocking
//! collectives) move the data meanwhile; worlds that complete calls at once gather at the
//! request. Every rank requests the same units in the same order (the graph is the same),
//! so the calls line up on every rank like any other collective.

use candle_core::{DType, Result, Tensor};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use wick_core::{lock, Collective, CollectiveExt, Work};

/// A gather in flight: for each of a unit's parts, the buffer it fills and the call to
/// wait on (none for an empty part).
type Pending = Vec<(Tensor, Option<Work>)>;

/// A unit's flat parts to gather: each part's shard and padded length (the trainable part
/// first, then its frozen ones, if any).
pub(crate) type UnitParts = Vec<(Tensor, usize)>;

/// One rank's gathers in flight, by unit index.
pub(crate) struct Prefetcher {
    world: Arc<dyn Collective>,
    /// Each unit's parts, by unit index.
    units: Vec<UnitParts>,
    dtype: DType,
    /// The most gathered parameters (elements) a prefetch may leave alive beside the unit
    /// that asks for it (DeepSpeed's `stage3_max_live_parameters`); `None`: no bound.
    max_live: Option<usize>,
    pending: Mutex<HashMap<usize, Pending>>,
}

/// The elements of a unit's parts together.
fn unit_len(parts: &UnitParts) -> usize {
    parts.iter().map(|(_, padded)| padded).sum()
}

impl Prefetcher {
    /// Prefetches `units` over `world`, gathering in `dtype`, at most `max_live` elements
    /// gathered at once.
    pub(crate) fn new(
        world: Arc<dyn Collective>,
        units: Vec<UnitParts>,
        dtype: DType,
        max_live: Option<usize>,
    ) -> Self {
        Prefetcher {
            world,
            units,
            dtype,
            max_live,
            pending: Mutex::default(),
        }
    }

    fn pending(&self) -> std::sync::MutexGuard<'_, HashMap<usize, Pending>> {
        lock(&self.pending)
    }

    /// Starts gathering `unit` while unit `beside` is gathered, unless it is out of range,
    /// already asked for, or the two together would pass the bound on live parameters
    /// (then `unit` is gathered when it runs, as without prefetch). Every rank decides
    /// alike: the sizes are the same on all. A gather that cannot start is this rank's
    /// error now, typed (a peer's failure stays one, `CollectiveError::find_in`): kept for
    /// later, the rank would go on to a different collective than its peers.
    pub(crate) fn request(&self, unit: usize, beside: usize) -> Result<()> {
        let Some(parts) = self.units.get(unit) else {
            return Ok(());
        };
        let live = unit_len(parts) + self.units.get(beside).map_or(0, unit_len);
        if self.max_live.is_some_and(|max| live > max) {
            return Ok(());
        }
        let mut pending = self.pending();
        if pending.contains_key(&unit) {
            return Ok(());
        }
        let started = parts
            .iter()
            .map(|(shard, padded)| -> Result<(Tensor, Option<Work>)> {
                let dtype = gather_dtype(shard, self.dtype);
                let full = Tensor::zeros(*padded, dtype, shard.device())?;
                if *padded == 0 {
                    return Ok((full, None));
                }
                let shard = shard.contiguous()?.to_dtype(dtype)?;
                let work = self
                    .world
                    .all_gather_start(&shard, &full)
                    .map_err(candle_core::Error::from)?;
                Ok((full, Some(work)))
            })
            .collect::<Result<Vec<_>>>()?;
        pending.insert(unit, started);
        Ok(())
    }

    /// The gathered buffers of `unit`'s parts if it was prefetched (waiting for them if
    /// still in flight).
    pub(crate) fn take(&self, unit: usize) -> Option<Result<Vec<Tensor>>> {
        let started = self.pending().remove(&unit)?;
        Some(
            started
                .into_iter()
                .map(|(full, work)| match work {
                    Some(work) => work.wait().map(|()| full).map_err(candle_core::Error::from),
                    None => Ok(full),
                })
                .collect(),
        )
    }

    /// Waits for every gather in flight and drops the results (before the shards change).
    pub(crate) fn drain(&self) {
        let pending: Vec<_> = self.pending().drain().collect();
        for (_, started) in pending {
            for work in started.into_iter().filter_map(|(_, work)| work) {
                let _ = work.wait();
            }
        }
    }
}

impl Drop for Prefetcher {
    fn drop(&mut self) {
        self.drain();
    }
}

/// The dtype a part's shard is gathered in: values in the compute dtype `dtype`, bytes (a
/// quantized base's blocks) as they are.
fn gather_dtype(shard: &Tensor, dtype: DType) -> DType {
    match shard.dtype().is_float() {
        true => dtype,
        false => shard.dtype(),
    }
}

/// The full flat buffer of a unit's part: every rank's shard, its values in `dtype` (no
/// collective for an empty part: every rank's is empty alike).
pub(crate) fn gather(
    world: &dyn Collective,
    shard: &Tensor,
    padded: usize,
    dtype: DType,
) -> Result<Tensor> {
    let dtype = gather_dtype(shard, dtype);
    let full = Tensor::zeros(padded, dtype, shard.device())?;
    if padded == 0 {
        return Ok(full);
    }
    let shard = shard.contiguous()?.to_dtype(dtype)?;
    world
        .all_gather_into(&shard, &full)
        .map_err(candle_core::Error::from)?;
    Ok(full)
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::Device;
    use wick_core::SoloWorld;

    /// Units of 4, 6 and 10 elements over a world of one.
    fn prefetcher(max_live: Option<usize>) -> Prefetcher {
        let units = [4usize, 6, 10]
            .iter()
            .map(|&n| vec![(Tensor::ones(n, DType::F32, &Device::Cpu).unwrap(), n)])
            .collect();
        Prefetcher::new(Arc::new(SoloWorld), units, DType::F32, max_live)
    }

    #[test]
    fn a_prefetch_beyond_the_live_bound_is_not_made() {
        let bounded = prefetcher(Some(12));
        bounded.request(1, 0).unwrap(); // 4 + 6 <= 12: gathered ahead
        bounded.request(2, 1).unwrap(); // 6 + 10 > 12: left to its turn
        let full = bounded.take(1).expect("prefetched").unwrap();
        assert_eq!(full[0].to_vec1::<f32>().unwrap(), vec![1.0; 6]);
        assert!(
            bounded.take(2).is_none(),
            "unit 2 was prefetched past the bound"
        );
        let free = prefetcher(None);
        free.request(2, 1).unwrap();
        assert!(free.take(2).is_some(), "no bound: prefetched");
    }
}
