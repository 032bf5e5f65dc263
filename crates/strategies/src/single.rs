//! `SingleDevice`: one rank, no communication. The reference every other strategy must match.

use crate::replicated::Replicated;
use candle_core::{Device, Tensor};
use std::sync::Arc;
use wick_core::{
    Collective, Error, OptimizerConfig, Result, ShardedContext, Sharding, StateBytes, Strategy,
};

/// Trains on one device.
#[derive(Default)]
pub struct SingleDevice {
    state: Replicated,
}

impl SingleDevice {
    /// The registry name.
    pub const NAME: &'static str = "single";

    /// A new, unconfigured instance.
    pub fn new() -> Self {
        Self::default()
    }
}

impl Strategy for SingleDevice {
    fn name(&self) -> &str {
        Self::NAME
    }

    fn for_new_rank(&self) -> Box<dyn Strategy> {
        Box::new(SingleDevice::new())
    }

    fn check_world_size(&self, world_size: usize) -> Result<()> {
        if world_size != 1 {
            return Err(Error::config(
                "devices",
                format!(
                    "strategy single runs on exactly 1 device, got {world_size}; use ddp for more"
                ),
            ));
        }
        Ok(())
    }

    fn connect(&mut self, world: Arc<dyn Collective>, device: Device) -> Result<()> {
        self.state.connect(world, device);
        Ok(())
    }

    fn sharded_context(&mut self, seed: u64) -> Result<ShardedContext> {
        self.state.sharded_context(Self::NAME, seed)
    }

    fn finish_sharding(&mut self) -> Result<()> {
        self.state.finish_sharding(Self::NAME)
    }

    fn is_configured(&self) -> bool {
        self.state.is_configured()
    }

    fn configure_optimizer(&mut self, config: &OptimizerConfig) -> Result<()> {
        self.state.configure_optimizer(config)
    }

    fn set_clip_grad_norm(&mut self, max_norm: Option<f64>) {
        self.state.clip = max_norm;
    }

    fn backward(&mut self, loss: &Tensor) -> Result<()> {
        self.state.backward(loss)
    }

    fn optimizer_step(&mut self) -> Result<()> {
        let grads = self.state.take_grads()?;
        self.state.apply(Self::NAME, grads)
    }

    fn full_parameters(&self) -> Result<Vec<(String, Tensor)>> {
        self.state.full_parameters()
    }

    fn num_parameters(&self) -> usize {
        self.state.num_parameters()
    }

    fn state_bytes(&self) -> StateBytes {
        self.state.state_bytes()
    }

    fn sharding(&self) -> Sharding {
        Sharding::default()
    }

    fn parameter_shapes(&self) -> Vec<(String, candle_core::Shape)> {
        self.state.parameter_shapes()
    }
}
