//! The typed strategy spec, a strategy and its options checked together
//! ([`StrategySpec`](crate::StrategySpec)), and strategies by name.

pub(crate) mod registry;
pub(crate) mod strategy_spec;
