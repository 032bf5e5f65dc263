//! NF4 with double quantization, the 4-bit form of a frozen weight that QLoRA defines and
//! bitsandbytes stores (`quantize_4bit(w, blocksize=64, quant_type="nf4",
//! compress_statistics=True)`, PEFT's `bnb_4bit_use_double_quant=True`).
//!
//! The weight's elements, in row-major order, fall into blocks of [`NF4_BLOCK`]. Each block
//! keeps its largest magnitude (its absmax) and each element the nearest of the 16
//! [`NF4_LEVELS`] to its value over that absmax, two to a byte, the first element in the
//! high nibble. The absmaxes are quantized again: less their mean (the offset), in blocks of
//! [`ABSMAX_BLOCK`], each by its own largest magnitude, to an entry of bitsandbytes' signed
//! 8-bit dynamic code. A weight costs 4 bits an element, plus 8 bits a 64-block and
//! 32 bits a 16384-element block: 4.127 bits.
//!
//! The arithmetic is bitsandbytes' step by step (scaling by the reciprocal for whole blocks
//! and dividing for a short tail, ties to the lower level; an absmax's 8-bit code looked
//! up, as its CPU kernel does, in a table of 65536 points of [-1, 1], so a value near the
//! midpoint of two code entries can take the farther one). The 4-bit codes, the absmaxes'
//! 8-bit codes and scales equal its own bit for bit, and its stored state decodes here to
//! its own values bit for bit (`tests/qlora.rs` against `scripts/nf4_fixtures.py`'s file,
//! which bitsandbytes wrote, one case of it with codes off the nearest entry).

use std::sync::OnceLock;

/// Elements a 4-bit absmax block holds (QLoRA's and bitsandbytes' default).
pub const NF4_BLOCK: usize = 64;

/// Absmaxes an 8-bit block of the second quantization holds (bitsandbytes' fixed size).
pub const ABSMAX_BLOCK: usize = 256;

/// Elements a stored block holds: [`ABSMAX_BLOCK`] blocks of [`NF4_BLOCK`], all that one
/// absmax scale covers. A stored block decodes alone, so a weight is kept, split between
/// ranks and decoded in these.
pub const NF4_STORED_BLOCK: usize = NF4_BLOCK * ABSMAX_BLOCK;

/// Bytes a whole stored block takes: the offset and its scale (f32 each, little-endian),
/// an absmax code a 64-block, two codes a byte.
pub const NF4_STORED_BYTES: usize = 8 + ABSMAX_BLOCK + NF4_STORED_BLOCK / 2;

/// Bytes a weight of `n` elements takes stored ([`Nf4Tensor::to_stored`]): whole stored
/// blocks, then a shorter last one.
pub fn nf4_stored_len(n: usize) -> usize {
    let (whole, rest) = (n / NF4_STORED_BLOCK, n % NF4_STORED_BLOCK);
    let last = match rest {
        0 => 0,
        m => 8 + m.div_ceil(NF4_BLOCK) + m.div_ceil(2),
    };
    whole * NF4_STORED_BYTES + last
}

/// Each [`NF4_BLOCK`] of `values`' largest magnitude, as quantizing keeps it: a whole block
/// of zeros keeps 0, a shorter last block at least 1e-38 (bitsandbytes' way). A run of
/// values that starts at a block boundary gives the absmaxes of its blocks alone, so ranks
/// holding different blocks of a weight compute their parts of its absmaxes apart.
pub fn nf4_absmax(values: &[f32]) -> Vec<f32> {
    let block_absmax = |b: &[f32]| {
        let m = b.iter().fold(0f32, |m, v| m.max(v.abs()));
        match b.len() == NF4_BLOCK {
            true => m,
            false => m.max(1e-38),
        }
    };
    values.chunks(NF4_BLOCK).map(block_absmax).collect()
}

/// The offset wick takes out of a weight's absmaxes (all of them, [`nf4_absmax`]) before
/// their 8-bit code: their mean, summed in f64 and rounded once, so that it does not depend
/// on how the sum was split.
pub fn nf4_offset(absmax: &[f32]) -> f32 {
    let sum: f64 = absmax.iter().map(|&a| f64::from(a)).sum();
    (sum / absmax.len().max(1) as f64) as f32
}

