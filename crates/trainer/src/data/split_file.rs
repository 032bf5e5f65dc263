//! One split of one token file as windows: the tokens one after another, or whole
//! documents placed by best-fit decreasing ([`Packing`]). [`crate::TokenDataset`] serves
//! the windows of one or several such files as one dataset.

use crate::checkpoint::CheckpointError;
use crate::data::document_plan::DocumentPlan;
use crate::data::packing::Packing;
use crate::data::token_file::{Split, PAIRS_KEY, PAIRS_VALUE, TOKENIZER_KEY, VOCAB_KEY};
use crate::TrainerError;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use wick_core::{FileError, SafetensorsFile, IGNORE_INDEX};

/// The windows of one split of one token file, memory-mapped, as its [`Packing`] lays them:
/// under `Concat`, window i is tokens `i * seq .. i * seq + seq + 1` (every token but the
/// first a target exactly once); under `Documents` and `Padded`, whole documents, each its
/// own inputs and targets, positions restarting at each, the rest of the window padding
/// that is not counted. A [`DataLoader`](crate::DataLoader) orders the windows (seeded) and
/// resumes from a checkpoint's data position as for any dataset.
#[derive(Clone)]
pub(crate) struct SplitFile {
    file: Arc<SafetensorsFile>,
    split: Split,
    seq: usize,
    windows: Windows,
    /// The file holds the split's mask (instruction data).
    masked: bool,
}

/// Where a dataset's windows come from.
#[derive(Clone)]
enum Windows {
    /// Window i starts at token `i * seq`; this many windows.
    Concat(usize),
    /// Whole documents, as the plan places them.
    Documents(DocumentPlan),
}

fn file_error(path: &Path, tensor: Option<&str>, message: String) -> TrainerError {
    TrainerError::Checkpoint(CheckpointError::File(FileError::new(path, tensor, message)))
}

impl SplitFile {
    /// Split `split` of the token file `path`, in windows of `seq + 1` tokens, packed as
    /// `packing` says or (`None`) as the data's convention has it: [`Packing::Documents`]
    /// for instruction data whose file records its examples' starts, [`Packing::Concat`]
    /// otherwise. Also its tokens.
    pub(crate) fn open(
        path: &Path,
        split: Split,
        seq: usize,
        packing: Option<Packing>,
    ) -> Result<(Self, usize), TrainerError> {
        let file = SafetensorsFile::open(path).map_err(CheckpointError::File)?;
        // Windows are read at random places: no read-ahead around each.
        file.advise_random_reads();
        let tokens = checked_tokens(&file, split)?;
        let masked = file.names().iter().any(|n| n == split.mask_name());
        let has_starts = file.names().iter().any(|n| n == split.starts_name());
        if seq == 0 {
            return Err(TrainerError::config(
                "seq",
                "must be at least 1 token, got 0",
            ));
        }
        let default = match masked && has_starts {
            true => Packing::Documents,
            false => Packing::Concat,
        };
        let windows = match packing.unwrap_or(default) {
            Packing::Concat => Windows::Concat(tokens.saturating_sub(1) / seq),
            packing => {
                if !has_starts {
                    return Err(file_error(
                        path,
                        Some(split.starts_name()),
                        format!(
                            "--packing {} needs the documents' starts, which this file does not \
                         record: run wick prepare again",
                            packing.name()
                        ),
                    ));
                }
                let plan = DocumentPlan::new(&file, split, tokens, seq, packing)
                    .map_err(CheckpointError::File)?;
                Windows::Documents(plan)
            }
        };
        let file = SplitFile {
            file: Arc::new(file),
            split,
            seq,
            windows,
            masked,
        };
        Ok((file, tokens))
    }

    /// The number of windows.
    pub(crate) fn len(&self) -> usize {
        match &self.windows {
            Windows::Concat(n) => *n,
            Windows::Documents(plan) => plan.len(),
        }
    }

    /// Whether the split has a mask: some targets may not count.
    pub(crate) fn is_masked(&self) -> bool {
        self.masked
    }

    /// Whether its documents are preference pairs ([`PAIRS_KEY`]).
    pub(crate) fn is_paired(&self) -> bool {
        self.meta(PAIRS_KEY) == Some(PAIRS_VALUE)
    }

    /// How the windows are laid out.
    pub(crate) fn packing(&self) -> Packing {
        match &self.windows {
            Windows::Concat(_) => Packing::Concat,
            Windows::Documents(plan) => plan.packing(),
        }
    }

    /// How many documents were longer than a window and cut to it (0 under `Concat`).
    pub(crate) fn truncated(&self) -> usize {
        match &self.windows {
            Windows::Concat(_) => 0,
            Windows::Documents(plan) => plan.truncated(),
        }
    }

    /// The input positions of all windows that hold a document's token, and all of them:
    /// what is not padding (every position under `Concat`).
    pub(crate) fn fill(&self) -> (usize, usize) {
        let all = self.len() * self.seq;
        match &self.windows {
            Windows::Concat(_) => (all, all),
            Windows::Documents(plan) => (plan.used(), all),
        }
    }

    /// The documents of window `i`, (first token, tokens) each; `None` under `Concat`.
    pub(crate) fn documents_of(&self, i: usize) -> candle_core::Result<Option<Vec<(u64, usize)>>> {
        match &self.windows {
            Windows::Concat(_) => Ok(None),
            Windows::Documents(plan) => Ok(Some(plan.window(&self.file, i)?)),
        }
    }

    /// The file.
    pub(crate) fn path(&self) -> &Path {
        self.file.path()
    }

    /// A metadata value of the file.
    fn meta(&self, key: &str) -> Option<&str> {
        self.file
            .metadata()
            .and_then(|m| m.get(key))
            .map(String::as_str)
    }

