//! The typed strategy spec: which strategy, with the options of that strategy only. The
//! program's flags, its TOML config, `estimate`, the registry and the trainer all read this
//! one type, so a name is parsed once, where a user typed it.

use crate::{Ddp, Fsdp, FsdpSharding, Precision, SingleDevice, Zero, Zero3};
use std::fmt;
use std::num::NonZeroUsize;
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
/// [`StrategyOptions`] carries only the options its strategy has, so precision on ddp
/// cannot be said; activation checkpointing, which every strategy takes, is said once
/// beside it. What the types cannot refuse (mixed precision under `no_shard`)
/// [`StrategySpec::build`] refuses.
///
/// ```
/// use wick_strategies::{FsdpSpec, FsdpSharding, Precision, StrategySpec};
///
/// let spec = StrategySpec::from(FsdpSpec {
///     sharding: FsdpSharding::ShardGradOp,
///     precision: Precision::Bf16Mixed,
///     ..FsdpSpec::default()
/// });
/// assert_eq!(spec.build().unwrap().name(), "fsdp");
/// // Mixed precision needs fsdp's sharded modes.
/// let bad = StrategySpec::from(FsdpSpec {
///     sharding: FsdpSharding::NoShard,
///     precision: Precision::Bf16Mixed,
///     ..FsdpSpec::default()
/// });
/// assert!(bad.build().is_err());
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StrategySpec {
    /// Which strategy, with the options that are its own.
    pub strategy: StrategyOptions,
    /// Which wrapped units recompute their forward in backward (every strategy takes it).
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
    /// [`Zero3`].
    Zero3 {
        /// Gather the next unit in the background ([`Zero3::with_prefetch`]).
        prefetch: bool,
    },
    /// [`Fsdp`], with its options.
    Fsdp(FsdpSpec),
}

/// [`StrategyOptions::Fsdp`]'s options; the default is `full_shard` in f32, every block a
/// unit.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FsdpSpec {
    /// How it shards.
    pub sharding: FsdpSharding,
    /// `hybrid_shard`: ranks per sharding group (2 by default; the other shardings have no
    /// groups and ignore it).
    pub group_size: NonZeroUsize,
    /// The precision of its sharded modes.
    pub precision: Precision,
    /// `full_shard` and `hybrid_shard`: gather the next unit in the background.
    pub prefetch: bool,
    /// Only blocks whose names start with one of these prefixes are units of their own;
    /// the others share one root unit. `None`: every wrapped block is a unit.
    pub auto_wrap: Option<Vec<String>>,
}

impl Default for FsdpSpec {
    fn default() -> Self {
        FsdpSpec {
            sharding: FsdpSharding::default(),
            group_size: NonZeroUsize::new(2).expect("2 is not 0"),
            precision: Precision::default(),
            prefetch: false,
            auto_wrap: None,
        }
    }
}

impl StrategySpec {
    /// `strategy` with its default options, activations kept.
    pub fn new(strategy: StrategyKind) -> Self {
        let strategy = match strategy {
            StrategyKind::Single => StrategyOptions::Single,
            StrategyKind::Ddp => StrategyOptions::Ddp,
            StrategyKind::Zero1 => StrategyOptions::Zero1,
            StrategyKind::Zero2 => StrategyOptions::Zero2,
            StrategyKind::Zero3 => StrategyOptions::Zero3 { prefetch: false },
            StrategyKind::Fsdp => StrategyOptions::Fsdp(FsdpSpec::default()),
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
            StrategyOptions::Zero3 { .. } => StrategyKind::Zero3,
            StrategyOptions::Fsdp(_) => StrategyKind::Fsdp,
        }
    }

    /// The same strategy with `ac` for its activation checkpointing.
    pub fn with_activation_checkpointing(mut self, ac: ActivationCheckpointing) -> Self {
        self.activation_checkpointing = ac;
        self
    }

    /// The strategy, or an error naming the option its types could not refuse: mixed
    /// precision under `no_shard`.
    pub fn build(&self) -> Result<Box<dyn Strategy>> {
        let ac = self.activation_checkpointing;
        Ok(match &self.strategy {
            StrategyOptions::Single => {
                Box::new(SingleDevice::new().with_activation_checkpointing(ac))
            }
            StrategyOptions::Ddp => Box::new(Ddp::new().with_activation_checkpointing(ac)),
            StrategyOptions::Zero1 => Box::new(Zero::stage1().with_activation_checkpointing(ac)),
            StrategyOptions::Zero2 => Box::new(Zero::stage2().with_activation_checkpointing(ac)),
            StrategyOptions::Zero3 { prefetch } => Box::new(
                Zero3::new()
                    .with_prefetch(*prefetch)
                    .with_activation_checkpointing(ac),
            ),
            StrategyOptions::Fsdp(spec) => spec.fsdp(ac)?.build(),
        })
    }
}

impl FsdpSpec {
    /// The [`Fsdp`] builder these options describe, recomputing as `ac` says.
    fn fsdp(&self, ac: ActivationCheckpointing) -> Result<Fsdp> {
        let mut fsdp = Fsdp::new(self.sharding)
            .with_precision(self.precision)?
            .with_prefetch(self.prefetch)
            .with_activation_checkpointing(ac);
        if self.sharding == FsdpSharding::HybridShard {
            fsdp = fsdp.with_group_size(self.group_size.get())?;
        }
        if let Some(prefixes) = &self.auto_wrap {
            fsdp = fsdp.with_auto_wrap(prefixes.clone());
        }
        Ok(fsdp)
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

impl From<FsdpSpec> for StrategySpec {
    /// Fsdp with `spec`, activations kept.
    fn from(spec: FsdpSpec) -> Self {
        StrategySpec::from(StrategyOptions::Fsdp(spec))
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
        let refused = FsdpSpec {
            sharding: FsdpSharding::NoShard,
            precision: Precision::F16Mixed,
            ..FsdpSpec::default()
        };
        assert!(StrategySpec::from(refused).build().is_err());
        let accepted = FsdpSpec {
            sharding: FsdpSharding::HybridShard,
            group_size: NonZeroUsize::new(2).unwrap(),
            precision: Precision::Bf16Mixed,
            prefetch: true,
            auto_wrap: Some(vec!["blocks.".into()]),
        };
        let spec = StrategySpec::from(accepted)
            .with_activation_checkpointing(ActivationCheckpointing::Full);
        assert_eq!(spec.build().unwrap().name(), "fsdp");
        assert_eq!(spec.activation_checkpointing, ActivationCheckpointing::Full);
        let zero3 = StrategySpec::from(StrategyOptions::Zero3 { prefetch: true });
        assert_eq!(zero3.build().unwrap().name(), "zero3");
        for kind in StrategyKind::ALL {
            let spec = StrategySpec::new(kind)
                .with_activation_checkpointing(ActivationCheckpointing::Full);
            assert_eq!(spec.kind(), kind);
            assert_eq!(spec.activation_checkpointing, ActivationCheckpointing::Full);
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
