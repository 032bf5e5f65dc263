//! Whether the candle-core this crate builds against has wick's `op_profile` module (the
//! vendored copy says so through its `links` metadata; stock candle-core says nothing).
//! With it, the time a rank spends in collectives is profiled as a class of its own.
fn main() {
    println!("cargo::rustc-check-cfg=cfg(candle_op_profile)");
    println!("cargo::rerun-if-env-changed=DEP_WICK_CANDLE_CORE_OP_PROFILE");
    if std::env::var_os("DEP_WICK_CANDLE_CORE_OP_PROFILE").is_some() {
        println!("cargo::rustc-cfg=candle_op_profile");
    }
}
