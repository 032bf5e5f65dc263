//! The typed strategy spec: which strategy, with the options of that strategy only. The
//! program's flags, its TOML config, `estimate`, the registry and the trainer all read this
//! one type, so a name is parsed once, where a user typed it.

use crate::{Ddp, Fsdp, FsdpSharding, Precision, SingleDevice, Zero, Zero3};
use std::fmt;
use std::str::FromStr;
use wick_core::{ActivationCheckpointing, Error, Result, Strategy};

/// A strategy of the registry.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "clap", derive(clap::ValueEnum))]
#[cfg_attr(
    feature = "serde",
    derive(serde::Serialize, serde::Deserialize),
    serde(rename_all = "lowercase")
)]
pub enum StrategyKind {
    /// One rank, nothing shared ([`SingleDevice`]).
    Single,
    /// Replicated state, gradients all-reduced in buckets ([`Ddp`]).
    Ddp,
    /// ZeRO stage 1: optimizer state sharded ([`Zero::stage1`]).
    Zero1,
    /// ZeRO stage 2: gradients and optimizer state sharded ([`Zero::stage2`]).
    Zero2,
    /// ZeRO stage 3: parameters too, gathered once per step ([`Zero3`]).
    Zero3,
    /// Fully sharded data parallel with a [`FsdpSharding`] ([`Fsdp`]).
    Fsdp,
}

impl StrategyKind {
    /// Every strategy, in the registry's order.
    pub const ALL: [StrategyKind; 6] = [
        StrategyKind::Single,
        StrategyKind::Ddp,
        StrategyKind::Zero1,
        StrategyKind::Zero2,
        StrategyKind::Zero3,
        StrategyKind::Fsdp,
    ];

    /// The name users type: `single`, `ddp`, `zero1`, `zero2`, `zero3`, `fsdp`.
    pub fn name(self) -> &'static str {
        match self {
            StrategyKind::Single => SingleDevice::NAME,
            StrategyKind::Ddp => Ddp::NAME,
            StrategyKind::Zero1 => "zero1",
            StrategyKind::Zero2 => "zero2",
            StrategyKind::Zero3 => Zero3::NAME,
            StrategyKind::Fsdp => Fsdp::NAME,
        }
    }
}

/// Names of `T` for an error: `a, b, c`.
fn listed<T: Copy>(all: &[T], name: impl Fn(T) -> &'static str) -> String {
    all.iter().map(|&v| name(v)).collect::<Vec<_>>().join(", ")
}

macro_rules! named {
    ($ty:ty, $option:literal, $what:literal) => {
        impl fmt::Display for $ty {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(self.name())
            }
        }

        impl FromStr for $ty {
            type Err = Error;

            fn from_str(s: &str) -> Result<Self> {
                <$ty>::ALL
                    .into_iter()
                    .find(|v| v.name() == s)
                    .ok_or_else(|| {
                        Error::config(
                            $option,
                            format!(
                                concat!("unknown ", $what, " '{}'; valid: {}"),
                                s,
                                listed(&<$ty>::ALL, <$ty>::name)
                            ),
                        )
                    })
            }
        }
    };
}

named!(StrategyKind, "strategy", "strategy");
named!(FsdpSharding, "sharding", "sharding");
named!(Precision, "precision", "precision");

