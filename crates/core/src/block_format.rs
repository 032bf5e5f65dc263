//! `BlockFormat`: the quantized forms a frozen weight (QLoRA's base) is kept in, as runs of
//! stored blocks that each decode alone: NF4 with double quantization ([`crate::Nf4Tensor`]),
//! and llama.cpp's block types (Q8_0, Q4_K, Q6_K and the others a GGUF file holds), whose
//! blocks Candle's `quantized` module encodes and decodes as ggml does.
//!
//! A weight's values, row-major and end to end, fall into stored blocks of
//! [`BlockFormat::block_values`] values and [`BlockFormat::block_bytes`] bytes. A strategy
//! deals whole stored blocks to ranks, so a block and its scales never straddle two. The
//! last block of a ggml weight whose count does not fill it is padded with zeros (decoded
//! and dropped); NF4's last stored block is shorter instead, as bitsandbytes stores it.

use crate::nf4::{
    decode_nf4_stored, nf4_stored_len, Nf4Tensor, NF4_STORED_BLOCK, NF4_STORED_BYTES,
};
use candle_core::quantized::{GgmlDType, QTensor};
use candle_core::{Device, Shape, Tensor};
use rayon::prelude::*;
use std::borrow::Cow;

/// Values a decoding task of [`BlockFormat::decode_values`] takes: whole stored blocks,
/// about 16384 values.
const TASK_VALUES: usize = 16384;

/// A quantized form of a frozen weight, named as on the command line (`nf4`, `q8_0`,
/// `q4_k`, `q6_k`, ...) and as llama.cpp names its types.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum BlockFormat {
    /// NF4 with double quantization, as QLoRA defines it and bitsandbytes stores it
    /// (`bnb_4bit_quant_type="nf4"`, `bnb_4bit_use_double_quant=True`): 4.13 bits a weight.
    Nf4,
    /// llama.cpp's Q8_0: blocks of 32 signed bytes and an f16 scale, 8.5 bits a weight.
    Q8_0,
    /// llama.cpp's Q4_K: super-blocks of 256 in 4 bits with 6-bit scales and mins, 4.5 bits.
    Q4K,
    /// llama.cpp's Q6_K: super-blocks of 256 in 6 bits with 8-bit scales, 6.56 bits.
    Q6K,
    /// llama.cpp's Q4_0: blocks of 32 in 4 bits with an f16 scale, 4.5 bits.
    Q4_0,
    /// llama.cpp's Q4_1: Q4_0 with an f16 minimum, 5 bits.
    Q4_1,
    /// llama.cpp's Q5_0: blocks of 32 in 5 bits with an f16 scale, 5.5 bits.
    Q5_0,
    /// llama.cpp's Q5_1: Q5_0 with an f16 minimum, 6 bits.
    Q5_1,
    /// llama.cpp's Q2_K: super-blocks of 256 in 2 bits, 2.63 bits.
    Q2K,
    /// llama.cpp's Q3_K: super-blocks of 256 in 3 bits, 3.44 bits.
    Q3K,
    /// llama.cpp's Q5_K: super-blocks of 256 in 5 bits, 5.5 bits.
    Q5K,
}

impl BlockFormat {
    /// Every form, in the order the command line lists them.
    pub const ALL: [BlockFormat; 11] = [
        BlockFormat::Nf4,
        BlockFormat::Q8_0,
        BlockFormat::Q4K,
        BlockFormat::Q6K,
        BlockFormat::Q4_0,
        BlockFormat::Q4_1,
        BlockFormat::Q5_0,
        BlockFormat::Q5_1,
        BlockFormat::Q2K,
        BlockFormat::Q3K,
        BlockFormat::Q5K,
    ];

