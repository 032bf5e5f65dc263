//! The strategies whose parameters are born sharded: [`Zero3`](crate::Zero3), which
//! [`Fsdp`](crate::Fsdp) builds its sharded modes on, a rank's part of it once its shards
//! exist, the `ParamSource` that holds each
//! unit's shard, and their options.

pub(crate) mod fsdp;
pub(crate) mod sharded_options;
pub(crate) mod sharded_params;
pub(crate) mod sharding_groups;
pub(crate) mod zero3;
pub(crate) mod zero3_rank;
