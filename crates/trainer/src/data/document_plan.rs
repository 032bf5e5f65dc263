//! `DocumentPlan`: which whole documents of a token file's split fill each window, planned
//! a chunk of documents at a time so that the plan takes no memory of the corpus's size.
//!
//! The documents are taken in chunks of [`CHUNK_DOCUMENTS`] in file order, and each chunk
//! is packed on its own (best-fit decreasing, or one document a window), as TRL packs a
//! dataset a `map` batch at a time. The plan keeps only where each chunk's windows begin (8
//! bytes a chunk); a window's documents are planned again from the starts, read from the file,
//! when it is read, a chunk's placement being cheap (a sort and an ordered set of at most
//! a chunk's bins) beside the forward that reads the window.

use crate::data::packing::{best_fit_decreasing, Packing};
use crate::data::token_file::Split;
use wick_core::{FileError, SafetensorsFile};

/// Documents packed together: a window never takes documents of two chunks.
pub(crate) const CHUNK_DOCUMENTS: usize = 1024;

/// Where the windows of a split's documents come from.
#[derive(Clone, Debug)]
pub(crate) struct DocumentPlan {
    packing: Packing,
    split: Split,
    /// The split's tokens (the end of its last document).
    tokens: usize,
    /// Documents recorded in the split's starts.
    documents: usize,
    seq: usize,
    /// The first window of each chunk, and the number of windows last.
    first_window: Vec<usize>,
    /// Documents longer than a window, cut to it.
    truncated: usize,
    /// Input positions that hold a document's token (not padding).
    used: usize,
}

/// A chunk's documents, (first token, tokens) each: those of at least two tokens (one
/// target), each cut to `seq + 1`.
type Docs = Vec<(u64, usize)>;

impl DocumentPlan {
    /// The plan of `split` (of `tokens` tokens) in `file` in windows of `seq` inputs,
    /// packed as `packing` (`Documents` or `Padded`) says. Reads the starts a chunk at a
    /// time and checks them: from 0, increasing, within the tokens.
    pub(crate) fn new(
        file: &SafetensorsFile,
        split: Split,
        tokens: usize,
        seq: usize,
        packing: Packing,
    ) -> Result<Self, FileError> {
        let shape = file.shape(split.starts_name())?;
        let mut plan = DocumentPlan {
            packing,
            split,
            tokens,
            documents: shape.iter().product(),
            seq,
            first_window: vec![0],
            truncated: 0,
            used: 0,
        };
        for chunk in 0..plan.documents.div_ceil(CHUNK_DOCUMENTS) {
            let (docs, truncated) = plan.chunk_documents(file, chunk, true)?;
            let windows = plan.place(&docs);
            plan.truncated += truncated;
            plan.used += docs.iter().map(|&(_, n)| n - 1).sum::<usize>();
            let last = plan.first_window[chunk];
            plan.first_window.push(last + windows.len());
        }
        Ok(plan)
    }

    /// The number of windows.
    pub(crate) fn len(&self) -> usize {
        *self.first_window.last().expect("one entry at least")
    }

    /// How the windows are laid out.
    pub(crate) fn packing(&self) -> Packing {
        self.packing
    }

    /// Documents longer than a window, cut to it.
    pub(crate) fn truncated(&self) -> usize {
        self.truncated
    }

    /// Input positions that hold a document's token.
    pub(crate) fn used(&self) -> usize {
        self.used
    }

    /// The documents of window `i`, (first token, tokens) each.
    pub(crate) fn window(
        &self,
        file: &SafetensorsFile,
        i: usize,
    ) -> Result<Vec<(u64, usize)>, FileError> {
        let chunk = self.first_window.partition_point(|&w| w <= i) - 1;
        let (docs, _) = self.chunk_documents(file, chunk, false)?;
        let mut windows = self.place(&docs);
        Ok(windows.swap_remove(i - self.first_window[chunk]))
    }

    /// Chunk `chunk`'s documents, and how many of them were cut to a window. `check`
    /// checks its starts (the plan does when it is made).
    fn chunk_documents(
        &self,
        file: &SafetensorsFile,
        chunk: usize,
        check: bool,
    ) -> Result<(Docs, usize), FileError> {
        let name = self.split.starts_name();
        let first = chunk * CHUNK_DOCUMENTS;
        let end = (first + CHUNK_DOCUMENTS).min(self.documents);
        // The next chunk's first start ends this chunk's last document.
        let mut starts = file.read_offsets(name, first..(end + 1).min(self.documents))?;
        if end == self.documents {
            starts.push(self.tokens as u64);
        }
        // Increasing through the next chunk's first start (or the split's end): each start
        // is within the tokens, and the chunks follow one another.
        let valid = (first > 0 || starts[0] == 0) && starts.windows(2).all(|w| w[0] < w[1]);
        if check && !valid {
            return Err(FileError::new(
                file.path(),
                Some(name),
                format!(
                    "documents {first}..{end} must start at 0 and increase within the {} tokens",
                    self.tokens
                ),
            ));
        }
        let mut truncated = 0;
        let docs = (starts.windows(2))
            .map(|w| (w[0], (w[1] - w[0]) as usize))
            .filter(|&(_, n)| n >= 2)
            .map(|(s, n)| {
                truncated += usize::from(n > self.seq + 1);
                (s, n.min(self.seq + 1))
            })
            .collect();
        Ok((docs, truncated))
    }

