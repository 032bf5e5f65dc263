// wick's copy only: tells the crates that depend on candle-core directly, through the
// `DEP_WICK_CANDLE_CORE_SWAP_STORAGE`, `DEP_WICK_CANDLE_CORE_BACKWARD_WITH_READY` and
// `DEP_WICK_CANDLE_CORE_OP_PROFILE` variables their build scripts see, that this copy has
// `Tensor::swap_storage`, `Tensor::backward_with_ready` and the `op_profile` module. Stock
// candle-core has no build script, so they see nothing and fall back to what stock candle
// can do.
fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    println!("cargo:swap_storage=1");
    println!("cargo:backward_with_ready=1");
    println!("cargo:op_profile=1");
}
