//! [`Sharded`]: parameters, gradients and optimizer state all sharded; ZeRO stage 3 under
//! its defaults ([`Zero3`]), and the sharded modes of FSDP under FSDP's options.
//!
//! Parameters are born sharded inside wrapped units ([`crate::sharded::sharded_params`]). As
//! DeepSpeed's stage 3 does, each unit is gathered just before its forward and released
//! after it, gathered again just before its backward and released after that, with an
//! optional prefetch of the next unit under a bound on the parameters alive at once
//! ([`Zero3::with_prefetch`], [`Zero3::with_max_live_parameters`]); the unit's backward
//! reduce-scatters its gradient straight into the shard's. This is FSDP's `full_shard`
//! (the unit op, [`crate::units::unit_op`]): the two differ only in name. FSDP's
//! `shard_grad_op` is this type too, gathering each unit once per step and keeping it
//! from forward to backward. A rank's part, once its shards exist, is `ShardedRank`.

use crate::sharded::sharded_options::{sharded_builder_methods, ShardedOptions};
use crate::sharded::sharded_params::ShardedParams;
use crate::sharded::sharded_rank::ShardedRank;
use crate::sharded::sharding_groups::ShardingGroups;
use candle_core::Device;
use std::sync::Arc;
use wick_core::{
    Collective, Error, OpenSharding, RankStrategy, Result, ShardedContext, Sharding, Strategy,
};

impl Default for ShardedOptions {
    fn default() -> Self {
        ShardedOptions::new(Sharded::NAME)
    }
}

/// The strategy whose parameters are born sharded: ZeRO stage 3 ([`Zero3`]), and the
/// sharded modes of FSDP (built by [`Fsdp`](crate::Fsdp), which differ only in their
/// options: how units run, groups, precision).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Sharded {
    options: ShardedOptions,
}

/// ZeRO stage 3: [`Sharded`] with its defaults, under DeepSpeed's name.
pub type Zero3 = Sharded;

impl Sharded {
    /// The registry name of its defaults, `zero3` (FSDP's sharded modes register as
    /// `fsdp`).
    pub const NAME: &'static str = "zero3";

    /// ZeRO stage 3 with its defaults.
    pub fn new() -> Self {
        Self::default()
    }

    /// The strategy with `options`.
    pub(crate) fn with_options(options: ShardedOptions) -> Self {
        Sharded { options }
    }

    sharded_builder_methods!();
}

impl Strategy for Sharded {
    fn name(&self) -> &str {
        self.options.name
    }

    fn sharding(&self) -> Sharding {
        Sharding {
            params: true,
            grads: true,
            optimizer: true,
        }
    }

    fn check_world_size(&self, world_size: usize) -> Result<()> {
        match self.options.group_size {
            Some(g) if g == 0 || !world_size.is_multiple_of(g) => Err(Error::config(
                "group size",
                format!("hybrid_shard needs the {world_size} ranks to split into groups of {g}"),
            )),
            _ => Ok(()),
        }
    }

    fn open(&self, world: Arc<dyn Collective>, device: Device, seed: u64) -> Result<OpenSharding> {
        let groups = ShardingGroups::split(world, self.options.group_size)?;
        let world = groups.shard.clone();
        let options = self.options.clone();
        let source = Arc::new(ShardedParams::new(
            seed,
            world.clone(),
            device.clone(),
            &options,
        ));
        let context = ShardedContext::new(source.clone(), world, device, self.name());
        let close = move || {
            source.shard_open_units()?;
            let rank = ShardedRank::new(options, source, groups)?;
            Ok(Box::new(rank) as Box<dyn RankStrategy>)
        };
        Ok(OpenSharding::new(context, Box::new(close)))
    }
}