/// Decodes `stored` ([`Nf4Tensor::to_stored`]'s bytes, or any run of its whole stored blocks
/// with the last one's remainder) into `out`, one value an element.
pub fn decode_nf4_stored(stored: &[u8], out: &mut [f32]) -> Result<(), String> {
    if stored.len() != nf4_stored_len(out.len()) {
        return Err(format!(
            "{} bytes of NF4 blocks do not hold {} elements ({} bytes would)",
            stored.len(),
            out.len(),
            nf4_stored_len(out.len())
        ));
    }
    for (bytes, values) in stored
        .chunks(NF4_STORED_BYTES)
        .zip(out.chunks_mut(NF4_STORED_BLOCK))
    {
        let f32_at = |at: usize| f32::from_le_bytes(bytes[at..at + 4].try_into().expect("4"));
        let (offset, scale) = (f32_at(0), f32_at(4));
        let codes = values.len().div_ceil(NF4_BLOCK);
        decode_block(
            &bytes[8 + codes..],
            &bytes[8..8 + codes],
            scale,
            offset,
            values,
        );
    }
    Ok(())
}

/// One stored block's values: `packed` codes, `codes` its 64-blocks' absmax codes under
/// `scale`, and the weight's `offset`.
fn decode_block(packed: &[u8], codes: &[u8], scale: f32, offset: f32, out: &mut [f32]) {
    let code = dynamic_code();
    for (b, (block, absmax_code)) in out.chunks_mut(NF4_BLOCK).zip(codes).enumerate() {
        // bitsandbytes decodes the absmax (code times scale, plus the offset), then each
        // element as its level times that.
        let absmax = decoded_absmax(code, *absmax_code, scale, offset);
        for (j, v) in block.iter_mut().enumerate() {
            // Element i's code is the high nibble of byte i / 2 when i is even.
            let i = b * NF4_BLOCK + j;
            let byte = packed[i / 2];
            let level = if i.is_multiple_of(2) {
                byte >> 4
            } else {
                byte & 0x0f
            };
            *v = NF4_LEVELS[level as usize] * absmax;
        }
    }
}

/// A 64-block's absmax from its 8-bit `absmax_code`, as bitsandbytes decodes it: the code's
/// value times its block's `scale`, plus the weight's `offset`.
fn decoded_absmax(code: &[f32; 256], absmax_code: u8, scale: f32, offset: f32) -> f32 {
    code[absmax_code as usize] * scale + offset
}

/// The 16 NF4 levels: the quantiles of a standard normal scaled to [-1, 1], with an exact
/// zero (QLoRA, appendix E), as bitsandbytes' table holds them in f32.
pub const NF4_LEVELS: [f32; 16] = [
    -1.0,
    -0.696_192_8,
    -0.525_073_05,
    -0.394_917_5,
    -0.284_441_38,
    -0.184_773_43,
    -0.091_050_036,
    0.0,
    0.079_580_3,
    0.160_930_2,
    0.246_112_3,
    0.337_915_24,
    0.440_709_83,
    0.562_617,
    0.722_956_84,
    1.0,
];

/// A weight in NF4 with double quantization: its codes, its absmaxes' codes and scales, and
/// their offset.
#[derive(Debug, Clone, PartialEq)]
pub struct Nf4Tensor {
    dims: Vec<usize>,
    packed: Vec<u8>,
    absmax_codes: Vec<u8>,
    absmax_scales: Vec<f32>,
    offset: f32,
}

impl Nf4Tensor {
    /// `values` (of a tensor of shape `dims`, row-major) quantized as bitsandbytes does.
    ///
    /// # Panics
    /// If `values` does not hold `dims`' element count.
    pub fn quantize(values: &[f32], dims: &[usize]) -> Self {
        Self::quantize_with_offset(values, dims, None)
    }

