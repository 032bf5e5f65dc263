//! `Ddp`: replicated parameters, gradients averaged over the ranks by bucketed all-reduce.
//!
//! Gradients are copied into flat buckets of about `bucket_cap_bytes`, filled in reverse
//! registration order (the order backward produces them, as in PyTorch's DDP), and each
//! bucket is one all-reduce, issued during backward as soon as the bucket is full
//! ([`crate::replicated::bucket_reduce`]). Every rank then applies the same update to the same
//! parameters, so replicas stay identical without a broadcast.

use crate::replicated::bucket_reduce::{buckets, BucketPlan, DEFAULT_BUCKET_CAP_BYTES};
use crate::replicated::replicated_state::ReplicatedState;
use crate::replicated::replicated_strategy::{GradReduce, Replicated};
use candle_core::Var;
use wick_core::{Result, Sharding};

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
        buckets(params, self.bucket_cap_bytes)
    }

    /// Every bucket all-reduced.
    fn plan(&self, state: &ReplicatedState) -> BucketPlan {
        BucketPlan::whole(self.buckets(&state.params))
    }
}

impl GradReduce for BucketedAllReduce {
    fn step(&self, name: &str, state: &mut ReplicatedState) -> Result<()> {
        let grads = state.averaged_grads(name, self.plan(state))?;
        state.apply(name, grads)
    }

    fn overlapped(&self, _name: &str, state: &ReplicatedState) -> Result<Option<BucketPlan>> {
        Ok(Some(self.plan(state)))
    }

    fn sharding(&self) -> Sharding {
        Sharding::default()
    }
}