    /// Its name on the command line and in a checkpoint.
    pub fn name(self) -> &'static str {
        match self {
            BlockFormat::Nf4 => "nf4",
            BlockFormat::Q8_0 => "q8_0",
            BlockFormat::Q4K => "q4_k",
            BlockFormat::Q6K => "q6_k",
            BlockFormat::Q4_0 => "q4_0",
            BlockFormat::Q4_1 => "q4_1",
            BlockFormat::Q5_0 => "q5_0",
            BlockFormat::Q5_1 => "q5_1",
            BlockFormat::Q2K => "q2_k",
            BlockFormat::Q3K => "q3_k",
            BlockFormat::Q5K => "q5_k",
        }
    }

    /// The ggml type that encodes its blocks (none for NF4).
    pub fn ggml(self) -> Option<GgmlDType> {
        Some(match self {
            BlockFormat::Nf4 => return None,
            BlockFormat::Q8_0 => GgmlDType::Q8_0,
            BlockFormat::Q4K => GgmlDType::Q4K,
            BlockFormat::Q6K => GgmlDType::Q6K,
            BlockFormat::Q4_0 => GgmlDType::Q4_0,
            BlockFormat::Q4_1 => GgmlDType::Q4_1,
            BlockFormat::Q5_0 => GgmlDType::Q5_0,
            BlockFormat::Q5_1 => GgmlDType::Q5_1,
            BlockFormat::Q2K => GgmlDType::Q2K,
            BlockFormat::Q3K => GgmlDType::Q3K,
            BlockFormat::Q5K => GgmlDType::Q5K,
        })
    }

    /// The form of a GGUF tensor of type `ggml`, where it is a block type wick keeps (not
    /// f32, f16 or bf16, nor the dot-product types Q8_1 and Q8_K).
    pub fn from_ggml(ggml: GgmlDType) -> Option<Self> {
        Self::ALL.into_iter().find(|f| f.ggml() == Some(ggml))
    }

    /// Values a stored block holds (the unit that decodes alone).
    pub fn block_values(self) -> usize {
        match self.ggml() {
            None => NF4_STORED_BLOCK,
            Some(t) => t.block_size(),
        }
    }

    /// Bytes a whole stored block takes.
    pub fn block_bytes(self) -> usize {
        match self.ggml() {
            None => NF4_STORED_BYTES,
            Some(t) => t.type_size(),
        }
    }

    /// Bytes a weight of `n` values takes stored.
    pub fn stored_len(self, n: usize) -> usize {
        match self.ggml() {
            None => nf4_stored_len(n),
            Some(_) => n.div_ceil(self.block_values()) * self.block_bytes(),
        }
    }

    /// Whether a block's bytes depend on its whole weight, not on its own values alone:
    /// NF4's absmaxes are stored less their mean over the weight (the offset).
    pub fn needs_weight_offset(self) -> bool {
        self == BlockFormat::Nf4
    }

    /// `values` (a whole weight, or a run of its whole blocks) stored in this form. For
    /// NF4, `nf4_offset` is the whole weight's offset ([`crate::nf4_offset`]); `None` takes
    /// it from `values`.
    pub fn quantize(self, values: &[f32], nf4_offset: Option<f32>) -> candle_core::Result<Vec<u8>> {
        let Some(ggml) = self.ggml() else {
            let nf4 = Nf4Tensor::quantize_with_offset(values, &[values.len()], nf4_offset);
            return Ok(nf4.to_stored());
        };
        let padded = values.len().div_ceil(self.block_values()) * self.block_values();
        let mut all = Vec::with_capacity(padded);
        all.extend_from_slice(values);
        all.resize(padded, 0.0);
        let q = QTensor::quantize(&Tensor::from_vec(all, padded, &Device::Cpu)?, ggml)?;
        Ok(q.data()?.into_owned())
    }

    /// Decodes `stored` (a weight's stored bytes, or any run of its whole stored blocks,
    /// the last one's remainder included) into `out`, one value an element.
    pub fn decode(self, stored: &[u8], out: &mut [f32]) -> Result<(), String> {
        let Some(ggml) = self.ggml() else {
            return decode_nf4_stored(stored, out);
        };
        if stored.len() != self.stored_len(out.len()) {
            return Err(format!(
                "{} bytes of {} blocks do not hold {} elements ({} bytes would)",
                stored.len(),
                self.name(),
                out.len(),
                self.stored_len(out.len())
            ));
        }
        // Candle reads ggml blocks in place, which needs their f16 fields aligned: bytes
        // at an odd address (a view of a packed buffer) are copied to aligned words first.
        let words: Vec<u16>;
        let aligned: &[u8] = match (stored.as_ptr() as usize).is_multiple_of(2) {
            true => stored,
            false => {
                words = stored
                    .chunks(2)
                    .map(|p| u16::from_ne_bytes([p[0], p.get(1).copied().unwrap_or(0)]))
                    .collect();
                &bytemuck::cast_slice(&words)[..stored.len()]
            }
        };
        let padded = stored.len() / self.block_bytes() * self.block_values();
        let decoded = ggml
            .from_data(Cow::Borrowed(aligned))
            .dequantize(padded)
            .map_err(|e| e.to_string())?;
        let candle_core::CpuStorage::F32(values) = decoded else {
            return Err(format!("{} decoded to a dtype other than f32", self.name()));
        };
        out.copy_from_slice(&values[..out.len()]);
        Ok(())
    }

    /// The f32 weight of `shape` that this form's blocks `stored` (a u8 tensor) hold, on
    /// their device ([`BlockFormat::decode_values`] of all of them, read in place on the
    /// CPU: [`with_stored_bytes`]).
    pub fn decode_tensor(self, stored: &Tensor, shape: &Shape) -> candle_core::Result<Tensor> {
        let mut values = vec![0f32; shape.elem_count()];
        with_stored_bytes(stored, |bytes| {
            self.decode_values(bytes, values.len(), 0, &mut values)
                .map_err(|e| candle_core::Error::Msg(format!("a weight of shape {shape:?}: {e}")))
        })?;
        Tensor::from_vec(values, shape, stored.device())
    }

    /// Decodes the values `start..start + out.len()` of a weight of `len` values whose
    /// stored bytes are `stored` (all of them), decoding only the stored blocks that hold
    /// those values: a row of an embedding table, or a slice of its rows. Runs of whole
    /// stored blocks decode alone, in parallel, a task each.
    pub fn decode_values(
        self,
        stored: &[u8],
        len: usize,
        start: usize,
        out: &mut [f32],
    ) -> Result<(), String> {
        if stored.len() != self.stored_len(len) || start + out.len() > len {
            return Err(format!(
                "{} bytes of {self} blocks do not hold values {start}..{} of {len} ({} bytes \
                 would hold {len})",
                stored.len(),
                start + out.len(),
                self.stored_len(len)
            ));
        }
        // Tasks split at multiples of `task` values, so each starts on a block's boundary
        // (the first one excepted) and decodes its blocks once.
        let task = (TASK_VALUES / self.block_values()).max(1) * self.block_values();
        let first = (task - start % task).min(out.len());
        let (head, rest) = out.split_at_mut(first);
        self.decode_run((stored, len), start, head)?;
        (rest.par_chunks_mut(task).enumerate()).try_for_each(|(i, chunk)| {
            self.decode_run((stored, len), start + first + i * task, chunk)
        })
    }

    /// [`BlockFormat::decode_values`] on one thread: the blocks that hold the values
    /// `start..start + out.len()` decoded, and those values kept.
    fn decode_run(
        self,
        (stored, len): (&[u8], usize),
        start: usize,
        out: &mut [f32],
    ) -> Result<(), String> {
        if out.is_empty() {
            return Ok(());
        }
        let (per_block, block_bytes) = (self.block_values(), self.block_bytes());
        let (first, end) = (start / per_block, (start + out.len()).div_ceil(per_block));
        let values = first * per_block..(end * per_block).min(len);
        let bytes = &stored[first * block_bytes..(end * block_bytes).min(stored.len())];
        if values == (start..start + out.len()) {
            return self.decode(bytes, out);
        }
        let mut blocks = vec![0f32; values.len()];
        self.decode(bytes, &mut blocks)?;
        let from = start - values.start;
        out.copy_from_slice(&blocks[from..from + out.len()]);
        Ok(())
    }

    /// The values `values` (of one weight) take in this form: quantized, then decoded
    /// (what QLoRA's layers compute with, and what a merge adds to).
    pub fn round_trip(self, values: &[f32]) -> candle_core::Result<Vec<f32>> {
        let stored = self.quantize(values, None)?;
        let mut out = vec![0f32; values.len()];
        self.decode(&stored, &mut out)
            .map_err(candle_core::Error::Msg)?;
        Ok(out)
    }
}