    /// `docs` in windows: by best-fit decreasing (`Documents`) or one a window (`Padded`).
    fn place(&self, docs: &[(u64, usize)]) -> Vec<Vec<(u64, usize)>> {
        match self.packing {
            Packing::Padded => docs.iter().map(|&d| vec![d]).collect(),
            _ => {
                // A document of n tokens fills n - 1 positions (its inputs; its targets are
                // the same positions shifted by one).
                let sizes: Vec<usize> = docs.iter().map(|&(_, n)| n - 1).collect();
                (best_fit_decreasing(&sizes, self.seq).into_iter())
                    .map(|bin| bin.into_iter().map(|i| docs[i]).collect())
                    .collect()
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::data::token_file::{write_token_file, TokenSplit};

    /// A token file whose training split holds documents of `lens` tokens.
    fn file_of(dir: &std::path::Path, lens: &[usize]) -> SafetensorsFile {
        let path = dir.join("docs.safetensors");
        let (mut ids, mut starts) = (Vec::new(), Vec::new());
        for &n in lens {
            starts.push(ids.len() as u64);
            ids.extend((0..n as u32).map(|i| i % 7));
        }
        let train = TokenSplit {
            ids: &ids,
            counted: Some(&vec![true; ids.len()]),
            starts: Some(&starts),
        };
        let val = TokenSplit {
            ids: &[1, 2],
            counted: Some(&[true, true]),
            starts: Some(&[0]),
        };
        write_token_file(&path, train, val, "abc", 10).unwrap();
        SafetensorsFile::open(&path).unwrap()
    }

    #[test]
    fn every_document_lands_once_within_its_chunk_and_the_plan_stays_small() {
        let dir = tempfile::tempdir().unwrap();
        // Three chunks and a bit, lengths 1 (no target: left out) to 40 (cut to 17).
        let lens: Vec<usize> = (0..3 * CHUNK_DOCUMENTS + 100)
            .map(|d| 1 + (d * 37 + d / 5) % 40)
            .collect();
        let file = file_of(dir.path(), &lens);
        let seq = 16;
        for packing in [Packing::Documents, Packing::Padded] {
            let plan =
                DocumentPlan::new(&file, Split::Train, lens.iter().sum(), seq, packing).unwrap();
            assert_eq!(
                plan.first_window.len(),
                5,
                "{packing:?}: one entry a chunk, and the end"
            );
            let starts: Vec<u64> = (lens.iter().scan(0u64, |at, &n| {
                let s = *at;
                *at += n as u64;
                Some(s)
            }))
            .collect();
            let mut seen = Vec::new();
            let mut used = 0;
            for w in 0..plan.len() {
                let docs = plan.window(&file, w).unwrap();
                let inputs: usize = docs.iter().map(|&(_, n)| n - 1).sum();
                assert!(inputs <= seq && !docs.is_empty(), "{packing:?} window {w}");
                let doc = |s: u64| starts.binary_search(&s).unwrap();
                let chunks: Vec<usize> = docs
                    .iter()
                    .map(|&(s, _)| doc(s) / CHUNK_DOCUMENTS)
                    .collect();
                assert!(
                    chunks.iter().all(|&c| c == chunks[0]),
                    "window {w} spans chunks"
                );
                seen.extend(docs.iter().map(|&(s, _)| doc(s)));
                used += inputs;
            }
            seen.sort_unstable();
            let expected: Vec<usize> = (0..lens.len()).filter(|&d| lens[d] >= 2).collect();
            assert_eq!(seen, expected, "{packing:?}");
            assert_eq!(used, plan.used());
            assert_eq!(
                plan.truncated(),
                lens.iter().filter(|&&n| n > seq + 1).count()
            );
        }
        let packed = DocumentPlan::new(
            &file,
            Split::Train,
            lens.iter().sum(),
            seq,
            Packing::Documents,
        )
        .unwrap();
        // Best fit decreasing needs at most 11/9 of the fewest windows, plus one a chunk.
        let fewest = packed.used().div_ceil(seq) as f64;
        assert!(
            packed.len() as f64 <= fewest * 11.0 / 9.0 + 4.0,
            "{} windows",
            packed.len()
        );
    }

    #[test]
    fn starts_that_go_back_are_named_with_their_chunk() {
        let (_dir, path) = crate::data::scratch_file("bad.safetensors");
        let ids: Vec<u32> = (0..40).collect();
        let train = TokenSplit {
            ids: &ids,
            counted: Some(&[true; 40]),
            starts: Some(&[0, 10, 20]),
        };
        let val = TokenSplit {
            ids: &[1, 2],
            counted: Some(&[true, true]),
            starts: Some(&[0]),
        };
        write_token_file(&path, train, val, "abc", 100).unwrap();
        let file = SafetensorsFile::open(&path).unwrap();
        // A split said to end before its last start.
        let e = DocumentPlan::new(&file, Split::Train, 15, 8, Packing::Documents)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("documents 0..3") && e.contains("train_starts"),
            "{e}"
        );
    }
}