    /// [`Nf4Tensor::quantize`] with the absmaxes' offset given, as a stored state holds it.
    /// bitsandbytes' offset is torch's f32 mean, whose order of summation follows the
    /// CPU's vector width; wick's own (`None`) is the mean in f64, rounded once, which can
    /// differ from it in the last bit. Given bitsandbytes' offset, the 4-bit codes, the
    /// absmaxes' 8-bit codes and their scales equal its own.
    ///
    /// # Panics
    /// If `values` does not hold `dims`' element count.
    pub fn quantize_with_offset(values: &[f32], dims: &[usize], offset: Option<f32>) -> Self {
        assert_eq!(values.len(), dims.iter().product::<usize>(), "{dims:?}");
        let absmax = nf4_absmax(values);
        let mut codes: Vec<u8> = Vec::with_capacity(values.len() + 1);
        for (block, &amax) in values.chunks(NF4_BLOCK).zip(&absmax) {
            let guarded = amax.max(1e-38);
            // bitsandbytes multiplies whole blocks by the reciprocal and divides a tail.
            let reciprocal = 1.0 / guarded;
            let whole = block.len() == NF4_BLOCK;
            codes.extend(block.iter().map(|&v| {
                let scaled = if whole { v * reciprocal } else { v / guarded };
                nf4_code(scaled.clamp(-1.0, 1.0))
            }));
        }
        // An odd count is padded with the code of 0.
        if !codes.len().is_multiple_of(2) {
            codes.push(nf4_code(0.0));
        }
        let packed = codes.chunks(2).map(|p| (p[0] << 4) | p[1]).collect();
        let offset = offset.unwrap_or_else(|| nf4_offset(&absmax));
        let centred: Vec<f32> = absmax.iter().map(|&a| a - offset).collect();
        let (absmax_codes, absmax_scales) = quantize_dynamic(&centred);
        Nf4Tensor {
            dims: dims.to_vec(),
            packed,
            absmax_codes,
            absmax_scales,
            offset,
        }
    }

    /// A weight from its stored parts (as bitsandbytes' quantized state holds them),
    /// checked against each other.
    pub fn from_parts(
        dims: &[usize],
        packed: Vec<u8>,
        absmax_codes: Vec<u8>,
        absmax_scales: Vec<f32>,
        offset: f32,
    ) -> Result<Self, String> {
        let n: usize = dims.iter().product();
        let blocks = n.div_ceil(NF4_BLOCK);
        let expect = [
            ("packed codes", packed.len(), n.div_ceil(2)),
            ("absmax codes", absmax_codes.len(), blocks),
            (
                "absmax scales",
                absmax_scales.len(),
                blocks.div_ceil(ABSMAX_BLOCK),
            ),
        ];
        for (what, got, want) in expect {
            if got != want {
                return Err(format!(
                    "NF4 weight of shape {dims:?}: {got} {what}, expected {want}"
                ));
            }
        }
        Ok(Nf4Tensor {
            dims: dims.to_vec(),
            packed,
            absmax_codes,
            absmax_scales,
            offset,
        })
    }

    /// The weight's shape.
    pub fn dims(&self) -> &[usize] {
        &self.dims
    }

    /// The number of elements.
    pub fn elem_count(&self) -> usize {
        self.dims.iter().product()
    }

    /// The 4-bit codes, two a byte, the first in the high nibble.
    pub fn packed(&self) -> &[u8] {
        &self.packed
    }

    /// Each 64-block's absmax less [`Nf4Tensor::offset`], in the 8-bit dynamic code.
    pub fn absmax_codes(&self) -> &[u8] {
        &self.absmax_codes
    }

    /// The scale of each 256 absmax codes.
    pub fn absmax_scales(&self) -> &[f32] {
        &self.absmax_scales
    }

    /// The mean absmax, added back after the absmaxes' own dequantization.
    pub fn offset(&self) -> f32 {
        self.offset
    }

    /// Bytes the weight takes stored ([`Nf4Tensor::to_stored`]).
    pub fn storage_bytes(&self) -> usize {
        nf4_stored_len(self.elem_count())
    }

    /// Each 64-block's absmax, as bitsandbytes decodes it: code times scale, plus offset.
    pub fn absmax(&self) -> Vec<f32> {
        let code = dynamic_code();
        self.absmax_codes
            .iter()
            .enumerate()
            .map(|(i, &c)| {
                decoded_absmax(code, c, self.absmax_scales[i / ABSMAX_BLOCK], self.offset)
            })
            .collect()
    }

