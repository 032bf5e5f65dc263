//! `GgufWeights`: a GGUF file's tensors as a [`WeightSource`] under Hugging Face's names,
//! each dequantized to f32 by Candle's `quantized` module (every type it reads) and put
//! back in Hugging Face's layout when a parameter asks for it; or, for a QLoRA base kept as
//! read, a weight's own blocks, its rows put back in Hugging Face's order.

use super::architecture::{gguf_name, Layout};
use crate::ModelConfig;
use candle_core::quantized::gguf_file::Content;
use candle_core::{Device, Result, Shape, Tensor};
use std::ops::Range;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use wick_core::{BlockFormat, BlockRead, WeightSource};

/// A GGUF file, its metadata read, its tensors read when asked for.
pub struct GgufWeights {
    path: PathBuf,
    content: Content,
    config: ModelConfig,
    /// The last tensor read whole (a sharded load reads one tensor in slices, one after
    /// another).
    last: Mutex<Option<WholeTensor>>,
}

/// A tensor read whole, under its Hugging Face name.
struct WholeTensor {
    name: String,
    dims: Vec<usize>,
    values: Vec<f32>,
}

impl GgufWeights {
    /// The tensors of the file at `path`, whose metadata `content` holds, for a model of
    /// `config`.
    pub(crate) fn new(path: &Path, content: Content, config: ModelConfig) -> Self {
        GgufWeights {
            path: path.to_path_buf(),
            content,
            config,
            last: Mutex::new(None),
        }
    }

    /// The tensor `name` (a GGUF name) dequantized to f32, in the file's layout.
    pub fn dequantized(&self, name: &str) -> Result<Tensor> {
        let mut file = std::fs::File::open(&self.path)?;
        self.content
            .tensor(&mut file, name, &Device::Cpu)?
            .dequantize(&Device::Cpu)
    }

    /// The Hugging Face tensor `name`, whole, in f32.
    fn whole(&self, name: &str) -> Result<WholeTensor> {
        let Some((gguf, layout)) = gguf_name(&self.config, name) else {
            candle_core::bail!("{}: no GGUF tensor for {name}", self.path.display())
        };
        if !self.content.tensor_infos.contains_key(&gguf) {
            candle_core::bail!(
                "{}: has no {gguf} (the model's {name})",
                self.path.display()
            )
        }
        let t = layout.to_hf(self.dequantized(&gguf)?)?;
        Ok(WholeTensor {
            name: name.to_string(),
            dims: t.dims().to_vec(),
            values: t.flatten_all()?.to_vec1()?,
        })
    }

    /// The GGUF name, layout and block form of the Hugging Face weight `name`, where the
    /// file holds it in blocks wick keeps and its layout moves whole rows (each row whole
    /// blocks, as ggml stores a quantized matrix).
    fn blocks_of(&self, name: &str) -> Option<(String, Layout, BlockFormat)> {
        let (gguf, layout) = gguf_name(&self.config, name)?;
        let info = self.content.tensor_infos.get(&gguf)?;
        let format = BlockFormat::from_ggml(info.ggml_dtype)?;
        let whole_rows = match info.shape.dims() {
            [_, cols] => cols.is_multiple_of(format.block_values()),
            _ => false,
        };
        let moves_rows = matches!(layout, Layout::Same | Layout::Permuted(_));
        (whole_rows && moves_rows).then_some((gguf, layout, format))
    }
}

impl WeightSource for GgufWeights {
    fn read(&self, name: &str, shape: &Shape, range: Range<usize>) -> Result<Vec<f32>> {
        let mut last = self.last.lock().unwrap_or_else(|e| e.into_inner());
        if last.as_ref().map(|t| t.name.as_str()) != Some(name) {
            *last = Some(self.whole(name)?);
        }
        let WholeTensor { dims, values, .. } = last.as_ref().expect("read above");
        if dims != shape.dims() || range.end > values.len() {
            candle_core::bail!(
                "{}: {name} is {dims:?}, not the {shape:?} the model asks for",
                self.path.display()
            )
        }
        Ok(values[range].to_vec())
    }

    fn block_format(&self, name: &str) -> Option<BlockFormat> {
        self.blocks_of(name).map(|(_, _, format)| format)
    }

    fn read_blocks(&self, read: &BlockRead<'_>) -> Result<Option<Vec<u8>>> {
        let BlockRead {
            name,
            shape,
            format,
            ref range,
        } = *read;
        let Some((gguf, layout, held)) = self.blocks_of(name).filter(|b| b.2 == format) else {
            return Ok(None);
        };
        let mut file = std::fs::File::open(&self.path)?;
        let q = self.content.tensor(&mut file, &gguf, &Device::Cpu)?;
        if q.shape() != shape {
            candle_core::bail!(
                "{}: {name} is {:?}, not the {shape:?} the model asks for",
                self.path.display(),
                q.shape()
            )
        }
        let bytes = q.data()?;
        let rows = shape.dims()[0];
        let row_bytes = bytes.len() / rows.max(1);
        let order = layout.hf_rows(rows)?.expect("blocks_of keeps row layouts");
        let (bv, bb) = (held.block_values(), held.block_bytes());
        let (first, end) = (range.start / bv * bb, range.end.div_ceil(bv) * bb);
        let mut out = Vec::with_capacity(end - first);
        for (hf_row, file_row) in order.into_iter().enumerate() {
            let at = hf_row * row_bytes;
            let (a, b) = (first.max(at), end.min(at + row_bytes));
            if a < b {
                let from = file_row * row_bytes;
                out.extend_from_slice(&bytes[from + a - at..from + b - at]);
            }
        }
        Ok(Some(out))
    }
}
