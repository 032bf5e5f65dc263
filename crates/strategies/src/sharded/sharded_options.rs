//! The options of zero3 and FSDP's sharded modes, apart from the strategy so that the
//! parameter store and the unit op read them without depending on the strategy.

use crate::step::precision::Precision;
use wick_core::ActivationCheckpointing;

/// The options of a sharded strategy: everything that is not built from the model. A new
/// rank's strategy gets a clone of them whole, so no option can be left behind.
#[derive(Debug, Clone, PartialEq, Eq)]
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

/// The builder methods [`Sharded`](crate::Sharded) and [`Fsdp`](crate::Fsdp) share, over their
/// `options: ShardedOptions` field: written once, so the two cannot drift apart.
macro_rules! sharded_builder_methods {
    () => {
        /// Gather the next unit (the next in forward, the previous in backward) while the
        /// current one computes (DeepSpeed's `stage3_prefetch_bucket_size` above zero;
        /// FSDP's `full_shard` and `hybrid_shard` only). Off by default: on a world that
        /// completes its calls at once (ranks as threads) it only holds one more unit.
        pub fn with_prefetch(mut self, prefetch: bool) -> Self {
            self.options.prefetch = prefetch;
            self
        }

        /// A bound on the gathered parameters (elements) alive at once: a prefetch that
        /// would leave more than `max` beside the unit that runs is not made, and that unit
        /// is gathered when it runs (DeepSpeed's `stage3_max_live_parameters`). A unit
        /// larger than the bound is still gathered to run; the bound governs what waits
        /// beside it.
        pub fn with_max_live_parameters(mut self, max: usize) -> Self {
            self.options.max_live_parameters = Some(max);
            self
        }

        /// Which units recompute their forward in backward (activation checkpointing)
        /// instead of keeping their activations. Without it every mode keeps them; full
        /// sharding releases only a unit's gathered parameters after its forward and
        /// gathers them again for its backward.
        pub fn with_activation_checkpointing(
            mut self,
            ac: wick_core::ActivationCheckpointing,
        ) -> Self {
            self.options.activation_checkpointing = ac;
            self
        }

        /// Which units recompute their forward in backward.
        pub fn activation_checkpointing(&self) -> wick_core::ActivationCheckpointing {
            self.options.activation_checkpointing
        }

        /// Auto-wrap policy: a wrapped block whose name starts with one of `prefixes` is a
        /// unit of its own (gathered and freed on its own); every other block joins one
        /// root unit. Changing the policy changes the sharding granularity without touching
        /// model code (FSDP's `no_shard` has no units and ignores it).
        pub fn with_auto_wrap(mut self, prefixes: Vec<String>) -> Self {
            self.options.auto_wrap = Some(prefixes);
            self
        }
    };
}
pub(crate) use sharded_builder_methods;
