//! Writing files so that a crash never leaves a half one under the real name: write a
//! temporary file, flush it to disk, rename it over the real name, flush the directory.

use super::CheckpointError;
use serde_json::{json, Map, Value};
use std::collections::BTreeMap;
use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};

/// `path` with `.tmp` appended: where a file is written before it is renamed into place.
pub(crate) fn temporary(path: &Path) -> PathBuf {
    let mut name = path.file_name().unwrap_or_default().to_os_string();
    name.push(".tmp");
    path.with_file_name(name)
}

/// The length and CRC-32 of the file at `path`, read in chunks.
pub(crate) fn checksum(path: &Path) -> Result<(u64, u32), CheckpointError> {
    let mut file = File::open(path).map_err(CheckpointError::io(path))?;
    let mut hasher = crc32fast::Hasher::new();
    let mut buf = vec![0u8; 1 << 20];
    let mut len = 0u64;
    loop {
        let n = std::io::Read::read(&mut file, &mut buf).map_err(CheckpointError::io(path))?;
        if n == 0 {
            return Ok((len, hasher.finalize()));
        }
        hasher.update(&buf[..n]);
        len += n as u64;
    }
}

/// Makes a rename inside `dir` durable.
pub(crate) fn sync_dir(dir: &Path) -> Result<(), CheckpointError> {
    // A bare file name's parent is "": the current directory.
    let dir = if dir.as_os_str().is_empty() {
        Path::new(".")
    } else {
        dir
    };
    File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(CheckpointError::io(dir))
}

/// Writes `path` atomically: `write` fills a temporary file, which is synced and renamed.
pub(crate) fn write_atomic(
    path: &Path,
    write: impl FnOnce(&mut BufWriter<File>) -> Result<(), CheckpointError>,
) -> Result<(), CheckpointError> {
    let tmp = temporary(path);
    let file = File::create(&tmp).map_err(CheckpointError::io(&tmp))?;
    let mut out = BufWriter::new(file);
    let written = write(&mut out).and_then(|()| {
        let file = out.into_inner().map_err(|e| CheckpointError::Io {
            path: tmp.clone(),
            cause: e.into_error(),
        })?;
        file.sync_all().map_err(CheckpointError::io(&tmp))
    });
    if let Err(e) = written {
        let _ = std::fs::remove_file(&tmp);
        return Err(e);
    }
    std::fs::rename(&tmp, path).map_err(CheckpointError::io(path))?;
    if let Some(dir) = path.parent() {
        sync_dir(dir)?;
    }
    Ok(())
}

/// A writer that counts and checksums the bytes it passes on, so that a file's length and
/// CRC-32 come without reading it back.
struct Checksummed<W> {
    inner: W,
    hasher: crc32fast::Hasher,
    bytes: u64,
}

impl<W: Write> Write for Checksummed<W> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let n = self.inner.write(buf)?;
        self.hasher.update(&buf[..n]);
        self.bytes += n as u64;
        Ok(n)
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.inner.flush()
    }
}

/// `values` as little-endian bytes, written in blocks (no per-element allocation).
fn write_f32(out: &mut impl Write, values: &[f32]) -> std::io::Result<()> {
    let mut block = Vec::with_capacity(1 << 16);
    for chunk in values.chunks(1 << 14) {
        block.clear();
        block.extend(chunk.iter().flat_map(|v| v.to_le_bytes()));
        out.write_all(&block)?;
    }
    Ok(())
}

/// Writes a safetensors file of f32 tensors one at a time: `tensors` gives every name and
/// shape up front (the header comes first), then `data(i)` yields tensor `i`'s elements,
/// so at most one tensor is in memory. Any safetensors reader (candle, Python) reads it.
/// Returns the file's length and CRC-32, computed as it was written.
pub(crate) fn write_safetensors(
    path: &Path,
    tensors: &[(String, Vec<usize>)],
    metadata: &BTreeMap<String, String>,
    mut data: impl FnMut(usize) -> Result<Vec<f32>, CheckpointError>,
) -> Result<(u64, u32), CheckpointError> {
    let mut header = Map::new();
    if !metadata.is_empty() {
        header.insert("__metadata__".into(), json!(metadata));
    }
    let mut offset = 0usize;
    for (name, shape) in tensors {
        let bytes = shape.iter().product::<usize>() * 4;
        header.insert(
            name.clone(),
            json!({"dtype": "F32", "shape": shape, "data_offsets": [offset, offset + bytes]}),
        );
        offset += bytes;
    }
    let mut header = Value::Object(header).to_string().into_bytes();
    // The data starts 8-byte aligned; the format allows trailing spaces in the header.
    header.resize(header.len().div_ceil(8) * 8, b' ');
    let mut record = (0, 0);
    write_atomic(path, |out| {
        let io = CheckpointError::io(path);
        let out = &mut Checksummed {
            inner: out,
            hasher: crc32fast::Hasher::new(),
            bytes: 0,
        };
        out.write_all(&(header.len() as u64).to_le_bytes())
            .and_then(|()| out.write_all(&header))
            .map_err(io)?;
        for (i, (name, shape)) in tensors.iter().enumerate() {
            let values = data(i)?;
            let expected = shape.iter().product::<usize>();
            if values.len() != expected {
                return Err(CheckpointError::Mismatch {
                    path: path.to_path_buf(),
                    message: format!(
                        "tensor '{name}': {} elements produced for shape {shape:?}",
                        values.len()
                    ),
                });
            }
            write_f32(out, &values).map_err(CheckpointError::io(path))?;
        }
        record = (out.bytes, out.hasher.clone().finalize());
        Ok(())
    })?;
    Ok(record)
}

/// Makes the checkpoint root `root` and checks that a file can be created in it, so that a
/// root that cannot be written fails before training rather than at the first save.
pub(crate) fn check_writable(root: &Path) -> Result<(), CheckpointError> {
    std::fs::create_dir_all(root).map_err(CheckpointError::io(root))?;
    let probe = root.join(".wick-write-check");
    File::create(&probe).map_err(CheckpointError::io(root))?;
    std::fs::remove_file(&probe).map_err(CheckpointError::io(&probe))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_bare_file_name_syncs_the_current_directory() {
        // `wick consolidate ck/last model.safetensors` writes into the current directory,
        // whose name as the file's parent is "".
        let parent = Path::new("model.safetensors").parent().unwrap();
        assert_eq!(parent, Path::new(""));
        sync_dir(parent).unwrap();
    }
}
