//! `Fsdp`: fully sharded data parallel, with its sharding strategies.
//!
//! `full_shard` runs each wrapped unit through the unit op (gather, run keeping the
//! activations, free the parameters; gather again in backward, or recompute the unit where
//! activation checkpointing asks), the same as ZeRO-3; `shard_grad_op` gathers each unit
//! once per step and keeps it until backward (sharded parameters between steps, ZeRO-2's
//! memory within one); `no_shard` is DDP; `hybrid_shard` is `full_shard`
//! inside groups of G ranks, replicated across the groups.

use crate::sharded::sharded_options::{sharded_builder_methods, ShardedOptions};
use crate::{Ddp, Precision, Sharded};
use wick_core::{Error, Result, Strategy};

/// How [`Fsdp`] shards (PyTorch FSDP's `ShardingStrategy`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
#[cfg_attr(
    feature = "clap",
    derive(clap::ValueEnum),
    value(rename_all = "snake_case")
)]
#[cfg_attr(
    feature = "serde",
    derive(serde::Serialize, serde::Deserialize),
    serde(rename_all = "snake_case")
)]
pub enum FsdpSharding {
    /// Everything sharded; a unit's parameters gathered for each use and freed after it.
    #[default]
    FullShard,
    /// Everything sharded; a unit's gathered parameters kept from forward to backward.
    ShardGradOp,
    /// Nothing sharded (DDP).
    NoShard,
    /// `full_shard` inside groups of ranks ([`Fsdp::with_group_size`], 2 by default),
    /// replicated across the groups.
    HybridShard,
}

impl FsdpSharding {
    /// Every sharding, in the order the help lists them.
    pub const ALL: [FsdpSharding; 4] = [
        FsdpSharding::FullShard,
        FsdpSharding::ShardGradOp,
        FsdpSharding::NoShard,
        FsdpSharding::HybridShard,
    ];

    /// The name users type: `full_shard`, `shard_grad_op`, `no_shard`, `hybrid_shard`.
    pub fn name(self) -> &'static str {
        match self {
            FsdpSharding::FullShard => "full_shard",
            FsdpSharding::ShardGradOp => "shard_grad_op",
            FsdpSharding::NoShard => "no_shard",
            FsdpSharding::HybridShard => "hybrid_shard",
        }
    }
}

/// Fully sharded data parallel: its options, which the setters check as they are said (so
/// whatever an `Fsdp` holds builds), and the strategy they pick ([`Fsdp::build`]). The
/// sharded modes are [`Sharded`] with FSDP's options, and `no_shard` is
/// [`Ddp`](crate::Ddp); all register as `fsdp`. It is also what a
/// [`StrategySpec`](crate::StrategySpec) of fsdp carries.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Fsdp {
    sharding: FsdpSharding,
    options: ShardedOptions,
}

impl Fsdp {
    /// The registry name.
    pub const NAME: &'static str = "fsdp";

    /// FSDP with `sharding`, in f32, every wrapped block a unit.
    pub fn new(sharding: FsdpSharding) -> Self {
        let group_size = (sharding == FsdpSharding::HybridShard).then_some(2);
        Fsdp {
            sharding,
            options: ShardedOptions {
                reshard_after_forward: sharding != FsdpSharding::ShardGradOp,
                group_size,
                ..ShardedOptions::new(Self::NAME)
            },
        }
    }

    /// Units computed and gradients reduced in `precision` (f32 by default). `no_shard`
    /// is DDP and has no gathered compute copies, so it takes no mixed precision.
    pub fn with_precision(mut self, precision: Precision) -> Result<Self> {
        if precision.is_mixed() && self.sharding == FsdpSharding::NoShard {
            return Err(Error::config(
                "precision",
                "mixed precision needs a sharded fsdp sharding, not no_shard",
            ));
        }
        self.options.precision = precision;
        Ok(self)
    }

    /// Ranks per sharding group of `hybrid_shard` (2 by default): `full_shard` inside each
    /// group, replicated across the groups. Only `hybrid_shard` has groups.
    pub fn with_group_size(mut self, group_size: usize) -> Result<Self> {
        if self.sharding != FsdpSharding::HybridShard {
            return Err(Error::config(
                "group-size",
                format!("only hybrid_shard has groups, not {}", self.sharding),
            ));
        }
        if group_size == 0 {
            return Err(Error::config(
                "group-size",
                "must be a positive integer, got 0",
            ));
        }
        self.options.group_size = Some(group_size);
        Ok(self)
    }

    sharded_builder_methods!();

    /// The sharding strategy.
    pub fn sharding_strategy(&self) -> FsdpSharding {
        self.sharding
    }

    /// The strategy: `no_shard` is ddp, every other sharding is [`Sharded`] with these options.
    pub fn build(self) -> Box<dyn Strategy> {
        match self.sharding {
            FsdpSharding::NoShard => Box::new(
                Ddp::new()
                    .named(Self::NAME)
                    .with_activation_checkpointing(self.options.activation_checkpointing),
            ),
            _ => Box::new(Sharded::with_options(self.options)),
        }
    }
}
