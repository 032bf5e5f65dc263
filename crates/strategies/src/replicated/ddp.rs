//! `Ddp`: replicated parameters, gradients averaged over the ranks by bucketed all-reduce.
//!
//! Gradients are copied into flat buckets of about `bucket_cap_bytes`, filled in reverse
//! registration order (the order backward produces them, as in PyTorch's DDP), and each
//! bucket is one all-reduce, issued during backward as soon as the bucket is full
//! ([`crate::replicated::bucket_reduce`]). Every rank then applies the same update to the same
//! parameters, so replicas stay identical without a broadcast.

use crate::replicated::bucket_reduce::{buckets, BucketPlan, DEFAULT_BUCKET_CAP_BYTES};
use crate::replicated::grad_reduce::GradReduce;
use crate::replicated::replicated_state::ReplicatedState;
use crate::replicated::replicated_strategy::Replicated;
use wick_core::{Result, Sharding, StepReport};

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
}

impl Default for Ddp {
    fn default() -> Self {
        Self::new()
    }
}

impl BucketedAllReduce {
    /// Every bucket all-reduced: buckets of the parameters in reverse order, each up to the
    /// cap (or one larger parameter).
    fn plan(&self, state: &ReplicatedState) -> BucketPlan {
        BucketPlan::whole(buckets(&state.params, self.bucket_cap_bytes))
    }
}

impl GradReduce for BucketedAllReduce {
    fn step(&self, state: &mut ReplicatedState) -> Result<StepReport> {
        let grads = state.averaged_grads(self.plan(state))?;
        state.apply(grads)
    }

    fn overlapped(&self, state: &ReplicatedState) -> Option<BucketPlan> {
        Some(self.plan(state))
    }

    fn sharding(&self) -> Sharding {
        Sharding::default()
    }
}
