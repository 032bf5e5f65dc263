//! How a wrapped unit runs: the autograd ops that gather a unit's shard, run it and reduce
//! its gradient (`UnitOp`, `GatherOp`, `RecomputeOp`), the views of a gathered unit, the
//! prefetch of the next, gradient sync inside backward, which parameters a forward used,
//! and releasing a tensor's memory once the unit is done.

pub(crate) mod backward_reduction;
#[cfg(feature = "cuda")]
pub(crate) mod device_storage;
pub(crate) mod gather_op;
pub(crate) mod op_tensors;
pub(crate) mod param_request;
pub(crate) mod param_use;
pub(crate) mod prefetch;
pub(crate) mod recompute_op;
pub(crate) mod storage_swap;
pub(crate) mod unit_op;
pub(crate) mod unit_views;
