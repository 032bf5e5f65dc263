//! Flat buffers and their shards: the shard math ([`flat_layout`](crate::layout::flat_layout)),
//! gradients laid end to end, counter-based parameter init of any slice
//! ([`init`](crate::layout::init)), a quantized base's whole blocks dealt to the ranks
//! ([`block_layout`](crate::layout::block_layout)), and a strategy's saved ranges.

pub mod block_layout;
pub(crate) mod flat_grad;
pub mod flat_layout;
pub mod init;
pub(crate) mod saved_state;
