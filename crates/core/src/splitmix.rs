//! SplitMix64, the seeding function every seeded draw in wick goes through (the data
//! loader's shuffle, parameter init, LoRA dropout, `prepare --mix`): one copy, so that a
//! seed means the same bits everywhere.

/// SplitMix64 of `x`: `x` plus the golden-ratio increment, then its finalizer. Fed a
/// counter (`seed + k * 0x9E37_79B9_7F4A_7C15`, or any distinct inputs) it gives a stream
/// of well-mixed 64-bit values; nearby seeds give unrelated ones.
pub fn splitmix64(x: u64) -> u64 {
    let mut z = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}