    /// Checks the file was made by the tokenizer whose hash is `hash`, for a model of
    /// `vocab_size` ids.
    pub(crate) fn check(&self, hash: &str, vocab_size: usize) -> Result<(), TrainerError> {
        let path: PathBuf = self.path().to_path_buf();
        match self.meta(TOKENIZER_KEY) {
            Some(h) if h == hash => {}
            Some(h) => {
                return Err(file_error(
                    &path,
                    None,
                    format!(
                        "made by another tokenizer (hash {h}) than the model's ({hash}); run wick \
                     prepare again with the model's tokenizer.json"
                    ),
                ))
            }
            None => {
                return Err(file_error(
                    &path,
                    None,
                    format!("has no '{TOKENIZER_KEY}' metadata: not a wick token file"),
                ))
            }
        }
        let file_vocab: usize = self
            .meta(VOCAB_KEY)
            .and_then(|v| v.parse().ok())
            .ok_or_else(|| file_error(&path, None, format!("has no '{VOCAB_KEY}' metadata")))?;
        if file_vocab > vocab_size {
            return Err(file_error(&path, None, format!(
                "its tokenizer has {file_vocab} ids, more than the model's vocabulary of {vocab_size}"
            )));
        }
        Ok(())
    }
}

/// The number of tokens of `split` in `file`, checked: one dimension of u16 or u32 ids,
/// and a mask of one u8 flag per token where there is one.
fn checked_tokens(file: &SafetensorsFile, split: Split) -> Result<usize, TrainerError> {
    let path = file.path();
    let name = split.name();
    let shape = file.shape(name).map_err(CheckpointError::File)?;
    let &[tokens] = shape.as_slice() else {
        return Err(file_error(
            path,
            Some(name),
            format!("shape {shape:?}, expected one dimension of token ids"),
        ));
    };
    if file.names().iter().any(|n| n == split.mask_name()) {
        let mask = split.mask_name();
        let (shape, dtype) = (
            file.shape(mask).map_err(CheckpointError::File)?,
            file.dtype(mask).map_err(CheckpointError::File)?,
        );
        if shape != [tokens] || dtype != "U8" {
            return Err(file_error(
                path,
                Some(mask),
                format!("{dtype} of shape {shape:?}, expected U8 flags, one per token of '{name}' ({tokens})"),
            ));
        }
    }
    let dtype = file.dtype(name).map_err(CheckpointError::File)?;
    if dtype != "U16" && dtype != "U32" {
        return Err(file_error(
            path,
            Some(name),
            format!("dtype {dtype}, expected U16 or U32 token ids"),
        ));
    }
    Ok(tokens)
}

impl SplitFile {
    /// Window `i` under `Concat`: inputs, targets and nothing else.
    fn concat_window(
        &self,
        i: usize,
        (inputs, targets): (&mut Vec<u32>, &mut Vec<u32>),
    ) -> candle_core::Result<()> {
        let seq = self.seq;
        let window = self
            .file
            .read_u32(self.split.name(), i * seq..i * seq + seq + 1)?;
        inputs.extend_from_slice(&window[..seq]);
        targets.extend(self.targets(&window, i * seq + 1)?);
        Ok(())
    }

    /// The targets of the tokens `window[1..]`, the first of them token `at` of the split:
    /// [`IGNORE_INDEX`] where the mask does not count them.
    fn targets(&self, window: &[u32], at: usize) -> candle_core::Result<Vec<u32>> {
        let next = &window[1..];
        if !self.masked {
            return Ok(next.to_vec());
        }
        let counted = (self.file).read_u32(self.split.mask_name(), at..at + next.len())?;
        Ok(next
            .iter()
            .zip(counted)
            .map(|(&t, c)| if c == 0 { IGNORE_INDEX } else { t })
            .collect())
    }

    /// A window of whole documents, each from position 0, then padding (id 0, not
    /// counted, each pad a document of its own so that nothing attends to it).
    fn documents_window(
        &self,
        docs: &[(u64, usize)],
        (inputs, targets, positions): (&mut Vec<u32>, &mut Vec<u32>, &mut Vec<u32>),
    ) -> candle_core::Result<()> {
        let mut used = 0;
        for &(start, n) in docs {
            let start = start as usize;
            let tokens = self.file.read_u32(self.split.name(), start..start + n)?;
            inputs.extend_from_slice(&tokens[..n - 1]);
            targets.extend(self.targets(&tokens, start + 1)?);
            positions.extend(0..n as u32 - 1);
            used += n - 1;
        }
        let pad = self.seq - used;
        inputs.extend(std::iter::repeat_n(0, pad));
        targets.extend(std::iter::repeat_n(IGNORE_INDEX, pad));
        positions.extend(std::iter::repeat_n(0, pad));
        Ok(())
    }
}

impl SplitFile {
    /// Appends window `i`'s rows to `rows`: its inputs and targets, and its positions when
    /// it holds whole documents.
    pub(crate) fn window(&self, i: usize, rows: &mut Rows) -> candle_core::Result<()> {
        match &self.windows {
            Windows::Concat(_) => self.concat_window(i, (&mut rows.inputs, &mut rows.targets)),
            Windows::Documents(plan) => {
                let docs = plan.window(&self.file, i)?;
                let parts = (&mut rows.inputs, &mut rows.targets, &mut rows.positions);
                self.documents_window(&docs, parts)
            }
        }
    }
}

/// The rows of a batch being made, one window after another.
#[derive(Default)]
pub(crate) struct Rows {
    pub(crate) inputs: Vec<u32>,
    pub(crate) targets: Vec<u32>,
    pub(crate) positions: Vec<u32>,
}