    /// The values the weight decodes to, row-major: level times its block's absmax.
    pub fn dequantize(&self) -> Vec<f32> {
        let mut out = vec![0f32; self.elem_count()];
        for (k, values) in out.chunks_mut(NF4_STORED_BLOCK).enumerate() {
            let (packed, codes) = self.stored_block(k);
            decode_block(packed, codes, self.absmax_scales[k], self.offset, values);
        }
        out
    }

    /// The weight as it is kept: its stored blocks one after the other, each the offset,
    /// its scale, its absmax codes and its packed codes ([`decode_nf4_stored`] reads them).
    pub fn to_stored(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(nf4_stored_len(self.elem_count()));
        for (k, scale) in self.absmax_scales.iter().enumerate() {
            let (packed, codes) = self.stored_block(k);
            out.extend(self.offset.to_le_bytes());
            out.extend(scale.to_le_bytes());
            out.extend(codes);
            out.extend(packed);
        }
        out
    }

    /// Stored block `k`'s packed codes and absmax codes.
    fn stored_block(&self, k: usize) -> (&[u8], &[u8]) {
        let codes = &self.absmax_codes[k * ABSMAX_BLOCK..];
        let packed = &self.packed[k * NF4_STORED_BLOCK / 2..];
        (
            &packed[..packed.len().min(NF4_STORED_BLOCK / 2)],
            &codes[..codes.len().min(ABSMAX_BLOCK)],
        )
    }
}

/// The NF4 code of `x` in [-1, 1]: the number of midpoints between neighbouring levels that
/// lie below it (torch's `bucketize`, as bitsandbytes quantizes: a tie goes to the lower).
fn nf4_code(x: f32) -> u8 {
    NF4_LEVELS
        .windows(2)
        .filter(|pair| (pair[0] + pair[1]) / 2.0 < x)
        .count() as u8
}

/// `values` in blocks of [`ABSMAX_BLOCK`], each scaled by its largest magnitude and coded
/// in the dynamic code as bitsandbytes' CPU kernel (`quantize_blockwise`) codes it: the
/// scaled value, clamped to [-1, 1], picks one of [`TABLE_SIZE`] evenly spaced points,
/// and [`dynamic_table`] gives that point's nearest code entry. A value near the midpoint
/// of two entries can so take the farther one, as bitsandbytes' does. The codes, and each
/// block's scale (a block of zeros: scale 0, every code 0).
fn quantize_dynamic(values: &[f32]) -> (Vec<u8>, Vec<f32>) {
    let table = dynamic_table();
    let last = (TABLE_SIZE - 1) as f32;
    let mut codes = Vec::with_capacity(values.len());
    let mut scales = Vec::with_capacity(values.len().div_ceil(ABSMAX_BLOCK));
    for block in values.chunks(ABSMAX_BLOCK) {
        let scale = block.iter().fold(0f32, |m, v| m.max(v.abs()));
        scales.push(scale);
        if scale == 0.0 {
            codes.resize(codes.len() + block.len(), 0);
            continue;
        }
        let inverse = 1.0 / scale;
        for &v in block {
            let normed = (v * inverse).clamp(-1.0, 1.0);
            // Each step rounded on its own, as its kernel computes it; then truncated.
            let point = (normed + 1.0) * 0.5 * last + 0.5;
            codes.push(table[point as usize]);
        }
    }
    (codes, scales)
}

/// The points of [-1, 1] bitsandbytes' 8-bit quantization looks a scaled value up at.
const TABLE_SIZE: usize = 1 << 16;

