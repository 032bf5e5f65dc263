//! `SoloWorld`: the world of a single rank, where every collective is a local copy.
//!
//! It lets a strategy run with no engine at all: in single-device code, in tests, and in
//! examples that use wick-strategies alone.

use crate::host::{with_bytes, with_bytes_mut_from, HostAccessError};
use crate::{Collective, CollectiveError, ReduceOp};
use candle_core::Tensor;

/// A world of one rank.
#[derive(Debug, Clone, Copy, Default)]
pub struct SoloWorld;

fn unsupported(op: &'static str) -> impl Fn(HostAccessError) -> CollectiveError {
    move |e| CollectiveError::Unsupported {
        rank: 0,
        op,
        message: e.0,
    }
}

fn mismatch(op: &'static str, from: usize, to: usize) -> CollectiveError {
    CollectiveError::Mismatch {
        rank: 0,
        op,
        message: format!("input has {from} bytes, output {to}"),
    }
}

fn copy(op: &'static str, from: &Tensor, to: &Tensor) -> Result<(), CollectiveError> {
    with_bytes_mut_from(to, from, |dst, src| {
        if dst.len() != src.len() {
            return Err(mismatch(op, src.len(), dst.len()));
        }
        dst.copy_from_slice(src);
        Ok(())
    })
    .map_err(unsupported(op))?
}

impl Collective for SoloWorld {
    fn rank(&self) -> usize {
        0
    }

    fn world_size(&self) -> usize {
        1
    }

    fn all_gather_into(&self, shard: &Tensor, full: &Tensor) -> Result<(), CollectiveError> {
        copy("all_gather", shard, full)
    }

    fn all_gather_host(&self, shard: &Tensor, full: &mut [u8]) -> Result<(), CollectiveError> {
        with_bytes(shard, |src| {
            if src.len() != full.len() {
                return Err(mismatch("all_gather", src.len(), full.len()));
            }
            full.copy_from_slice(src);
            Ok(())
        })
        .map_err(unsupported("all_gather"))?
    }

    fn reduce_scatter_into(
        &self,
        full: &Tensor,
        shard: &Tensor,
        _: ReduceOp,
    ) -> Result<(), CollectiveError> {
        copy("reduce_scatter", full, shard)
    }

    fn all_reduce_in_place(&self, _: &Tensor, _: ReduceOp) -> Result<(), CollectiveError> {
        Ok(())
    }

    fn broadcast_in_place(&self, _: &Tensor, root: usize) -> Result<(), CollectiveError> {
        match root {
            0 => Ok(()),
            _ => Err(CollectiveError::Mismatch {
                rank: 0,
                op: "broadcast",
                message: format!("root {root} is not a rank of a world of 1"),
            }),
        }
    }

    fn barrier(&self) -> Result<(), CollectiveError> {
        Ok(())
    }
}
