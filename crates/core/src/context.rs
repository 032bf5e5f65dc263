//! The sharding context: the only place a module's parameters are created.
//!
//! A strategy opens it with a [`ParamSource`] that decides what a parameter request makes
//! (a full replica, or only this rank's shard). The accelerator enters it around
//! `configure_sharded_model` and leaves it after; a request made outside is an error, so a
//! parameter can never be created by a path the strategy does not see.

use crate::Collective;
use candle_core::{DType, Device, Shape, Tensor};
use candle_nn::var_builder::SimpleBackend;
use candle_nn::{Init, VarBuilder};
use std::cell::Cell;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

thread_local! {
    static ACTIVE: Cell<bool> = const { Cell::new(false) };
}

/// Whether this thread is inside a strategy's sharding context right now.
pub fn sharding_context_active() -> bool {
    ACTIVE.with(Cell::get)
}

/// What a strategy does with a parameter request made inside its context.
pub trait ParamSource: Send + Sync {
    /// Creates the parameter `name` (or returns it, when asked again with the same shape).
    /// Under a sharding strategy the tensor returned is this rank's view of the parameter
    /// and the bytes behind it are only this rank's shard.
    fn get_or_create(
        &self,
        name: &str,
        shape: &Shape,
        init: &Init,
        dtype: DType,
        device: &Device,
    ) -> candle_core::Result<Tensor>;

    /// Whether `name` was created already.
    fn contains(&self, name: &str) -> bool;
}

/// Handed to `configure_sharded_model`: a candle-nn [`VarBuilder`] whose parameters the
/// strategy creates, plus the world the rank is part of.
#[derive(Clone)]
pub struct ShardedContext {
    source: Arc<dyn ParamSource>,
    open: Arc<AtomicBool>,
    world: Arc<dyn Collective>,
    device: Device,
    strategy: String,
}

impl ShardedContext {
    /// A closed context over `source`; [`ShardedContext::enter`] opens it.
    pub fn new(
        source: Arc<dyn ParamSource>,
        world: Arc<dyn Collective>,
        device: Device,
        strategy: impl Into<String>,
    ) -> Self {
        ShardedContext {
            source,
            open: Arc::new(AtomicBool::new(false)),
            world,
            device,
            strategy: strategy.into(),
        }
    }

    /// A candle-nn `VarBuilder` (f32) whose parameter requests go to the strategy.
    pub fn var_builder(&self) -> VarBuilder<'static> {
        let backend = GuardedSource {
            source: self.source.clone(),
            open: self.open.clone(),
            strategy: self.strategy.clone(),
        };
        VarBuilder::from_backend(Box::new(backend), DType::F32, self.device.clone())
    }

    /// This rank's index.
    pub fn rank(&self) -> usize {
        self.world.rank()
    }

    /// The number of ranks.
    pub fn world_size(&self) -> usize {
        self.world.world_size()
    }

    /// The world, usable inside the hook (it is up before the hook runs).
    pub fn world(&self) -> &Arc<dyn Collective> {
        &self.world
    }

    /// This rank's device.
    pub fn device(&self) -> &Device {
        &self.device
    }

    /// The name of the strategy that opened the context.
    pub fn strategy(&self) -> &str {
        &self.strategy
    }

    /// Whether parameters can be created through this context now.
    pub fn is_open(&self) -> bool {
        self.open.load(Ordering::SeqCst)
    }

    /// Opens the context on this thread until the guard drops.
    pub fn enter(&self) -> ContextGuard {
        self.open.store(true, Ordering::SeqCst);
        ACTIVE.with(|a| a.set(true));
        ContextGuard {
            open: self.open.clone(),
        }
    }
}

/// Keeps a [`ShardedContext`] open; dropping it closes the context.
pub struct ContextGuard {
    open: Arc<AtomicBool>,
}

impl Drop for ContextGuard {
    fn drop(&mut self) {
        self.open.store(false, Ordering::SeqCst);
        ACTIVE.with(|a| a.set(false));
    }
}

struct GuardedSource {
    source: Arc<dyn ParamSource>,
    open: Arc<AtomicBool>,
    strategy: String,
}

impl SimpleBackend for GuardedSource {
    fn get(
        &self,
        shape: Shape,
        name: &str,
        init: Init,
        dtype: DType,
        dev: &Device,
    ) -> candle_core::Result<Tensor> {
        if !self.open.load(Ordering::SeqCst) {
            candle_core::bail!(
                "parameter '{name}' requested outside configure_sharded_model; \
                 the {} strategy creates parameters only inside its sharding context",
                self.strategy
            )
        }
        self.source.get_or_create(name, &shape, &init, dtype, dev)
    }

    fn get_unchecked(&self, name: &str, _: DType, _: &Device) -> candle_core::Result<Tensor> {
        candle_core::bail!("parameter '{name}' requested without a shape; wick needs a shape to create or shard it")
    }

    fn contains_tensor(&self, name: &str) -> bool {
        self.source.contains(name)
    }
}
