//! `EndedWorld`: what a rank's strategy is connected to once a stage of ranks as threads is
//! over. Its threads have finished, so no collective can complete: every call fails at once
//! with [`CollectiveError::Ended`], which says what to call instead, rather than waiting on
//! ranks that left.

use wick_core::{Call, Collective, CollectiveError, Position, Work};

/// The world of a finished stage, seen from one of its ranks.
#[derive(Debug, Clone, Copy)]
pub struct EndedWorld {
    rank: usize,
    world_size: usize,
}

impl EndedWorld {
    /// Rank `rank` of a finished world of `world_size` ranks.
    pub fn new(rank: usize, world_size: usize) -> Self {
        EndedWorld { rank, world_size }
    }

    fn ended(&self, op: &'static str) -> CollectiveError {
        CollectiveError::Ended {
            rank: self.rank,
            world_size: self.world_size,
            op,
        }
    }
}

impl Collective for EndedWorld {
    fn position(&self) -> Position {
        Position::new(self.rank, self.world_size)
    }

    fn start(&self, call: Call<'_>) -> Result<Work, CollectiveError> {
        Err(self.ended(call.name()))
    }

    /// Splitting needs no peers: each part of an ended world is ended too (a strategy that
    /// shards within groups splits when it is connected).
    fn split(&self, _: usize) -> Result<std::sync::Arc<dyn Collective>, CollectiveError> {
        Ok(std::sync::Arc::new(*self))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::{DType, Device, Tensor};
    use wick_core::CollectiveExt;

    #[test]
    fn every_call_fails_at_once_saying_what_to_use() {
        let world = EndedWorld::new(1, 3);
        let t = Tensor::zeros(3, DType::F32, &Device::Cpu).unwrap();
        let e = world.all_gather_into(&t, &t).unwrap_err().to_string();
        assert!(
            e.contains("rank 1: all_gather")
                && e.contains("sharded over 3 ranks")
                && e.contains("Trainer::predict")
                && e.contains("Trainer::full_parameters"),
            "{e}"
        );
        assert!(world.barrier().is_err());
        assert_eq!(world.split(0).unwrap().world_size(), 3);
    }
}
