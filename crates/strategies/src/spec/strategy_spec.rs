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
/// --precision ...` and its TOML config say, as one value. Each variant carries only the
/// options its strategy has, so precision on ddp cannot be said; what the types cannot
/// refuse (a group of 0 ranks, mixed precision without shards) [`StrategySpec::build`]
/// refuses.
///
/// ```
/// use wick_strategies::{FsdpSpec, FsdpSharding, Precision, StrategySpec};
///
/// let spec = StrategySpec::Fsdp(FsdpSpec {
///     sharding: FsdpSharding::ShardGradOp,
///     precision: Precision::Bf16Mixed,
///     ..FsdpSpec::default()
/// });
/// assert_eq!(spec.build().unwrap().name(), "fsdp");
/// // Mixed precision needs fsdp's sharded modes.
/// let bad = StrategySpec::Fsdp(FsdpSpec {
///     sharding: FsdpSharding::NoShard,
///     precision: Precision::Bf16Mixed,
///     ..FsdpSpec::default()
/// });
/// assert!(bad.build().is_err());
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StrategySpec {
    /// [`SingleDevice`].
    Single {
        /// Which wrapped units recompute their forward in backward.
        activation_checkpointing: ActivationCheckpointing,
    },
    /// [`Ddp`].
    Ddp {
        /// Which wrapped units recompute their forward in backward.
        activation_checkpointing: ActivationCheckpointing,
    },
    /// [`Zero::stage1`].
    Zero1 {
        /// Which wrapped units recompute their forward in backward.
        activation_checkpointing: ActivationCheckpointing,
    },
    /// [`Zero::stage2`].
    Zero2 {
        /// Which wrapped units recompute their forward in backward.
        activation_checkpointing: ActivationCheckpointing,
    },
    /// [`Zero3`].
    Zero3 {
        /// Gather the next unit in the background ([`Zero3::with_prefetch`]).
        prefetch: bool,
        /// Which wrapped units recompute their forward in backward.
        activation_checkpointing: ActivationCheckpointing,
    },
    /// [`Fsdp`], with its options.
    Fsdp(FsdpSpec),
}

/// [`StrategySpec::Fsdp`]'s options; the default is `full_shard` in f32, every block a
/// unit, activations kept.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FsdpSpec {
    /// How it shards.
    pub sharding: FsdpSharding,
    /// `hybrid_shard`: ranks per sharding group (2 by default; the other shardings have no
    /// groups and ignore it).
    pub group_size: usize,
    /// The precision of its sharded modes.
    pub precision: Precision,
    /// `full_shard` and `hybrid_shard`: gather the next unit in the background.
    pub prefetch: bool,
    /// Only blocks whose names start with one of these prefixes are units of their own;
    /// the others share one root unit. `None`: every wrapped block is a unit.
    pub auto_wrap: Option<Vec<String>>,
    /// Which wrapped units recompute their forward in backward.
    pub activation_checkpointing: ActivationCheckpointing,
}

impl Default for FsdpSpec {
    fn default() -> Self {
        FsdpSpec {
            sharding: FsdpSharding::default(),
            group_size: 2,
            precision: Precision::default(),
            prefetch: false,
            auto_wrap: None,
            activation_checkpointing: ActivationCheckpointing::None,
        }
    }
}

impl StrategySpec {
    /// `strategy` with its default options.
    pub fn new(strategy: StrategyKind) -> Self {
        let activation_checkpointing = ActivationCheckpointing::None;
        match strategy {
            StrategyKind::Single => StrategySpec::Single {
                activation_checkpointing,
            },
            StrategyKind::Ddp => StrategySpec::Ddp {
                activation_checkpointing,
            },
            StrategyKind::Zero1 => StrategySpec::Zero1 {
                activation_checkpointing,
            },
            StrategyKind::Zero2 => StrategySpec::Zero2 {
                activation_checkpointing,
            },
            StrategyKind::Zero3 => StrategySpec::Zero3 {
                prefetch: false,
                activation_checkpointing,
            },
            StrategyKind::Fsdp => StrategySpec::Fsdp(FsdpSpec::default()),
        }
    }

    /// Which strategy this is.
    pub fn kind(&self) -> StrategyKind {
        match self {
            StrategySpec::Single { .. } => StrategyKind::Single,
            StrategySpec::Ddp { .. } => StrategyKind::Ddp,
            StrategySpec::Zero1 { .. } => StrategyKind::Zero1,
            StrategySpec::Zero2 { .. } => StrategyKind::Zero2,
            StrategySpec::Zero3 { .. } => StrategyKind::Zero3,
            StrategySpec::Fsdp(_) => StrategyKind::Fsdp,
        }
    }

    /// The activation checkpointing every variant carries.
    pub fn activation_checkpointing(&self) -> ActivationCheckpointing {
        *self.clone().activation_checkpointing_mut()
    }