/// A strategy with its own options: what `wick fit --strategy ... --sharding ...
/// --precision ...` and its TOML config say, as one value. The variant of
/// [`StrategyOptions`] carries its strategy's own options type ([`Zero3`], [`Fsdp`]), so
/// precision on ddp cannot be said; activation checkpointing, which every strategy takes, is
/// said once beside it. The options types refuse what does not go together where it is said
/// (mixed precision under `no_shard`: [`Fsdp::with_precision`]), so a spec always builds;
/// what is left to refuse is the world size ([`Strategy::check_world_size`]).
///
/// ```
/// use wick_strategies::{Fsdp, FsdpSharding, Precision, StrategySpec};
///
/// let fsdp = Fsdp::new(FsdpSharding::ShardGradOp).with_precision(Precision::Bf16Mixed)?;
/// assert_eq!(StrategySpec::from(fsdp).build().name(), "fsdp");
/// // Mixed precision needs fsdp's sharded modes: refused where it is said.
/// assert!(Fsdp::new(FsdpSharding::NoShard).with_precision(Precision::Bf16Mixed).is_err());
/// # Ok::<(), wick_core::Error>(())
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StrategySpec {
    /// Which strategy, with the options that are its own.
    pub strategy: StrategyOptions,
    /// Which wrapped units recompute their forward in backward (every strategy takes it).
    /// It is the spec's: [`StrategySpec::build`] gives it to the strategy, over what the
    /// variant's options carried.
    pub activation_checkpointing: ActivationCheckpointing,
}

/// A strategy of the registry with the options that are its own (burn's
/// `TrainingStrategy`): the variant of a [`StrategySpec`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StrategyOptions {
    /// [`SingleDevice`].
    Single,
    /// [`Ddp`].
    Ddp,
    /// [`Zero::stage1`].
    Zero1,
    /// [`Zero::stage2`].
    Zero2,
    /// [`Zero3`], with its options.
    Zero3(Zero3),
    /// [`Fsdp`], with its options.
    Fsdp(Fsdp),
}

impl StrategySpec {
    /// `strategy` with its default options, activations kept.
    pub fn new(strategy: StrategyKind) -> Self {
        let strategy = match strategy {
            StrategyKind::Single => StrategyOptions::Single,
            StrategyKind::Ddp => StrategyOptions::Ddp,
            StrategyKind::Zero1 => StrategyOptions::Zero1,
            StrategyKind::Zero2 => StrategyOptions::Zero2,
            StrategyKind::Zero3 => StrategyOptions::Zero3(Zero3::new()),
            StrategyKind::Fsdp => StrategyOptions::Fsdp(Fsdp::new(FsdpSharding::default())),
        };
        StrategySpec::from(strategy)
    }

    /// Which strategy this is.
    pub fn kind(&self) -> StrategyKind {
        match self.strategy {
            StrategyOptions::Single => StrategyKind::Single,
            StrategyOptions::Ddp => StrategyKind::Ddp,
            StrategyOptions::Zero1 => StrategyKind::Zero1,
            StrategyOptions::Zero2 => StrategyKind::Zero2,
            StrategyOptions::Zero3(_) => StrategyKind::Zero3,
            StrategyOptions::Fsdp(_) => StrategyKind::Fsdp,
        }
    }

    /// The same strategy with `ac` for its activation checkpointing.
    pub fn with_activation_checkpointing(mut self, ac: ActivationCheckpointing) -> Self {
        self.activation_checkpointing = ac;
        self
    }

    /// The strategy, recomputing as the spec says.
    pub fn build(&self) -> Box<dyn Strategy> {
        let ac = self.activation_checkpointing;
        match &self.strategy {
            StrategyOptions::Single => {
                Box::new(SingleDevice::new().with_activation_checkpointing(ac))
            }
            StrategyOptions::Ddp => Box::new(Ddp::new().with_activation_checkpointing(ac)),
            StrategyOptions::Zero1 => Box::new(Zero::stage1().with_activation_checkpointing(ac)),
            StrategyOptions::Zero2 => Box::new(Zero::stage2().with_activation_checkpointing(ac)),
            StrategyOptions::Zero3(zero3) => {
                Box::new(zero3.clone().with_activation_checkpointing(ac))
            }
            StrategyOptions::Fsdp(fsdp) => fsdp.clone().with_activation_checkpointing(ac).build(),
        }
    }
}

impl From<StrategyOptions> for StrategySpec {
    /// `strategy`, activations kept.
    fn from(strategy: StrategyOptions) -> Self {
        StrategySpec {
            strategy,
            activation_checkpointing: ActivationCheckpointing::None,
        }
    }
}

impl From<StrategyKind> for StrategySpec {
    fn from(strategy: StrategyKind) -> Self {
        StrategySpec::new(strategy)
    }
}

