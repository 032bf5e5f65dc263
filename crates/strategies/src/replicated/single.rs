//! `SingleDevice`: one rank, no communication. The reference every other strategy must match.

use crate::replicated::grad_reduce::GradReduce;
use crate::replicated::replicated_state::ReplicatedState;
use crate::replicated::replicated_strategy::Replicated;
use wick_core::{Error, Result, Sharding, StepReport};

/// Trains on one device.
pub type SingleDevice = Replicated<NoReduce>;

/// The gradients of the one rank are the update's ([`SingleDevice`]).
#[derive(Debug, Clone, Copy, Default)]
pub struct NoReduce;

impl SingleDevice {
    /// The registry name.
    pub const NAME: &'static str = "single";

    /// The single-device strategy.
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

    fn step(&self, state: &mut ReplicatedState) -> Result<StepReport> {
        let grads = state.take_grads()?;
        state.apply(grads)
    }

    fn sharding(&self) -> Sharding {
        Sharding::default()
    }
}