impl std::fmt::Display for BlockFormat {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

impl std::str::FromStr for BlockFormat {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Self::ALL
            .into_iter()
            .find(|f| f.name() == s)
            .ok_or_else(|| {
                let names: Vec<&str> = Self::ALL.iter().map(|f| f.name()).collect();
                format!(
                    "{s} is not a block format wick keeps ({})",
                    names.join(", ")
                )
            })
    }
}

/// `f` of the bytes of `stored` (a u8 tensor of stored blocks): read in place on the CPU,
/// so that decoding a weight, or a row of a table, copies none of its blocks; copied to the
/// host from other devices. A tensor whose bytes are not one contiguous run within its
/// storage is an error.
pub fn with_stored_bytes<R>(
    stored: &Tensor,
    f: impl FnOnce(&[u8]) -> candle_core::Result<R>,
) -> candle_core::Result<R> {
    if stored.device().is_cpu() {
        let (storage, layout) = stored.storage_and_layout();
        if let candle_core::Storage::Cpu(cpu) = &*storage {
            let bytes = (layout.contiguous_offsets())
                .and_then(|(start, end)| cpu.as_slice::<u8>().ok()?.get(start..end));
            return match bytes {
                Some(bytes) => f(bytes),
                None => candle_core::bail!(
                    "stored blocks must be contiguous u8 within their storage ({:?})",
                    stored.dtype()
                ),
            };
        }
    }
    f(&stored.to_vec1::<u8>()?)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn values(n: usize) -> Vec<f32> {
        (0..n)
            .map(|i| ((i * 7919 % 1013) as f32 / 1013.0 - 0.5) * 0.1)
            .collect()
    }

    #[test]
    fn every_form_round_trips_close_and_names_itself() {
        // Worst step of each form over values in [-0.05, 0.05].
        let bound = [
            (BlockFormat::Nf4, 0.01),
            (BlockFormat::Q8_0, 0.0005),
            (BlockFormat::Q4K, 0.005),
            (BlockFormat::Q6K, 0.002),
            (BlockFormat::Q4_0, 0.008),
            (BlockFormat::Q4_1, 0.005),
            (BlockFormat::Q5_0, 0.004),
            (BlockFormat::Q5_1, 0.002),
            (BlockFormat::Q2K, 0.025),
            (BlockFormat::Q3K, 0.015),
            (BlockFormat::Q5K, 0.0025),
        ];
        for (format, bound) in bound {
            for n in [1, 31, 256, 1000, 40_000] {
                let v = values(n);
                let stored = format.quantize(&v, None).unwrap();
                assert_eq!(stored.len(), format.stored_len(n), "{format} n={n}");
                let back = format.round_trip(&v).unwrap();
                let worst = v
                    .iter()
                    .zip(&back)
                    .fold(0f32, |m, (a, b)| m.max((a - b).abs()));
                assert!(worst < bound, "{format} n={n}: {worst}");
                // A block of one value can land on a level; a long run cannot.
                assert!(n < 256 || worst > 0.0, "{format} n={n} came back exact");
            }
            assert_eq!(format.name().parse::<BlockFormat>().unwrap(), format);
            assert_eq!(
                format.ggml().and_then(BlockFormat::from_ggml),
                format.ggml().map(|_| format)
            );
        }
        assert!("q8_1".parse::<BlockFormat>().unwrap_err().contains("q6_k"));
        assert_eq!(BlockFormat::from_ggml(GgmlDType::F16), None);
    }

    #[test]
    fn runs_of_whole_blocks_quantize_and_decode_alone() {
        for format in BlockFormat::ALL
            .into_iter()
            .filter(|f| !f.needs_weight_offset())
        {
            let v = values(format.block_values() * 5 + 3);
            let whole = format.quantize(&v, None).unwrap();
            let cut = format.block_values() * 2;
            let mut parts = format.quantize(&v[..cut], None).unwrap();
            parts.extend(format.quantize(&v[cut..], None).unwrap());
            assert_eq!(parts, whole, "{format}");
            // A run read at an odd address decodes as an aligned one.
            let mut odd = vec![0u8; whole.len() + 1];
            odd[1..].copy_from_slice(&whole);
            let (mut a, mut b) = (vec![0f32; v.len()], vec![0f32; v.len()]);
            format.decode(&whole, &mut a).unwrap();
            format.decode(&odd[1..], &mut b).unwrap();
            assert_eq!(a, b, "{format}");
            assert!(format.decode(&whole[1..], &mut a).is_err());
        }
    }

    #[test]
    fn any_run_of_values_decodes_as_the_whole_weight_does() {
        for format in BlockFormat::ALL {
            // Three stored blocks and a tail, read in runs that start and end off the
            // blocks' boundaries, inside one block and across several.
            let len = format.block_values() * 3 + 37;
            let v = values(len);
            let stored = format.quantize(&v, None).unwrap();
            let mut whole = vec![0f32; len];
            format.decode(&stored, &mut whole).unwrap();
            let per = format.block_values();
            for (start, n) in [
                (0, len),
                (1, 5),
                (per - 3, 7),
                (per + 11, 2 * per),
                (len - 9, 9),
            ] {
                let mut out = vec![f32::NAN; n];
                format.decode_values(&stored, len, start, &mut out).unwrap();
                assert_eq!(out, whole[start..start + n], "{format} {start}+{n}");
            }
            let mut past = vec![0f32; 2];
            assert!(format
                .decode_values(&stored, len, len - 1, &mut past)
                .is_err());
            assert!(format
                .decode_values(&stored[1..], len, 0, &mut past)
                .is_err());
        }
    }

    #[test]
    fn a_tensor_decodes_from_its_own_bytes_within_a_larger_storage() {
        let format = BlockFormat::Q8_0;
        let (rows, width) = (3, 2 * format.block_values());
        let v = values(rows * width);
        let stored = format.quantize(&v, None).unwrap();
        let mut whole = vec![0f32; v.len()];
        format.decode(&stored, &mut whole).unwrap();
        // The stored bytes behind 5 bytes of another tensor's, read as a narrowed view.
        let mut buffer = vec![7u8; 5];
        buffer.extend_from_slice(&stored);
        let buffer = Tensor::from_vec(buffer, 5 + stored.len(), &Device::Cpu).unwrap();
        let view = buffer.narrow(0, 5, stored.len()).unwrap();
        let decoded = format
            .decode_tensor(&view, &Shape::from((rows, width)))
            .unwrap();
        assert_eq!(
            decoded.flatten_all().unwrap().to_vec1::<f32>().unwrap(),
            whole
        );
        // Bytes that are not one run within their storage are refused, not misread.
        let strided = buffer
            .narrow(0, 1, 10)
            .unwrap()
            .reshape((5, 2))
            .unwrap()
            .t()
            .unwrap();
        assert!(with_stored_bytes(&strided, |b| Ok(b.len())).is_err());
    }
}
