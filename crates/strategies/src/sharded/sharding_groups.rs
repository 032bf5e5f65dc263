//! [`ShardingGroups`]: the worlds a zero3 rank shards and replicates over (hybrid sharding).

use std::sync::Arc;
use wick_core::{Collective, CollectiveExt, Result};

/// The worlds of a rank of zero3: the one it shards over, and under hybrid sharding (groups
/// of consecutive ranks) the ranks of other groups that hold the same shard.
pub(crate) struct ShardingGroups {
    pub(crate) shard: Arc<dyn Collective>,
    pub(crate) replicas: Option<Arc<dyn Collective>>,
}

impl ShardingGroups {
    /// `world` split into groups of `group_size` ranks, or whole.
    pub(crate) fn split(world: Arc<dyn Collective>, group_size: Option<usize>) -> Result<Self> {
        Ok(match group_size {
            Some(g) => {
                let rank = world.rank();
                ShardingGroups {
                    shard: world.split(rank / g)?,
                    replicas: Some(world.split(rank % g)?),
                }
            }
            None => ShardingGroups {
                shard: world,
                replicas: None,
            },
        })
    }
}
