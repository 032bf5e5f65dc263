//! `Fsdp`: fully sharded data parallel, with its sharding strategies.
//!
//! `full_shard` runs each wrapped unit through the unit op (gather, run, free; gather again
//! and recompute in backward); `shard_grad_op` gathers each unit once per step and keeps it
//! until backward (the same as ZeRO-3); `no_shard` is DDP; `hybrid_shard` is `full_shard`
//! inside groups of G ranks, replicated across the groups.

use crate::{Ddp, MixedPrecision, Zero3};
use candle_core::{Device, Shape, Tensor};
use std::sync::Arc;
use wick_core::{
    Collective, Error, OptimizerConfig, Result, ShardedContext, Sharding, StateBytes, Strategy,
};

/// How FSDP shards.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FsdpSharding {
    /// Parameters, gradients and optimizer state sharded; units gathered per use and freed.
    FullShard,
    /// Sharded; a unit's gathered parameters are kept from forward to backward.
    ShardGradOp,
    /// Nothing sharded (DDP).
    NoShard,
    /// `FullShard` within groups of `group_size` ranks, replicated across groups.
    HybridShard {
        /// Ranks per sharding group.
        group_size: usize,
    },
}

impl FsdpSharding {
    /// The names [`FsdpSharding::from_name`] accepts.
    pub const NAMES: &'static [&'static str] =
        &["full_shard", "shard_grad_op", "no_shard", "hybrid_shard"];

    /// The sharding called `name`; `group_size` is used by `hybrid_shard`.
    pub fn from_name(name: &str, group_size: usize) -> Result<Self> {
        Ok(match name {
            "full_shard" => FsdpSharding::FullShard,
            "shard_grad_op" => FsdpSharding::ShardGradOp,
            "no_shard" => FsdpSharding::NoShard,
            "hybrid_shard" => FsdpSharding::HybridShard { group_size },
            other => {
                return Err(Error::config(
                    "sharding",
                    format!(
                        "unknown sharding '{other}'; valid: {}",
                        Self::NAMES.join(", ")
                    ),
                ))
            }
        })
    }
}

/// Fully sharded data parallel.
pub struct Fsdp {
    sharding: FsdpSharding,
    precision: Option<MixedPrecision>,
    auto_wrap: Option<Vec<String>>,
    prefetch: bool,
    inner: Box<dyn Strategy>,
}

impl Fsdp {
    /// The registry name.
    pub const NAME: &'static str = "fsdp";

    /// FSDP with `sharding`, in f32, every wrapped block a unit.
    pub fn new(sharding: FsdpSharding) -> Self {
        Self::build(sharding, None, None, false)
    }

    /// Mixed `precision` (`None`: f32). `no_shard` is DDP and has no gathered compute
    /// copies, so it takes no mixed precision.
    pub fn with_precision(self, precision: Option<MixedPrecision>) -> Result<Self> {
        if precision.is_some() && self.sharding == FsdpSharding::NoShard {
            return Err(Error::config(
                "precision",
                "mixed precision needs a sharded fsdp sharding, not no_shard",
            ));
        }
        Ok(Self::build(
            self.sharding,
            precision,
            self.auto_wrap,
            self.prefetch,
        ))
    }

    /// Auto-wrap policy for the sharded modes: only blocks whose names start with one of
    /// `prefixes` become units of their own; the rest share one root unit (see
    /// [`Zero3::with_auto_wrap`]). `no_shard` has no units and ignores it.
    pub fn with_auto_wrap(self, prefixes: Vec<String>) -> Self {
        Self::build(self.sharding, self.precision, Some(prefixes), self.prefetch)
    }

    /// Under `full_shard` and `hybrid_shard`, gather the next unit on a background thread
    /// while the current one computes.
    pub fn with_prefetch(self, prefetch: bool) -> Self {
        Self::build(self.sharding, self.precision, self.auto_wrap, prefetch)
    }

