//! Whether the candle-core this crate builds against has `Tensor::swap_storage` (wick's
//! vendored copy says so through its `links` metadata; stock candle-core says nothing).
//! With it, fsdp's full_shard keeps each unit's activations and releases only its gathered
//! parameters' memory; without it, full_shard recomputes each unit's forward in backward.
//!
//! It also says whether that candle-core has `Tensor::backward_with_ready`, with which ddp
//! and zero1 issue each bucket's all-reduce while backward runs; without it, once backward
//! returns; and whether it has the `op_profile` module, under which an optimizer step is
//! profiled as one class.
fn main() {
    println!("cargo::rustc-check-cfg=cfg(candle_op_profile)");
    println!("cargo::rerun-if-env-changed=DEP_WICK_CANDLE_CORE_OP_PROFILE");
    if std::env::var_os("DEP_WICK_CANDLE_CORE_OP_PROFILE").is_some() {
        println!("cargo::rustc-cfg=candle_op_profile");
    }
    println!("cargo::rustc-check-cfg=cfg(candle_swap_storage)");
    println!("cargo::rustc-check-cfg=cfg(candle_backward_with_ready)");
    println!("cargo::rerun-if-env-changed=DEP_WICK_CANDLE_CORE_BACKWARD_WITH_READY");
    if std::env::var_os("DEP_WICK_CANDLE_CORE_BACKWARD_WITH_READY").is_some() {
        println!("cargo::rustc-cfg=candle_backward_with_ready");
    }
    println!("cargo::rerun-if-env-changed=DEP_WICK_CANDLE_CORE_SWAP_STORAGE");
    if std::env::var_os("DEP_WICK_CANDLE_CORE_SWAP_STORAGE").is_some() {
        println!("cargo::rustc-cfg=candle_swap_storage");
    }
}
