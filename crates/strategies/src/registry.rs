//! Strategy names, in one place: the command line and the API both resolve names here.

use crate::{Ddp, Fsdp, FsdpSharding, SingleDevice, Zero, Zero3};
use wick_core::{Error, Result, Strategy};

/// Every name [`strategy_by_name`] accepts.
pub const STRATEGY_NAMES: &[&str] = &[
    SingleDevice::NAME,
    Ddp::NAME,
    "zero1",
    "zero2",
    Zero3::NAME,
    Fsdp::NAME,
];

/// A fresh strategy for `name`, or an error that lists the valid names.
pub fn strategy_by_name(name: &str) -> Result<Box<dyn Strategy>> {
    match name {
        SingleDevice::NAME => Ok(Box::new(SingleDevice::new())),
        Ddp::NAME => Ok(Box::new(Ddp::new())),
        "zero1" => Ok(Box::new(Zero::stage1())),
        "zero2" => Ok(Box::new(Zero::stage2())),
        Zero3::NAME => Ok(Box::new(Zero3::new())),
        Fsdp::NAME => Ok(Fsdp::new(FsdpSharding::FullShard).build()),
        other => Err(Error::config(
            "strategy",
            format!(
                "unknown strategy '{other}'; valid: {}",
                STRATEGY_NAMES.join(", ")
            ),
        )),
    }
}
