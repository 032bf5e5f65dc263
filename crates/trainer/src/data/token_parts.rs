//! The tensors of a token file and their writing: each [`Part`] streamed block by block
//! into one safetensors file, under a temporary name renamed when whole.

use crate::TrainerError;
use safetensors::tensor::{Metadata, TensorInfo};
use safetensors::Dtype;
use std::collections::HashMap;
use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::Path;

/// The bytes of one tensor, a block at a time.
pub(crate) type Chunks<'a> = Box<dyn Iterator<Item = std::io::Result<Vec<u8>>> + 'a>;

pub(crate) fn once<'a>(bytes: Vec<u8>) -> Chunks<'a> {
    Box::new(std::iter::once(Ok(bytes)))
}

/// One tensor of a token file: its name, dtype, element count and bytes.
pub(crate) struct Part<'a> {
    name: &'static str,
    dtype: Dtype,
    len: usize,
    bytes: Chunks<'a>,
}

impl<'a> Part<'a> {
    pub(crate) fn new(name: &'static str, dtype: Dtype, len: usize, bytes: Chunks<'a>) -> Self {
        Part {
            name,
            dtype,
            len,
            bytes,
        }
    }

    /// A split's ids (the tensor `name`), u16 when `narrow`.
    pub(crate) fn ids(name: &'static str, narrow: bool, len: usize, bytes: Chunks<'a>) -> Self {
        let dtype = if narrow { Dtype::U16 } else { Dtype::U32 };
        Part::new(name, dtype, len, bytes)
    }
}

/// `ids` as u16 when `narrow`, else u32, little-endian.
pub(crate) fn id_bytes(ids: &[u32], narrow: bool) -> Vec<u8> {
    match narrow {
        true => ids.iter().flat_map(|&i| (i as u16).to_le_bytes()).collect(),
        false => ids.iter().flat_map(|&i| i.to_le_bytes()).collect(),
    }
}

pub(crate) fn io_error(path: &Path, cause: std::io::Error) -> TrainerError {
    TrainerError::Io {
        path: path.to_path_buf(),
        cause,
    }
}

/// Writes a safetensors file of `parts` streamed block by block: the header made by the
/// safetensors crate's own `Metadata` (its keys sorted, so that the same tokens give the same
/// bytes), the tensors in descending alignment then by name, as safetensors orders them.
pub(crate) fn write_parts(
    path: &Path,
    mut parts: Vec<Part>,
    metadata: HashMap<String, String>,
) -> Result<(), TrainerError> {
    let io = |cause| io_error(path, cause);
    let other = |e: String| io(std::io::Error::other(e));
    parts.sort_by_key(|p| (std::cmp::Reverse(p.dtype.bitsize()), p.name));
    let mut offset = 0;
    let infos = (parts.iter())
        .map(|p| {
            let size = p.len * p.dtype.bitsize() / 8;
            let info = TensorInfo {
                dtype: p.dtype,
                shape: vec![p.len],
                data_offsets: (offset, offset + size),
            };
            offset += size;
            (p.name.to_string(), info)
        })
        .collect();
    let header = Metadata::new(Some(metadata), infos).map_err(|e| other(e.to_string()))?;
    // Through a Value, whose maps keep their keys sorted.
    let value = serde_json::to_value(&header).map_err(|e| other(e.to_string()))?;
    let mut header = serde_json::to_vec(&value).map_err(|e| other(e.to_string()))?;
    header.resize(header.len().next_multiple_of(8), b' ');
    let tmp = path.with_extension("tmp");
    let write = || -> std::io::Result<()> {
        let mut out = BufWriter::new(File::create(&tmp)?);
        out.write_all(&(header.len() as u64).to_le_bytes())?;
        out.write_all(&header)?;
        for part in parts {
            for block in part.bytes {
                out.write_all(&block?)?;
            }
        }
        out.into_inner().map_err(|e| e.into_error())?.sync_all()
    };
    if let Err(e) = write() {
        let _ = std::fs::remove_file(&tmp);
        return Err(io(e));
    }
    std::fs::rename(&tmp, path).map_err(io)
}
