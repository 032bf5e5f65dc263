//! [`GradReduce`]: what a replicated strategy (single, ddp, zero1, zero2) says of its own,
//! beside what [`Replicated`](crate::Replicated) writes once for all of them.

use crate::replicated::bucket_reduce::BucketPlan;
use crate::replicated::replicated_state::ReplicatedState;
use wick_core::{Result, Sharding, StepReport};

/// How a replicated strategy reduces gradients and steps. It holds options only.
pub(crate) trait GradReduce: Clone + Send + Sync + 'static {
    /// Refuses world sizes the strategy cannot run on.
    fn check_world_size(&self, _name: &str, _world_size: usize) -> Result<()> {
        Ok(())
    }

    /// One optimizer step: reduce the accumulated gradients, clip, step, and leave every
    /// rank with the same updated parameters.
    fn step(&self, state: &mut ReplicatedState) -> Result<StepReport>;

    /// What the strategy shards.
    fn sharding(&self) -> Sharding;

    /// How the last backward before a step reduces the gradients while it runs; `None`
    /// where the step reduces otherwise.
    fn overlapped(&self, _state: &ReplicatedState) -> Option<BucketPlan> {
        None
    }
}
