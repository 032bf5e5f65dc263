//! [`Replicated`]: the strategies whose ranks all hold every parameter (single, ddp, zero1,
//! zero2), one type generic over how a step turns each rank's gradients into the update.
//!
//! What they share (creating parameters, backward, clipping, the optimizer, checkpoints) is
//! written once, here and in `ReplicatedRank`; a [`GradReduce`] says only what differs:
//! the world sizes it accepts, what it shards and the step itself.

use crate::replicated::grad_reduce::GradReduce;
use crate::replicated::replicated_rank::ReplicatedRank;
use crate::replicated::replicated_state::{ReplicatedParams, ReplicatedState};
use candle_core::Device;
use std::sync::Arc;
use wick_core::{
    ActivationCheckpointing, Collective, OpenSharding, RankStrategy, Result, ShardedContext,
    Sharding, Strategy,
};

/// A strategy whose ranks all hold every parameter, reducing gradients with `R`. Used
/// through its aliases: [`SingleDevice`](crate::SingleDevice), [`Ddp`](crate::Ddp) and
/// [`Zero`](crate::Zero).
pub struct Replicated<R> {
    name: &'static str,
    reduce: R,
    activation_checkpointing: ActivationCheckpointing,
}

impl<R> Replicated<R> {
    /// A strategy called `name` that reduces with `reduce`.
    pub(crate) fn with_reduce(name: &'static str, reduce: R) -> Self {
        Replicated {
            name,
            reduce,
            activation_checkpointing: ActivationCheckpointing::None,
        }
    }

    /// Recompute the wrapped units `ac` picks in backward instead of keeping their
    /// activations (activation checkpointing).
    pub fn with_activation_checkpointing(mut self, ac: ActivationCheckpointing) -> Self {
        self.activation_checkpointing = ac;
        self
    }

    /// The same strategy under another registry name (FSDP's `no_shard` is ddp).
    pub(crate) fn named(mut self, name: &'static str) -> Self {
        self.name = name;
        self
    }

    pub(crate) fn reduce_mut(&mut self) -> &mut R {
        &mut self.reduce
    }
}

impl<R: GradReduce> Strategy for Replicated<R> {
    fn name(&self) -> &str {
        self.name
    }

    fn sharding(&self) -> Sharding {
        self.reduce.sharding()
    }

    fn check_world_size(&self, world_size: usize) -> Result<()> {
        self.reduce.check_world_size(self.name, world_size)
    }

    fn open(&self, world: Arc<dyn Collective>, device: Device, seed: u64) -> Result<OpenSharding> {
        let source = Arc::new(ReplicatedParams::new(seed, self.activation_checkpointing));
        let context = ShardedContext::new(source.clone(), world.clone(), device.clone(), self.name);
        let (name, reduce) = (self.name, self.reduce.clone());
        let close = move || {
            let state = ReplicatedState::new(name, &source, world, device)?;
            let rank: Box<dyn RankStrategy> = Box::new(ReplicatedRank::new(name, reduce, state));
            Ok(rank)
        };
        Ok(OpenSharding::new(context, Box::new(close)))
    }
}
