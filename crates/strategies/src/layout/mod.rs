//! Flat buffers and their shards: the shard math ([`flat_layout`](crate::layout::flat_layout)),
//! gradients laid end to end, counter-based parameter init of any slice
//! ([`init`](crate::layout::init)), and a strategy's saved ranges.

pub(crate) mod flat_grad;
pub mod flat_layout;
pub mod init;
pub(crate) mod saved_state;
