//! Strategies by name: the one place a typed-out name becomes a strategy.

use crate::{StrategyKind, StrategySpec};
use wick_core::{Result, Strategy};

/// A fresh strategy with its default options for `name` (`single`, `ddp`, `zero1`,
/// `zero2`, `zero3`, `fsdp`), or an error that lists the valid names. For other options,
/// build a [`StrategySpec`].
pub fn strategy_by_name(name: &str) -> Result<Box<dyn Strategy>> {
    Ok(StrategySpec::new(name.parse::<StrategyKind>()?).build())
}
