//! A safetensors file mapped into memory, read a range of one tensor at a time.
//!
//! The header is parsed and validated once at open (by the `safetensors` crate: header
//! length, JSON, every tensor's offsets contiguous, sized by its shape and dtype, and ending
//! exactly at the file's end), so no later read trusts a size or an offset the file gives.

use crate::FileError;
use memmap2::Mmap;
use safetensors::tensor::{Dtype, Metadata, TensorInfo};
use safetensors::SafeTensors;
use std::collections::HashMap;
use std::fs::File;
use std::ops::Range;
use std::path::{Path, PathBuf};

/// An open, validated safetensors file.
pub struct SafetensorsFile {
    path: PathBuf,
    /// The file itself, for the reads that stay out of the map
    /// ([`SafetensorsFile::read_f32`], [`SafetensorsFile::read_offsets`]).
    #[cfg_attr(not(unix), allow(dead_code))]
    file: File,
    mmap: Mmap,
    data_start: usize,
    metadata: Metadata,
}

impl SafetensorsFile {
    /// Maps `path` and validates its header against the file's length.
    pub fn open(path: impl AsRef<Path>) -> Result<Self, FileError> {
        let path = path.as_ref().to_path_buf();
        let file = File::open(&path).map_err(|e| FileError::new(&path, None, e.to_string()))?;
        // SAFETY: the map is read-only; wick never writes a file it has open for reading
        // (checkpoints are written under temporary names and renamed).
        let mmap = unsafe { Mmap::map(&file) }
            .map_err(|e| FileError::new(&path, None, format!("cannot map: {e}")))?;
        let (header_len, metadata) = SafeTensors::read_metadata(&mmap).map_err(|e| {
            FileError::new(&path, None, format!("not a valid safetensors file: {e}"))
        })?;
        Ok(SafetensorsFile {
            path,
            file,
            mmap,
            data_start: 8 + header_len,
            metadata,
        })
    }

    /// Tells the kernel the file is read at random places (`madvise(MADV_RANDOM)`): a read
    /// brings in the pages it touches, not the megabytes around them that sequential
    /// read-ahead would map, so reading windows of a corpus larger than memory keeps few
    /// pages of it resident. A kernel that declines the advice costs nothing but that.
    pub fn advise_random_reads(&self) {
        #[cfg(unix)]
        let _ = self.mmap.advise(memmap2::Advice::Random);
    }

    /// The file's path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The tensor names, in file order.
    pub fn names(&self) -> Vec<String> {
        self.metadata.offset_keys()
    }

    /// The `__metadata__` strings of the header.
    pub fn metadata(&self) -> Option<&HashMap<String, String>> {
        self.metadata.metadata().as_ref()
    }

    fn info(&self, name: &str) -> Result<&TensorInfo, FileError> {
        self.metadata
            .info(name)
            .ok_or_else(|| FileError::new(&self.path, Some(name), "no such tensor in the file"))
    }

    /// The shape of tensor `name`.
    pub fn shape(&self, name: &str) -> Result<Vec<usize>, FileError> {
        Ok(self.info(name)?.shape.clone())
    }

    /// The bytes of elements `range` of tensor `name`, whose dtype must be one of `dtypes`
    /// (named `expected` in the error); returns them with the dtype.
    fn bytes(
        &self,
        name: &str,
        range: Range<usize>,
        dtypes: &[Dtype],
        expected: &str,
    ) -> Result<(&[u8], Dtype), FileError> {
        let (at, dtype) = self.locate(name, range, dtypes, expected)?;
        Ok((&self.mmap[at], dtype))
    }

    /// Where elements `range` of tensor `name` lie in the file, checked: the tensor exists,
    /// has one of `dtypes` (`expected` names them) and holds the range.
    fn locate(
        &self,
        name: &str,
        range: Range<usize>,
        dtypes: &[Dtype],
        expected: &str,
    ) -> Result<(Range<usize>, Dtype), FileError> {
        let info = self.info(name)?;
        let numel: usize = info.shape.iter().product();
        if range.start > range.end || range.end > numel {
            return Err(FileError::new(
                &self.path,
                Some(name),
                format!("elements {range:?} asked of a tensor of {numel}"),
            ));
        }
        if !dtypes.contains(&info.dtype) {
            return Err(FileError::new(
                &self.path,
                Some(name),
                format!("dtype {:?}, expected {expected}", info.dtype),
            ));
        }
        let size = info.dtype.bitsize() / 8;
        // Offsets were validated against the file length at open.
        let start = self.data_start + info.data_offsets.0 + range.start * size;
        Ok((start..start + range.len() * size, info.dtype))
    }