/// For each of [`TABLE_SIZE`] evenly spaced points of [-1, 1] (`-1 + 2i / 65535` in f32),
/// the first entry of the dynamic code whose midpoint with the next is not below it:
/// bitsandbytes' `build_quantize_lut`.
fn dynamic_table() -> &'static [u8; TABLE_SIZE] {
    static TABLE: OnceLock<Box<[u8; TABLE_SIZE]>> = OnceLock::new();
    TABLE.get_or_init(|| {
        let code = dynamic_code();
        let midpoints: Vec<f32> = code.windows(2).map(|c| 0.5 * (c[0] + c[1])).collect();
        let mut table = Box::new([0u8; TABLE_SIZE]);
        let mut entry = 0;
        for (i, slot) in table.iter_mut().enumerate() {
            let point = -1.0 + (2.0 * i as f32) / (TABLE_SIZE - 1) as f32;
            while entry < midpoints.len() && midpoints[entry] < point {
                entry += 1;
            }
            *slot = entry as u8;
        }
        table
    })
}

/// bitsandbytes' signed 8-bit dynamic code (`create_dynamic_map(signed=True)`): for each
/// exponent e = 0..7, the midpoints of 2^e + 1 evenly spaced points over [0.1, 1] (torch's
/// f32 `linspace`), times ±10^(e-6), then 0 and 1, sorted.
pub fn dynamic_code() -> &'static [f32; 256] {
    static CODE: OnceLock<[f32; 256]> = OnceLock::new();
    CODE.get_or_init(|| {
        let mut data: Vec<f32> = Vec::with_capacity(256);
        for e in 0..7i32 {
            let points = linspace_f32(0.1, 1.0, (1usize << e) + 1);
            // torch multiplies an f32 tensor by a Python float in f32.
            let magnitude = 10f64.powi(e - 6) as f32;
            let means: Vec<f32> = points.windows(2).map(|p| (p[0] + p[1]) / 2.0).collect();
            data.extend(means.iter().map(|m| magnitude * m));
            data.extend(means.iter().map(|m| -magnitude * m));
        }
        data.extend([0.0, 1.0]);
        data.sort_by(f32::total_cmp);
        data.try_into().expect("254 midpoints, 0 and 1")
    })
}

/// torch's f32 `linspace` on the CPU: the first half stepped up from `start`, the second
/// down from `end`, each point one fused multiply-add (its vectorized kernel's rounding).
fn linspace_f32(start: f32, end: f32, steps: usize) -> Vec<f32> {
    let step = (end - start) / (steps - 1) as f32;
    let halfway = steps / 2;
    (0..steps)
        .map(|i| match i < halfway {
            true => step.mul_add(i as f32, start),
            false => (-step).mul_add((steps - i - 1) as f32, end),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn levels_decode_to_themselves_and_ties_go_down() {
        for (i, &level) in NF4_LEVELS.iter().enumerate() {
            assert_eq!(nf4_code(level), i as u8);
        }
        let mid = (NF4_LEVELS[7] + NF4_LEVELS[8]) / 2.0;
        assert_eq!(nf4_code(mid), 7);
    }

    #[test]
    fn a_weight_round_trips_within_half_a_level_step() {
        let values: Vec<f32> = (0..1000)
            .map(|i| ((i * 37 % 101) as f32 - 50.0) / 7.0)
            .collect();
        let q = Nf4Tensor::quantize(&values, &[10, 100]);
        let back = q.dequantize();
        let absmax = q.absmax();
        for (i, (v, b)) in values.iter().zip(&back).enumerate() {
            // The widest gap between levels is 1 - 0.6962 of the absmax: half of it, and more.
            let bound = absmax[i / NF4_BLOCK] * 0.16;
            assert!((v - b).abs() <= bound, "{i}: {v} -> {b}");
        }
        assert_eq!(q.storage_bytes(), 8 + 16 + 500);
        let mut decoded = vec![0f32; 1000];
        decode_nf4_stored(&q.to_stored(), &mut decoded).unwrap();
        assert_eq!(decoded, back);
        let short = decode_nf4_stored(&q.to_stored()[1..], &mut decoded).unwrap_err();
        assert!(
            short.contains("523 bytes of NF4 blocks do not hold 1000"),
            "{short}"
        );
        let parts =
            Nf4Tensor::from_parts(&[10, 100], q.packed.clone(), vec![0; 15], vec![1.0], 0.0);
        assert!(parts.unwrap_err().contains("15 absmax codes, expected 16"));
    }
}
