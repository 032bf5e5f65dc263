//! `SingleDevice`: one rank, no communication. The reference every other strategy must match.

use crate::replicated::replicated_state::ReplicatedState;
use crate::replicated::replicated_strategy::{GradReduce, Replicated};
use wick_core::{Error, Result, Sharding};

/// Trains on one device.
pub type SingleDevice = Replicated<NoReduce>;

/// The gradients of the one rank are the update's ([`SingleDevice`]).
#[derive(Debug, Clone, Copy, Default)]
pub struct NoReduce;

impl SingleDevice {
    /// The registry name.
    pub const NAME: &'static str = "single";

    /// A new, unconfigured instance.
    pub fn new() -> Self {
        Replicated::with_reduce(Self::NAME, NoReduce)
    }
}

impl Default for SingleDevice {
    fn default() -> Self {
        Self::new()
    }
}

impl GradReduce for NoReduce {
    fn check_world_size(&self, name: &str, world_size: usize) -> Result<()> {
        if world_size != 1 {
            return Err(Error::config(
                "devices",
                format!(
                    "strategy {name} runs on exactly 1 device, got {world_size}; use ddp for more"
                ),
            ));
        }
        Ok(())
    }

    fn step(&self, name: &str, state: &mut ReplicatedState) -> Result<()> {
        let grads = state.take_grads()?;
        state.apply(name, grads)
    }

    fn sharding(&self) -> Sharding {
        Sharding::default()
    }
}
