//! The options of zero3 and FSDP's sharded modes, apart from the strategy so that the
//! parameter store and the unit op read them without depending on the strategy.

use crate::precision::Precision;
use wick_core::ActivationCheckpointing;

/// The options of a sharded strategy: everything that is not built from the model. A new
/// rank's strategy gets a clone of them whole, so no option can be left behind.
#[derive(Debug, Clone)]
pub(crate) struct ShardedOptions {
    /// The registry name: `zero3`, or `fsdp` for FSDP's sharded modes.
    pub(crate) name: &'static str,
    /// Units run through the unit op (full sharding), their gathered parameters freed after
    /// each use, rather than gathered once per step and kept until backward (PyTorch
    /// FSDP's name for it; zero3 and FSDP's `full_shard` set it).
    pub(crate) reshard_after_forward: bool,
    /// Hybrid sharding: ranks per sharding group.
    pub(crate) group_size: Option<usize>,
    /// Mixed precision of the gathered units and the gradient reduction.
    pub(crate) precision: Precision,
    /// Auto-wrap prefixes (see `Zero3::with_auto_wrap`).
    pub(crate) auto_wrap: Option<Vec<String>>,
    /// Prefetch the next unit's gather (full sharding only).
    pub(crate) prefetch: bool,
    /// The most gathered parameters (elements) a prefetch may leave alive: the unit that
    /// runs and the one prefetched together. `None`: no bound.
    pub(crate) max_live_parameters: Option<usize>,
    /// Which units recompute their forward in backward.
    pub(crate) activation_checkpointing: ActivationCheckpointing,
}

impl ShardedOptions {
    /// The defaults, under the registry name `name`.
    pub(crate) fn new(name: &'static str) -> Self {
        ShardedOptions {
            name,
            reshard_after_forward: true,
            group_size: None,
            precision: Precision::Full,
            auto_wrap: None,
            prefetch: false,
            max_live_parameters: None,
            activation_checkpointing: ActivationCheckpointing::None,
        }
    }
}
