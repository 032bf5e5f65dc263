//! Where a new parameter's values come from: candle-nn's initializer, or pretrained weights
//! read a slice at a time, so that under sharding no rank ever holds a full parameter.

use crate::{BlockFormat, FileError, SafetensorsFile};
use candle_core::Shape;
use candle_nn::Init;
use std::ops::Range;
use std::path::Path;
use std::sync::Arc;

/// Values of parameters by name, served a range of elements at a time.
pub trait WeightSource: Send + Sync {
    /// Elements `range` (row-major) of parameter `name`, after checking the source holds it
    /// with shape `shape`.
    fn read(&self, name: &str, shape: &Shape, range: Range<usize>)
        -> candle_core::Result<Vec<f32>>;

    /// The block form the source holds parameter `name` in, where it holds it quantized in
    /// one wick keeps (a GGUF file's own blocks, in the layout the model asks for). `None`,
    /// the default: the source serves values only.
    fn block_format(&self, name: &str) -> Option<BlockFormat> {
        let _ = name;
        None
    }

    /// The stored blocks `read` asks for, as the source holds them, when it holds the
    /// parameter in the form asked for ([`WeightSource::block_format`]); `None` otherwise,
    /// the default.
    fn read_blocks(&self, read: &BlockRead<'_>) -> candle_core::Result<Option<Vec<u8>>> {
        let _ = read;
        Ok(None)
    }
}

/// What [`WeightSource::read_blocks`] reads: the stored blocks in `format` that hold
/// elements `range` of parameter `name` (row-major, of shape `shape`; `range` starts at a
/// block boundary and ends at one or at the last element).
#[derive(Debug, Clone)]
pub struct BlockRead<'a> {
    /// The parameter's full name.
    pub name: &'a str,
    /// Its shape, as the model asks for it.
    pub shape: &'a Shape,
    /// The form of the blocks.
    pub format: BlockFormat,
    /// The elements the blocks hold.
    pub range: Range<usize>,
}

/// How a new parameter's values are made.
#[derive(Clone)]
pub enum ParamInit {
    /// candle-nn's initializer (strategies draw it counter-based, any slice on its own).
    Init(Init),
    /// Read from pretrained weights.
    Weights(Arc<dyn WeightSource>),
}

/// Full weights in safetensors files (a consolidated wick checkpoint, or any candle
/// compatible weights), memory-mapped: a rank reads only the slices it keeps.
pub struct PretrainedWeights {
    files: Vec<SafetensorsFile>,
}

impl PretrainedWeights {
    /// Opens and validates `paths` (one file, or the files of a model split in several);
    /// a name is looked up in each file in turn.
    pub fn open<P: AsRef<Path>>(paths: &[P]) -> Result<Self, FileError> {
        let files = paths
            .iter()
            .map(SafetensorsFile::open)
            .collect::<Result<_, _>>()?;
        Ok(PretrainedWeights { files })
    }
}

impl WeightSource for PretrainedWeights {
    fn read(
        &self,
        name: &str,
        shape: &Shape,
        range: Range<usize>,
    ) -> candle_core::Result<Vec<f32>> {
        let Some(file) = self.files.iter().find(|f| f.shape(name).is_ok()) else {
            let files: Vec<_> = self.files.iter().map(|f| f.path().display()).collect();
            candle_core::bail!("pretrained weights: tensor '{name}' is in none of {files:?}")
        };
        let saved = file.shape(name)?;
        if saved != shape.dims() {
            return Err(FileError::new(
                file.path(),
                Some(name),
                format!("shape {saved:?}, the model asks for {:?}", shape.dims()),
            )
            .into());
        }
        Ok(file.read_f32(name, range)?)
    }
}
