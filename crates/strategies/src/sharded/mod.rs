//! The strategies whose parameters are born sharded: [`Sharded`](crate::Sharded) (ZeRO-3,
//! and the sharded modes [`Fsdp`](crate::Fsdp) builds), a rank's part of it once its shards
//! exist, the `ParamSource` that holds each unit's shards (made from the unit's requests
//! when it closes; a quantized base's in whole stored blocks), and their options.

pub(crate) mod block_shard;
pub(crate) mod fsdp;
pub(crate) mod sharded_options;
pub(crate) mod sharded_params;
pub(crate) mod sharded_rank;
pub(crate) mod sharded_strategy;
pub(crate) mod sharding_groups;
pub(crate) mod unit_shards;