    /// Elements `range` of tensor `name` (row-major), converted to f32 from f32, f16 or
    /// bf16. Errors name the file and tensor: missing, another dtype, range out of bounds.
    /// Read from the file rather than the map: a model's weights are read once, when its
    /// parameters are made, and none of their pages stays in the process's resident set
    /// for the rest of the run.
    pub fn read_f32(&self, name: &str, range: Range<usize>) -> Result<Vec<f32>, FileError> {
        let floats = [Dtype::F32, Dtype::F16, Dtype::BF16];
        let (at, dtype) = self.locate(name, range, &floats, "F32, F16 or BF16")?;
        let bytes = self.read_at(name, at)?;
        Ok(match dtype {
            Dtype::F32 => bytes
                .chunks_exact(4)
                .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
                .collect(),
            Dtype::F16 => bytes
                .chunks_exact(2)
                .map(|b| half::f16::from_le_bytes([b[0], b[1]]).to_f32())
                .collect(),
            _ => bytes
                .chunks_exact(2)
                .map(|b| half::bf16::from_le_bytes([b[0], b[1]]).to_f32())
                .collect(),
        })
    }

    /// Elements `range` of the integer tensor `name` (token ids, masks), from u8, u16 or
    /// u32.
    pub fn read_u32(&self, name: &str, range: Range<usize>) -> Result<Vec<u32>, FileError> {
        let ints = [Dtype::U8, Dtype::U16, Dtype::U32];
        let (bytes, dtype) = self.bytes(name, range, &ints, "U8, U16 or U32")?;
        Ok(match dtype {
            Dtype::U8 => bytes.iter().map(|&b| b as u32).collect(),
            Dtype::U16 => bytes
                .chunks_exact(2)
                .map(|b| u16::from_le_bytes([b[0], b[1]]) as u32)
                .collect(),
            _ => bytes
                .chunks_exact(4)
                .map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
                .collect(),
        })
    }

    /// Elements `range` of the i64 tensor `name` (offsets into another tensor, as Candle,
    /// NumPy and PyTorch all read them), each checked to be at least 0. Read from the file
    /// rather than the map: a pass over every document's start (packing plans one when a
    /// fit opens a corpus) leaves none of its pages in the process's resident set.
    pub fn read_offsets(&self, name: &str, range: Range<usize>) -> Result<Vec<u64>, FileError> {
        let (at, _) = self.locate(name, range, &[Dtype::I64], "I64")?;
        let bytes = self.read_at(name, at)?;
        (bytes.chunks_exact(8))
            .map(|b| u64::try_from(i64::from_le_bytes(b.try_into().expect("8 bytes"))))
            .collect::<Result<_, _>>()
            .map_err(|_| FileError::new(&self.path, Some(name), "a negative offset"))
    }

    /// The bytes `at` of the file (tensor `name`'s), read from the file where the system
    /// allows it, so that none of their pages is mapped into the process.
    fn read_at(
        &self,
        name: &str,
        at: Range<usize>,
    ) -> Result<std::borrow::Cow<'_, [u8]>, FileError> {
        #[cfg(unix)]
        {
            let mut bytes = vec![0u8; at.len()];
            read_exact_at(&self.file, &mut bytes, at.start as u64)
                .map_err(|e| FileError::new(&self.path, Some(name), format!("cannot read: {e}")))?;
            Ok(std::borrow::Cow::Owned(bytes))
        }
        #[cfg(not(unix))]
        {
            let _ = name;
            Ok(std::borrow::Cow::Borrowed(&self.mmap[at]))
        }
    }

    /// The dtype of tensor `name`, as safetensors names it (`F32`, `U16`, ...).
    pub fn dtype(&self, name: &str) -> Result<String, FileError> {
        Ok(format!("{:?}", self.info(name)?.dtype))
    }
}

/// Fills `buf` from `file` at `offset`, leaving the file's cursor alone (ranks share it).
#[cfg(unix)]
fn read_exact_at(file: &File, buf: &mut [u8], offset: u64) -> std::io::Result<()> {
    std::os::unix::fs::FileExt::read_exact_at(file, buf, offset)
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::{Device, Tensor};

    #[test]
    fn reads_a_range_of_a_candle_written_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("a.safetensors");
        let t = Tensor::arange(0f32, 12f32, &Device::Cpu)
            .unwrap()
            .reshape((3, 4))
            .unwrap();
        t.save_safetensors("w", &path).unwrap();
        let f = SafetensorsFile::open(&path).unwrap();
        assert_eq!(f.shape("w").unwrap(), vec![3, 4]);
        assert_eq!(f.read_f32("w", 5..8).unwrap(), vec![5.0, 6.0, 7.0]);
        let err = f.read_f32("w", 10..13).unwrap_err().to_string();
        assert!(
            err.contains("a.safetensors") && err.contains("'w'"),
            "{err}"
        );
        let err = f.read_f32("v", 0..1).unwrap_err().to_string();
        assert!(
            err.contains("'v'") && err.contains("no such tensor"),
            "{err}"
        );
    }
}