    /// The same strategy with `ac` for its activation checkpointing.
    pub fn with_activation_checkpointing(mut self, ac: ActivationCheckpointing) -> Self {
        *self.activation_checkpointing_mut() = ac;
        self
    }

    fn activation_checkpointing_mut(&mut self) -> &mut ActivationCheckpointing {
        match self {
            StrategySpec::Single {
                activation_checkpointing,
            }
            | StrategySpec::Ddp {
                activation_checkpointing,
            }
            | StrategySpec::Zero1 {
                activation_checkpointing,
            }
            | StrategySpec::Zero2 {
                activation_checkpointing,
            }
            | StrategySpec::Zero3 {
                activation_checkpointing,
                ..
            }
            | StrategySpec::Fsdp(FsdpSpec {
                activation_checkpointing,
                ..
            }) => activation_checkpointing,
        }
    }

    /// The strategy, or an error naming the option its types could not refuse: a hybrid
    /// group of 0 ranks, or mixed precision under `no_shard`.
    pub fn build(&self) -> Result<Box<dyn Strategy>> {
        let ac = self.activation_checkpointing();
        Ok(match self {
            StrategySpec::Single { .. } => {
                Box::new(SingleDevice::new().with_activation_checkpointing(ac))
            }
            StrategySpec::Ddp { .. } => Box::new(Ddp::new().with_activation_checkpointing(ac)),
            StrategySpec::Zero1 { .. } => {
                Box::new(Zero::stage1().with_activation_checkpointing(ac))
            }
            StrategySpec::Zero2 { .. } => {
                Box::new(Zero::stage2().with_activation_checkpointing(ac))
            }
            StrategySpec::Zero3 { prefetch, .. } => Box::new(
                Zero3::new()
                    .with_prefetch(*prefetch)
                    .with_activation_checkpointing(ac),
            ),
            StrategySpec::Fsdp(spec) => spec.fsdp()?.build(),
        })
    }
}

impl FsdpSpec {
    /// The [`Fsdp`] builder these options describe.
    fn fsdp(&self) -> Result<Fsdp> {
        let mut fsdp = Fsdp::new(self.sharding)
            .with_precision(self.precision)?
            .with_prefetch(self.prefetch)
            .with_activation_checkpointing(self.activation_checkpointing);
        if self.group_size == 0 {
            return Err(Error::config(
                "group-size",
                "must be a positive integer, got 0",
            ));
        }
        if self.sharding == FsdpSharding::HybridShard {
            fsdp = fsdp.with_group_size(self.group_size)?;
        }
        if let Some(prefixes) = &self.auto_wrap {
            fsdp = fsdp.with_auto_wrap(prefixes.clone());
        }
        Ok(fsdp)
    }
}

impl From<StrategyKind> for StrategySpec {
    fn from(strategy: StrategyKind) -> Self {
        StrategySpec::new(strategy)
    }
}

impl From<FsdpSpec> for StrategySpec {
    fn from(spec: FsdpSpec) -> Self {
        StrategySpec::Fsdp(spec)
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
    fn options_the_types_cannot_refuse_are_refused_when_built() {
        let refused = [
            FsdpSpec {
                sharding: FsdpSharding::NoShard,
                precision: Precision::F16Mixed,
                ..FsdpSpec::default()
            },
            FsdpSpec {
                group_size: 0,
                sharding: FsdpSharding::HybridShard,
                ..FsdpSpec::default()
            },
            FsdpSpec {
                group_size: 0,
                ..FsdpSpec::default()
            },
        ];
        for spec in refused {
            assert!(
                StrategySpec::Fsdp(spec.clone()).build().is_err(),
                "{spec:?}"
            );
        }
        let accepted = FsdpSpec {
            sharding: FsdpSharding::HybridShard,
            group_size: 2,
            precision: Precision::Bf16Mixed,
            prefetch: true,
            auto_wrap: Some(vec!["blocks.".into()]),
            activation_checkpointing: ActivationCheckpointing::Full,
        };
        let spec = StrategySpec::from(accepted);
        assert_eq!(spec.build().unwrap().name(), "fsdp");
        assert_eq!(
            spec.activation_checkpointing(),
            ActivationCheckpointing::Full
        );
        let zero3 = StrategySpec::Zero3 {
            prefetch: true,
            activation_checkpointing: ActivationCheckpointing::None,
        };
        assert_eq!(zero3.build().unwrap().name(), "zero3");
        for kind in StrategyKind::ALL {
            let spec = StrategySpec::new(kind)
                .with_activation_checkpointing(ActivationCheckpointing::Full);
            assert_eq!(spec.kind(), kind);
            assert_eq!(
                spec.activation_checkpointing(),
                ActivationCheckpointing::Full
            );
        }
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