    fn build(
        sharding: FsdpSharding,
        precision: Option<MixedPrecision>,
        auto_wrap: Option<Vec<String>>,
        prefetch: bool,
    ) -> Self {
        let sharded = |per_use| {
            let inner = Zero3::sharded(Self::NAME, per_use)
                .with_precision(precision)
                .with_prefetch(prefetch);
            match &auto_wrap {
                Some(prefixes) => inner.with_auto_wrap(prefixes.clone()),
                None => inner,
            }
        };
        let inner: Box<dyn Strategy> = match sharding {
            FsdpSharding::FullShard => Box::new(sharded(true)),
            FsdpSharding::ShardGradOp => Box::new(sharded(false)),
            FsdpSharding::NoShard => Box::new(Ddp::new()),
            FsdpSharding::HybridShard { group_size } => {
                Box::new(sharded(true).with_groups(group_size))
            }
        };
        Fsdp {
            sharding,
            precision,
            auto_wrap,
            prefetch,
            inner,
        }
    }

    /// The sharding strategy.
    pub fn sharding_strategy(&self) -> FsdpSharding {
        self.sharding
    }
}

impl Strategy for Fsdp {
    fn name(&self) -> &str {
        Self::NAME
    }
    fn for_new_rank(&self) -> Box<dyn Strategy> {
        Box::new(Fsdp::build(
            self.sharding,
            self.precision,
            self.auto_wrap.clone(),
            self.prefetch,
        ))
    }
    fn check_world_size(&self, world_size: usize) -> Result<()> {
        if let FsdpSharding::HybridShard { group_size } = self.sharding {
            if group_size == 0 || world_size % group_size != 0 {
                return Err(Error::config(
                    "group size",
                    format!("hybrid_shard needs the {world_size} ranks to split into groups of {group_size}"),
                ));
            }
        }
        self.inner.check_world_size(world_size)
    }
    fn connect(&mut self, world: Arc<dyn Collective>, device: Device) -> Result<()> {
        self.inner.connect(world, device)
    }
    fn sharded_context(&mut self, seed: u64) -> Result<ShardedContext> {
        self.inner.sharded_context(seed)
    }
    fn finish_sharding(&mut self) -> Result<()> {
        self.inner.finish_sharding()
    }
    fn is_configured(&self) -> bool {
        self.inner.is_configured()
    }
    fn configure_optimizer(&mut self, config: &OptimizerConfig) -> Result<()> {
        self.inner.configure_optimizer(config)
    }
    fn set_clip_grad_norm(&mut self, max_norm: Option<f64>) {
        self.inner.set_clip_grad_norm(max_norm)
    }
    fn set_grad_sync(&mut self, sync: bool) {
        self.inner.set_grad_sync(sync)
    }
    fn backward(&mut self, loss: &Tensor) -> Result<()> {
        self.inner.backward(loss)
    }
    fn find_unused_parameters(&mut self) {
        self.inner.find_unused_parameters()
    }
    fn unused_parameters(&self) -> Vec<String> {
        self.inner.unused_parameters()
    }
    fn optimizer_step(&mut self) -> Result<()> {
        self.inner.optimizer_step()
    }
    fn full_parameters(&self) -> Result<Vec<(String, Tensor)>> {
        self.inner.full_parameters()
    }
    fn num_parameters(&self) -> usize {
        self.inner.num_parameters()
    }
    fn state_bytes(&self) -> StateBytes {
        self.inner.state_bytes()
    }
    fn sharding(&self) -> Sharding {
        self.inner.sharding()
    }
    fn parameter_shapes(&self) -> Vec<(String, Shape)> {
        self.inner.parameter_shapes()
    }
    fn save_state(&self) -> Result<wick_core::RankState> {
        self.inner.save_state()
    }
    fn load_state(&mut self, reader: &dyn wick_core::StateReader) -> Result<()> {
        self.inner.load_state(reader)
    }
}
