//! `SingleDevice`: one rank, no communication. The reference every other strategy must match.

use crate::replicated::Replicated;
use wick_core::{Error, Result, ShardedContext, Sharding, Strategy};

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
    crate::replicated::replicated_state_methods!();

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

    fn sharded_context(&mut self, seed: u64) -> Result<ShardedContext> {
        self.state.sharded_context(Self::NAME, seed)
    }

    fn finish_sharding(&mut self) -> Result<()> {
        self.state.finish_sharding(Self::NAME)
    }

    fn optimizer_step(&mut self) -> Result<()> {
        let grads = self.state.take_grads()?;
        self.state.apply(Self::NAME, grads)
    }

    fn save_state(&self) -> Result<wick_core::RankState> {
        self.state.save_replicated(Self::NAME)
    }

    fn load_state(&mut self, reader: &dyn wick_core::StateReader) -> Result<()> {
        self.state.load_replicated(Self::NAME, reader)
    }

    fn sharding(&self) -> Sharding {
        Sharding::default()
    }
}
