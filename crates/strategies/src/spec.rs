//! The typed strategy spec: which strategy, with which sharding, precision and FSDP options,
//! and which of them go together. The program's flags, its TOML config, `estimate`, the
//! registry and the trainer all read this one type, so a name is parsed once, where a user
//! typed it, and a bad combination gets the same refusal from every door.

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

/// A strategy and its options, checked together: what `wick fit --strategy ... --sharding
/// ... --precision ...` and its TOML config say, as one value.
///
/// ```
/// use wick_strategies::{Precision, FsdpSharding, StrategyKind, StrategySpec};
///
/// let spec = StrategySpec {
///     sharding: FsdpSharding::ShardGradOp,
///     precision: Precision::Bf16Mixed,
///     ..StrategySpec::new(StrategyKind::Fsdp)
/// };
/// assert_eq!(spec.build().unwrap().name(), "fsdp");
/// // Mixed precision is a mode of fsdp's sharded modes only.
/// let bad = StrategySpec { precision: Precision::Bf16Mixed, ..StrategySpec::new(StrategyKind::Ddp) };
/// assert!(bad.check().is_err());
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StrategySpec {
    /// The strategy.
    pub strategy: StrategyKind,
    /// fsdp: how it shards.
    pub sharding: FsdpSharding,
    /// fsdp `hybrid_shard`: ranks per sharding group.
    pub group_size: usize,
    /// fsdp: the precision of its sharded modes.
    pub precision: Precision,
    /// zero3, fsdp `full_shard` and `hybrid_shard`: gather the next unit in the background.
    pub prefetch: bool,
    /// fsdp: only blocks whose names start with one of these prefixes are units of their
    /// own; the others share one root unit. `None`: every wrapped block is a unit.
    pub auto_wrap: Option<Vec<String>>,
    /// Which wrapped units recompute their forward in backward instead of keeping their
    /// activations (every strategy).
    pub activation_checkpointing: ActivationCheckpointing,
}

impl StrategySpec {
    /// `strategy` with the default options: `full_shard`, groups of 2, f32, no prefetch,
    /// every block a unit, activations kept.
    pub fn new(strategy: StrategyKind) -> Self {
        StrategySpec {
            strategy,
            sharding: FsdpSharding::default(),
            group_size: 2,
            precision: Precision::default(),
            prefetch: false,
            auto_wrap: None,
            activation_checkpointing: ActivationCheckpointing::None,
        }
    }

    /// Refuses options that do not go with the strategy: precision and auto-wrap are fsdp's,
    /// prefetch is zero3's and fsdp's, mixed precision needs a sharded sharding, a group has at least one rank.
    pub fn check(&self) -> Result<()> {
        if self.group_size == 0 {
            return Err(Error::config(
                "group-size",
                "must be a positive integer, got 0",
            ));
        }
        if self.strategy != StrategyKind::Fsdp {
            if self.auto_wrap.is_some() {
                return Err(Error::config(
                    "strategy",
                    format!("auto-wrap is fsdp's option, not {}'s", self.strategy),
                ));
            }
            if self.prefetch && self.strategy != StrategyKind::Zero3 {
                return Err(Error::config(
                    "strategy",
                    format!(
                        "prefetch is an option of zero3 and fsdp, not {}",
                        self.strategy
                    ),
                ));
            }
            if self.precision != Precision::Full {
                return Err(Error::config(
                    "precision",
                    format!(
                        "precision {} needs strategy fsdp (its sharded modes), not {}",
                        self.precision, self.strategy
                    ),
                ));
            }
        }
        if self.precision != Precision::Full && self.sharding == FsdpSharding::NoShard {
            return Err(Error::config(
                "precision",
                "mixed precision needs a sharded fsdp sharding, not no_shard",
            ));
        }
        Ok(())
    }

    /// The strategy, checked first.
    pub fn build(&self) -> Result<Box<dyn Strategy>> {
        self.check()?;
        let mut strategy: Box<dyn Strategy> = match self.strategy {
            StrategyKind::Single => Box::new(SingleDevice::new()),
            StrategyKind::Ddp => Box::new(Ddp::new()),
            StrategyKind::Zero1 => Box::new(Zero::stage1()),
            StrategyKind::Zero2 => Box::new(Zero::stage2()),
            StrategyKind::Zero3 => Box::new(Zero3::new().with_prefetch(self.prefetch)),
            StrategyKind::Fsdp => {
                let mut fsdp = Fsdp::new(self.sharding)
                    .with_precision(self.precision)?
                    .with_prefetch(self.prefetch);
                if self.sharding == FsdpSharding::HybridShard {
                    fsdp = fsdp.with_group_size(self.group_size)?;
                }
                if let Some(prefixes) = &self.auto_wrap {
                    fsdp = fsdp.with_auto_wrap(prefixes.clone());
                }
                fsdp.build()
            }
        };
        strategy.set_activation_checkpointing(self.activation_checkpointing);
        Ok(strategy)
    }
}

impl From<StrategyKind> for StrategySpec {
    fn from(strategy: StrategyKind) -> Self {
        StrategySpec::new(strategy)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_name_parses_back_and_an_unknown_one_lists_them() {
        for kind in StrategyKind::ALL {
            assert_eq!(kind.name().parse::<StrategyKind>().unwrap(), kind);
            assert_eq!(StrategySpec::new(kind).build().unwrap().name(), kind.name());
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
    fn options_that_do_not_go_together_are_refused() {
        let fsdp = || StrategySpec::new(StrategyKind::Fsdp);
        let refused = [
            StrategySpec {
                precision: Precision::Bf16Mixed,
                ..StrategySpec::new(StrategyKind::Zero3)
            },
            StrategySpec {
                auto_wrap: Some(vec!["blocks.".into()]),
                ..StrategySpec::new(StrategyKind::Ddp)
            },
            StrategySpec {
                prefetch: true,
                ..StrategySpec::new(StrategyKind::Single)
            },
            StrategySpec {
                sharding: FsdpSharding::NoShard,
                precision: Precision::F16Mixed,
                ..fsdp()
            },
            StrategySpec {
                group_size: 0,
                sharding: FsdpSharding::HybridShard,
                ..fsdp()
            },
        ];
        for spec in refused {
            assert!(spec.check().is_err(), "{spec:?}");
            assert!(spec.build().is_err(), "{spec:?}");
        }
        let accepted = StrategySpec {
            sharding: FsdpSharding::HybridShard,
            group_size: 2,
            precision: Precision::Bf16Mixed,
            prefetch: true,
            auto_wrap: Some(vec!["blocks.".into()]),
            ..fsdp()
        };
        assert_eq!(accepted.build().unwrap().name(), "fsdp");
        let zero3 = StrategySpec {
            prefetch: true,
            ..StrategySpec::new(StrategyKind::Zero3)
        };
        assert_eq!(zero3.build().unwrap().name(), "zero3");
        // Only hybrid_shard has groups, of at least one rank.
        assert!(Fsdp::new(FsdpSharding::FullShard)
            .with_group_size(2)
            .is_err());
        assert!(Fsdp::new(FsdpSharding::HybridShard)
            .with_group_size(0)
            .is_err());
        assert!(Fsdp::new(FsdpSharding::HybridShard)
            .with_group_size(3)
            .is_ok());
    }
}
