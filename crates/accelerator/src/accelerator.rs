//! `Accelerator`: which device each rank gets, how ranks are launched, and the sharded setup
//! of a module.

use crate::thread_world::{RankError, ThreadWorld};
use candle_core::Device;
use std::sync::Arc;
use wick_core::{Collective, Error, Result, Strategy, TrainModule};

/// What a rank has once its environment is set up: its place in the world and its device.
#[derive(Clone)]
pub struct RankEnv {
    /// This rank.
    pub rank: usize,
    /// The number of ranks.
    pub world_size: usize,
    /// The world's collectives, up and usable.
    pub world: Arc<dyn Collective>,
    /// This rank's device.
    pub device: Device,
}

/// Devices and the world they form. Today: CPU ranks as threads of this process.
#[derive(Debug, Clone)]
pub struct Accelerator {
    devices: usize,
    timeout: Option<std::time::Duration>,
}

impl Accelerator {
    /// `devices` CPU ranks, run as threads of this process.
    pub fn cpu(devices: usize) -> Result<Self> {
        if devices == 0 {
            return Err(Error::config("devices", "must be at least 1, got 0"));
        }
        Ok(Accelerator {
            devices,
            timeout: None,
        })
    }

    /// Fails a collective that waits longer than `timeout` for the other ranks.
    pub fn with_collective_timeout(mut self, timeout: std::time::Duration) -> Self {
        self.timeout = Some(timeout);
        self
    }

    /// The number of ranks.
    pub fn world_size(&self) -> usize {
        self.devices
    }

    /// Launches one rank per device, sets up each one's environment (device, world) and runs
    /// `f` there. Outcomes come back in rank order; a rank that errors or panics makes every
    /// other rank's pending and later collectives fail with an error naming it.
    pub fn launch<T, E, F>(&self, f: F) -> Vec<std::result::Result<T, RankError<E>>>
    where
        T: Send,
        E: std::fmt::Display + Send,
        F: Fn(RankEnv) -> std::result::Result<T, E> + Sync,
    {
        let world = match self.timeout {
            Some(t) => ThreadWorld::with_timeout(self.devices, t),
            None => ThreadWorld::new(self.devices),
        };
        world.run(|comm| f(self.setup_environment(comm)))
    }

    fn setup_environment(&self, comm: crate::ThreadComm) -> RankEnv {
        RankEnv {
            rank: comm.rank(),
            world_size: comm.world_size(),
            world: Arc::new(comm),
            device: Device::Cpu,
        }
    }

    /// Runs the module's `configure_sharded_model` inside the strategy's sharding context,
    /// the first time only: returns `false` without calling the hook when the strategy
    /// already holds this module's parameters.
    pub fn setup<M: TrainModule + ?Sized>(
        strategy: &mut dyn Strategy,
        module: &mut M,
        seed: u64,
    ) -> Result<bool> {
        if strategy.is_configured() {
            return Ok(false);
        }
        let ctx = strategy.sharded_context(seed)?;
        {
            let _open = ctx.enter();
            module.configure_sharded_model(&ctx)?;
        }
        strategy.finish_sharding()?;
        Ok(true)
    }
}
