//! [`Replicated`]: the strategies whose ranks all hold every parameter (single, ddp, zero1,
//! zero2), one type generic over how a step turns each rank's gradients into the update.
//!
//! What they share (creating parameters, backward, clipping, the optimizer, checkpoints) is
//! written here once; a [`GradReduce`] says only what differs: the world sizes it accepts,
//! what it shards and the step itself.

use crate::replicated::bucket_reduce::BucketPlan;
use crate::replicated::replicated_state::ReplicatedState;
use candle_core::{Device, Shape, Tensor};
use std::sync::Arc;
use wick_core::{
    ActivationCheckpointing, BackwardReport, Collective, GradSync, OptimizerConfig, RankState,
    Result, ShardedContext, Sharding, StateBytes, StateReader, StepOptions, StepReport, Strategy,
    StrategySetup, StrategyState, StrategyStep,
};

/// How a replicated strategy reduces gradients and steps. It holds options only, so a clone
/// is a fresh strategy for a new rank.
pub(crate) trait GradReduce: Clone + Send + 'static {
    /// Refuses world sizes the strategy cannot run on.
    fn check_world_size(&self, _name: &str, _world_size: usize) -> Result<()> {
        Ok(())
    }

    /// One optimizer step: reduce the accumulated gradients, clip, step, and leave every
    /// rank with the same updated parameters.
    fn step(&self, name: &str, state: &mut ReplicatedState) -> Result<()>;

    /// What the strategy shards.
    fn sharding(&self) -> Sharding;

    /// How the last backward before a step reduces the gradients while it runs; `None`
    /// where the step reduces otherwise.
    fn overlapped(&self, _name: &str, _state: &ReplicatedState) -> Result<Option<BucketPlan>> {
        Ok(None)
    }
}

/// A strategy whose ranks all hold every parameter, reducing gradients with `R`. Used
/// through its aliases: [`SingleDevice`](crate::SingleDevice), [`Ddp`](crate::Ddp) and
/// [`Zero`](crate::Zero).
pub struct Replicated<R> {
    name: &'static str,
    reduce: R,
    activation_checkpointing: ActivationCheckpointing,
    state: ReplicatedState,
}

impl<R> Replicated<R> {
    /// An unconfigured strategy called `name` that reduces with `reduce`.
    pub(crate) fn with_reduce(name: &'static str, reduce: R) -> Self {
        Replicated {
            name,
            reduce,
            activation_checkpointing: ActivationCheckpointing::None,
            state: ReplicatedState::default(),
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

    pub(crate) fn reduce(&self) -> &R {
        &self.reduce
    }

    pub(crate) fn reduce_mut(&mut self) -> &mut R {
        &mut self.reduce
    }

    pub(crate) fn state(&self) -> &ReplicatedState {
        &self.state
    }
}

impl<R: GradReduce> StrategySetup for Replicated<R> {
    fn name(&self) -> &str {
        self.name
    }

    fn for_new_rank(&self) -> Box<dyn Strategy> {
        let fresh = Replicated::with_reduce(self.name, self.reduce.clone())
            .with_activation_checkpointing(self.activation_checkpointing);
        Box::new(fresh)
    }

    fn check_world_size(&self, world_size: usize) -> Result<()> {
        self.reduce.check_world_size(self.name, world_size)
    }

    fn connect(&mut self, world: Arc<dyn Collective>, device: Device) -> Result<()> {
        self.state.connect(world, device);
        Ok(())
    }

    fn sharded_context(&mut self, seed: u64) -> Result<ShardedContext> {
        self.state
            .sharded_context(self.name, seed, self.activation_checkpointing)
    }

    fn finish_sharding(&mut self) -> Result<()> {
        self.state.finish_sharding(self.name)
    }

    fn is_configured(&self) -> bool {
        self.state.is_configured()
    }

    fn configure_optimizer(
        &mut self,
        config: &OptimizerConfig,
        options: StepOptions,
    ) -> Result<()> {
        self.state.configure_optimizer(config, options)
    }
}

impl<R: GradReduce> StrategyStep for Replicated<R> {
    fn backward(&mut self, loss: &Tensor, sync: GradSync) -> Result<BackwardReport> {
        let plan = match sync {
            GradSync::Reduce => self.reduce.overlapped(self.name, &self.state)?,
            _ => None,
        };
        self.state.backward(self.name, loss, plan)
    }

    fn optimizer_step(&mut self, lr: f64) -> Result<StepReport> {
        self.state.optimizer(self.name)?.set_lr(lr);
        self.reduce.step(self.name, &mut self.state)?;
        Ok(StepReport {
            skipped: self.state.skipped,
            grad_norm: self.state.grad_norm,
            loss_scale: None,
        })
    }
}

impl<R: GradReduce> StrategyState for Replicated<R> {
    fn full_parameters(&self) -> Result<Vec<(String, Tensor)>> {
        self.state.full_parameters()
    }

    fn num_parameters(&self) -> usize {
        self.state.num_parameters()
    }

    fn num_frozen_parameters(&self) -> usize {
        self.state.num_frozen_parameters()
    }

    fn state_bytes(&self) -> StateBytes {
        self.state.state_bytes()
    }

    fn sharding(&self) -> Sharding {
        self.reduce.sharding()
    }

    fn parameter_shapes(&self) -> Vec<(String, Shape)> {
        self.state.parameter_shapes()
    }

    fn save_state(&self) -> Result<RankState> {
        self.state.save_state(self.name, self.sharding().optimizer)
    }

    fn load_state(&mut self, reader: &dyn StateReader) -> Result<()> {
        let flat_optimizer = self.sharding().optimizer;
        self.state.load_state(self.name, reader, flat_optimizer)
    }
}