impl From<Fsdp> for StrategySpec {
    /// `fsdp`, its activation checkpointing made the spec's.
    fn from(fsdp: Fsdp) -> Self {
        StrategySpec {
            activation_checkpointing: fsdp.activation_checkpointing(),
            strategy: StrategyOptions::Fsdp(fsdp),
        }
    }
}

impl From<Zero3> for StrategySpec {
    /// `zero3`, its activation checkpointing made the spec's.
    fn from(zero3: Zero3) -> Self {
        StrategySpec {
            activation_checkpointing: zero3.activation_checkpointing(),
            strategy: StrategyOptions::Zero3(zero3),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_name_parses_back_and_an_unknown_one_lists_them() {
        for kind in StrategyKind::ALL {
            assert_eq!(kind.name().parse::<StrategyKind>().unwrap(), kind);
            assert_eq!(StrategySpec::new(kind).build().name(), kind.name());
        }
        for sharding in FsdpSharding::ALL {
            assert_eq!(sharding.name().parse::<FsdpSharding>().unwrap(), sharding);
        }
        for precision in Precision::ALL {
            assert_eq!(precision.name().parse::<Precision>().unwrap(), precision);
        }
        let e = "zero9".parse::<StrategyKind>().unwrap_err().to_string();
        assert_eq!(
            e,
            "invalid strategy: unknown strategy 'zero9'; valid: single, ddp, zero1, zero2, \
             zero3, fsdp"
        );
        let e = "half".parse::<FsdpSharding>().unwrap_err().to_string();
        assert!(
            e.contains("full_shard, shard_grad_op, no_shard, hybrid_shard"),
            "{e}"
        );
        let e = "8".parse::<Precision>().unwrap_err().to_string();
        assert!(e.contains("32, bf16-mixed, 16-mixed"), "{e}");
    }

    #[test]
    fn what_does_not_go_together_is_refused_where_it_is_said_and_a_spec_always_builds() {
        // Mixed precision under no_shard (ddp) and groups outside hybrid_shard.
        let no_shard = Fsdp::new(FsdpSharding::NoShard);
        assert!(no_shard
            .clone()
            .with_precision(Precision::F16Mixed)
            .is_err());
        assert!(no_shard.with_precision(Precision::Full).is_ok());
        assert!(Fsdp::new(FsdpSharding::FullShard)
            .with_group_size(2)
            .is_err());
        let hybrid = Fsdp::new(FsdpSharding::HybridShard)
            .with_group_size(2)
            .unwrap()
            .with_precision(Precision::Bf16Mixed)
            .unwrap()
            .with_prefetch(true)
            .with_auto_wrap(vec!["blocks.".into()]);
        let spec =
            StrategySpec::from(hybrid).with_activation_checkpointing(ActivationCheckpointing::Full);
        assert_eq!(spec.build().name(), "fsdp");
        assert_eq!(spec.activation_checkpointing, ActivationCheckpointing::Full);
        // A builder's activation checkpointing becomes its spec's.
        let zero3 = Zero3::new()
            .with_prefetch(true)
            .with_activation_checkpointing(ActivationCheckpointing::Full);
        let zero3 = StrategySpec::from(zero3);
        assert_eq!(
            zero3.activation_checkpointing,
            ActivationCheckpointing::Full
        );
        assert_eq!(zero3.build().name(), "zero3");
        for kind in StrategyKind::ALL {
            let spec = StrategySpec::new(kind)
                .with_activation_checkpointing(ActivationCheckpointing::Full);
            assert_eq!(spec.kind(), kind);
            assert_eq!(spec.activation_checkpointing, ActivationCheckpointing::Full);
        }
        // Only hybrid_shard has groups, of at least one rank.
        assert!(Fsdp::new(FsdpSharding::HybridShard)
            .with_group_size(0)
            .is_err());
        assert!(Fsdp::new(FsdpSharding::HybridShard)
            .with_group_size(3)
            .is_ok());
    }
}
