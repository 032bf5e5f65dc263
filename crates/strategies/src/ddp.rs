//! `Ddp`: replicated parameters, gradients averaged over the ranks by bucketed all-reduce.
//!
//! Gradients are copied into flat buckets of about `bucket_cap_bytes`, filled in reverse
//! registration order (the order backward produces them, as in PyTorch's DDP), and each
//! bucket is one all-reduce. Every rank then applies the same update to the same
//! parameters, so replicas stay identical without a broadcast.

use crate::replicated::ReplicatedState;
use crate::replicated_strategy::{GradReduce, Replicated};
use candle_core::{Tensor, Var};
use wick_core::{ReduceOp, Result, Sharding};

/// PyTorch DDP's default bucket size.
const DEFAULT_BUCKET_CAP_BYTES: usize = 25 << 20;

/// Distributed data parallel.
pub type Ddp = Replicated<BucketedAllReduce>;

/// Gradients averaged by one all-reduce per bucket of about `bucket_cap_bytes` ([`Ddp`]).
#[derive(Debug, Clone, Copy)]
pub struct BucketedAllReduce {
    bucket_cap_bytes: usize,
}

impl Ddp {
    /// The registry name.
    pub const NAME: &'static str = "ddp";

    /// DDP with 25 MiB buckets.
    pub fn new() -> Self {
        Replicated::with_reduce(
            Self::NAME,
            BucketedAllReduce {
                bucket_cap_bytes: DEFAULT_BUCKET_CAP_BYTES,
            },
        )
    }

    /// Sets the bucket size in bytes (a parameter larger than it gets a bucket of its own).
    pub fn with_bucket_cap_bytes(mut self, bytes: usize) -> Self {
        self.reduce_mut().bucket_cap_bytes = bytes.max(1);
        self
    }

    /// The parameter indices of each bucket, in all-reduce order (empty before the
    /// parameters exist).
    pub fn buckets(&self) -> Vec<Vec<usize>> {
        self.reduce().buckets(&self.state().params)
    }
}

impl Default for Ddp {
    fn default() -> Self {
        Self::new()
    }
}

impl BucketedAllReduce {
    /// Buckets of `params` in reverse order, each up to the cap (or one larger parameter).
    fn buckets(&self, params: &[Var]) -> Vec<Vec<usize>> {
        let mut buckets = Vec::new();
        let mut current = Vec::new();
        let mut bytes = 0;
        for (i, p) in params.iter().enumerate().rev() {
            let size = p.elem_count() * p.dtype().size_in_bytes();
            if !current.is_empty() && bytes + size > self.bucket_cap_bytes {
                buckets.push(std::mem::take(&mut current));
                bytes = 0;
            }
            current.push(i);
            bytes += size;
        }
        if !current.is_empty() {
            buckets.push(current);
        }
        buckets
    }
}

impl GradReduce for BucketedAllReduce {
    fn step(&self, name: &str, state: &mut ReplicatedState) -> Result<()> {
        let mut grads = state.take_grads()?;
        let world = state.world(name)?;
        for bucket in self.buckets(&state.params) {
            let parts = bucket
                .iter()
                .map(|&i| grads[i].flatten_all())
                .collect::<candle_core::Result<Vec<_>>>()?;
            // A fresh buffer even for one gradient (where `cat` would hand back the same
            // storage): candle gives both operands of an add one shared gradient, and the
            // all-reduce below works in place.
            let flat = match parts.as_slice() {
                [one] => one.copy()?,
                _ => Tensor::cat(&parts, 0)?,
            };
            world.all_reduce_in_place(&flat, ReduceOp::Mean)?;
            let mut offset = 0;
            for &i in &bucket {
                let n = grads[i].elem_count();
                grads[i] = flat.narrow(0, offset, n)?.reshape(grads[i].shape())?;
                offset += n;
            }
        }
        state.apply(name, grads)
    }

    fn sharding(&self) -> Sharding {
        Sharding::default()
    }
}
