//! [`TokenFileWriter`]: a token file written as its documents come, in memory that does not
//! grow with the corpus, and [`Written`], what it wrote.

use crate::data::token_file::{metadata, Split, PAIRS_KEY, PAIRS_VALUE};
use crate::data::token_parts::{id_bytes, io_error, write_parts, Chunks, Part};
use crate::TrainerError;
use safetensors::Dtype;
use std::fs::File;
use std::io::{BufWriter, Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};

/// A token file written as its documents come, in memory that does not grow with the
/// corpus: the ids, flags and starts go to anonymous temporary files beside the output, and
/// [`TokenFileWriter::finish`] writes the token file from them, the last `val_fraction`
/// held out.
pub struct TokenFileWriter {
    path: PathBuf,
    vocab_size: usize,
    /// u32 little-endian, every token.
    ids: BufWriter<File>,
    /// u8, every token (instruction data).
    flags: Option<BufWriter<File>>,
    /// u64 little-endian, every document's first token.
    starts: BufWriter<File>,
    tokens: usize,
    documents: usize,
    /// Targets flagged as counted so far (instruction data).
    counted: usize,
    /// Documents come in pairs (preference data), never split between the splits.
    paired: bool,
}

/// What a [`TokenFileWriter`] wrote: the tokens of each split, the documents, the counted
/// targets (instruction data).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Written {
    /// Training tokens.
    pub train: usize,
    /// Held-out tokens.
    pub val: usize,
    /// Documents (examples).
    pub documents: usize,
    /// Tokens that count as targets (`None`: every one).
    pub counted: Option<usize>,
}

impl TokenFileWriter {
    /// A writer of the token file `path`, for a tokenizer of `vocab_size` ids; `masked`
    /// for instruction data, whose documents come with the flags of their counted targets.
    pub fn create(path: &Path, vocab_size: usize, masked: bool) -> Result<Self, TrainerError> {
        let dir = match path.parent() {
            Some(p) if !p.as_os_str().is_empty() => p,
            _ => Path::new("."),
        };
        let spill = || {
            tempfile::tempfile_in(dir)
                .map(BufWriter::new)
                .map_err(|cause| TrainerError::Io {
                    path: dir.to_path_buf(),
                    cause,
                })
        };
        Ok(TokenFileWriter {
            path: path.to_path_buf(),
            vocab_size,
            ids: spill()?,
            flags: masked.then(spill).transpose()?,
            starts: spill()?,
            tokens: 0,
            documents: 0,
            counted: 0,
            paired: false,
        })
    }

    /// Marks the documents as pairs (preference data: a prompt with its chosen completion,
    /// then with its rejected one): the held-out part starts at a pair, and the file says
    /// so ([`PAIRS_KEY`]).
    pub fn paired(mut self) -> Self {
        self.paired = true;
        self
    }

    /// Documents so far.
    pub fn documents(&self) -> usize {
        self.documents
    }

    /// The documents the held-out cut keeps together: a pair's two, or one.
    fn group(&self) -> Result<usize, TrainerError> {
        if !self.paired {
            return Ok(1);
        }
        match self.documents.is_multiple_of(2) {
            true => Ok(2),
            false => Err(TrainerError::config(
                "pairs",
                format!(
                    "preference data holds pairs of documents, got {}",
                    self.documents
                ),
            )),
        }
    }

    /// Appends a document: its ids and, for instruction data, whether each counts.
    pub fn push(&mut self, ids: &[u32], counted: Option<&[bool]>) -> Result<(), TrainerError> {
        let at = self.tokens as u64;
        self.starts
            .write_all(&at.to_le_bytes())
            .map_err(|e| self.io(e))?;
        self.documents += 1;
        self.append(ids, counted)
    }

    /// Appends tokens to the last document (the end-of-text token that closes it).
    pub fn append(&mut self, ids: &[u32], counted: Option<&[bool]>) -> Result<(), TrainerError> {
        if let Some(&id) = ids.iter().find(|&&id| id as usize >= self.vocab_size) {
            return Err(TrainerError::config(
                "vocab-size",
                format!(
                    "document {} holds id {id}, not below the vocabulary's {}",
                    self.documents.saturating_sub(1),
                    self.vocab_size
                ),
            ));
        }
        match (&mut self.flags, counted) {
            (Some(flags), Some(c)) if c.len() == ids.len() => {
                let bytes: Vec<u8> = c.iter().map(|&b| b as u8).collect();
                flags
                    .write_all(&bytes)
                    .map_err(|e| io_error(&self.path, e))?;
                self.counted += c.iter().filter(|&&b| b).count();
            }
            (None, None) => {}
            _ => {
                return Err(TrainerError::config(
                    "mask",
                    "instruction data needs one flag per token, plain text none",
                ))
            }
        }
        let bytes: Vec<u8> = ids.iter().flat_map(|i| i.to_le_bytes()).collect();
        self.ids.write_all(&bytes).map_err(|e| self.io(e))?;
        self.tokens += ids.len();
        Ok(())
    }

    /// Tokens so far.
    pub fn tokens(&self) -> usize {
        self.tokens
    }

    fn io(&self, cause: std::io::Error) -> TrainerError {
        io_error(&self.path, cause)
    }

    /// Writes the token file: the last `val_fraction` of the tokens held out (from the
    /// start of an example after that point, for instruction data, so that none is split;
    /// a text document cut in two starts again at the cut).
    pub fn finish(self, val_fraction: f64, tokenizer_hash: &str) -> Result<Written, TrainerError> {
        let group = self.group()?;
        let io = |e| io_error(&self.path, e);
        let spilled = |w: BufWriter<File>| -> Result<File, TrainerError> {
            let mut file = w.into_inner().map_err(|e| io(e.into_error()))?;
            file.seek(SeekFrom::Start(0)).map_err(io)?;
            Ok(file)
        };
        let n = self.tokens;
        let ids = spilled(self.ids)?;
        let flags = self.flags.map(spilled).transpose()?;
        let starts_file = spilled(self.starts)?;
        let starts = Spill::new(&starts_file, 8);
        let whole = flags.is_some();
        let (cut, train_docs, cut_in_two) = held_out(
            &starts,
            (n, self.documents),
            val_fraction,
            whole.then_some(group),
        )
        .map_err(io)?;
        let narrow = self.vocab_size <= 1 << 16;
        let id_part = Spill::new(&ids, 4);
        let flag_part = flags.as_ref().map(|f| Spill::new(f, 1));
        let mut parts = Vec::new();
        for (split, range, docs) in [
            (Split::Train, 0..cut, 0..train_docs),
            (Split::Val, cut..n, train_docs..self.documents),
        ] {
            let len = range.len();
            let narrowed = id_part.chunks(range.clone(), move |b| {
                let ids: Vec<u32> = b
                    .chunks_exact(4)
                    .map(|c| u32::from_le_bytes(c.try_into().expect("4")))
                    .collect();
                id_bytes(&ids, narrow)
            });
            parts.push(Part::ids(split.name(), narrow, len, narrowed));
            if let Some(flags) = &flag_part {
                parts.push(Part::new(
                    split.mask_name(),
                    Dtype::U8,
                    len,
                    flags.chunks(range.clone(), |b| b.to_vec()),
                ));
            }
            // Offsets from the split's first token; a split that starts inside a document
            // starts with that document's rest.
            let lead = (split == Split::Val && cut_in_two).then_some(0i64);
            let base = range.start as u64;
            let shifted = starts.chunks(docs.clone(), move |b| {
                b.chunks_exact(8)
                    .flat_map(|c| {
                        ((u64::from_le_bytes(c.try_into().expect("8")) - base) as i64).to_le_bytes()
                    })
                    .collect()
            });
            let lead_bytes = lead.map(|l| Ok(l.to_le_bytes().to_vec()));
            let count = docs.len() + lead.is_some() as usize;
            parts.push(Part::new(
                split.starts_name(),
                Dtype::I64,
                count,
                Box::new(lead_bytes.into_iter().chain(shifted)),
            ));
        }
        let counted = whole.then_some(self.counted);
        let mut meta = metadata(tokenizer_hash, self.vocab_size);
        meta.extend(self.paired.then(|| (PAIRS_KEY.into(), PAIRS_VALUE.into())));
        write_parts(&self.path, parts, meta)?;
        Ok(Written {
            train: cut,
            val: n - cut,
            documents: self.documents,
            counted,
        })
    }
}

/// Where the held-out tokens of `n` tokens in `documents` documents (their starts in
/// `starts`) begin: the last `val_fraction`, moved to the start of a group of `whole`
/// documents when whole groups go to each side (an example; a preference pair); how many
/// documents start before that; whether a document is cut in two there.
fn held_out(
    starts: &Spill,
    (n, documents): (usize, usize),
    val_fraction: f64,
    whole: Option<usize>,
) -> std::io::Result<(usize, usize, bool)> {
    let val = (n as f64 * val_fraction).round() as usize;
    let mut cut = n - val;
    let after = |cut: usize| starts.position(documents, |s| s as usize >= cut);
    if let (Some(group), true) = (whole, cut < n) {
        // The next group's start, or else the last group's (all of it held out), or, for
        // a single group, none held out: a group is never cut in two.
        let next = after(cut)?.map(|i| i.div_ceil(group) * group);
        cut = match next {
            Some(i) if i < documents => starts.get(i)? as usize,
            _ if documents > group => starts.get(documents - group)? as usize,
            _ => n,
        };
    }
    let train_docs = after(cut)?.unwrap_or(documents);
    let cut_in_two =
        cut < n && (train_docs == documents || starts.get(train_docs)? as usize != cut);
    Ok((cut, train_docs, cut_in_two))
}

/// A spilled array of fixed-size elements, read back a block at a time from where it is
/// asked (each read seeks first, so that several can take turns on one file).
#[derive(Clone, Copy)]
struct Spill<'f> {
    file: &'f File,
    size: usize,
}

/// Elements per block read back from a spill.
const BLOCK: usize = 1 << 18;

impl<'f> Spill<'f> {
    fn new(file: &'f File, size: usize) -> Self {
        Spill { file, size }
    }

    /// Elements `range`'s bytes.
    fn read(&self, range: std::ops::Range<usize>) -> std::io::Result<Vec<u8>> {
        let mut file = self.file;
        file.seek(SeekFrom::Start((range.start * self.size) as u64))?;
        let mut bytes = vec![0u8; range.len() * self.size];
        file.read_exact(&mut bytes)?;
        Ok(bytes)
    }

    /// Element `i` of an array of u64.
    fn get(&self, i: usize) -> std::io::Result<u64> {
        Ok(u64::from_le_bytes(
            self.read(i..i + 1)?.try_into().expect("8 bytes"),
        ))
    }

    /// The first of `len` u64 elements for which `hit` holds.
    fn position(&self, len: usize, hit: impl Fn(u64) -> bool) -> std::io::Result<Option<usize>> {
        for start in (0..len).step_by(BLOCK) {
            let block = self.read(start..len.min(start + BLOCK))?;
            let words = block
                .chunks_exact(8)
                .map(|c| u64::from_le_bytes(c.try_into().expect("8")));
            if let Some(i) = words.into_iter().position(&hit) {
                return Ok(Some(start + i));
            }
        }
        Ok(None)
    }

    /// Elements `range`, a block at a time, each block's bytes through `convert`.
    fn chunks(
        self,
        range: std::ops::Range<usize>,
        convert: impl Fn(&[u8]) -> Vec<u8> + 'f,
    ) -> Chunks<'f> {
        let end = range.end;
        Box::new(range.step_by(BLOCK).map(move |start| {
            self.read(start..end.min(start + BLOCK))
                .map(|b| convert(&b))
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::data::token_file::{write_token_file, TokenSplit};

    /// Writes `docs` (ids, counted) with a [`TokenFileWriter`] at `path`.
    fn streamed(path: &Path, docs: &[(Vec<u32>, Option<Vec<bool>>)], fraction: f64) -> Written {
        let masked = docs[0].1.is_some();
        let mut w = TokenFileWriter::create(path, 1000, masked).unwrap();
        for (ids, counted) in docs {
            w.push(ids, counted.as_deref()).unwrap();
        }
        w.finish(fraction, "abc").unwrap()
    }

    #[test]
    fn the_streaming_writer_writes_what_the_splits_in_memory_give() {
        let dir = tempfile::tempdir().unwrap();
        let (a, b) = (dir.path().join("a"), dir.path().join("b"));
        let docs: Vec<(Vec<u32>, Option<Vec<bool>>)> = [4usize, 3, 3]
            .iter()
            .enumerate()
            .map(|(d, &n)| {
                let ids = (0..n as u32).map(|i| 10 * d as u32 + i).collect();
                (ids, Some((0..n).map(|i| i != 0).collect()))
            })
            .collect();
        // Examples: 3 of 10 tokens held out from the next example's start (7).
        let written = streamed(&a, &docs, 0.3);
        assert_eq!((written.train, written.val, written.documents), (7, 3, 3));
        assert_eq!(written.counted, Some(7));
        let ids: Vec<u32> = docs.iter().flat_map(|d| d.0.clone()).collect();
        let flags: Vec<bool> = docs.iter().flat_map(|d| d.1.clone().unwrap()).collect();
        let split = |r: std::ops::Range<usize>, starts| TokenSplit {
            ids: &ids[r.clone()],
            counted: Some(&flags[r]),
            starts: Some(starts),
        };
        write_token_file(&b, split(0..7, &[0, 4]), split(7..10, &[0]), "abc", 1000).unwrap();
        assert_eq!(std::fs::read(&a).unwrap(), std::fs::read(&b).unwrap());
        // No example starts after the cut (8): the last one is held out whole.
        assert_eq!(streamed(&a, &docs, 0.2).train, 7);
        // Plain text is cut where the fraction falls: the second document in two, starting
        // again at 0 on the held-out side.
        let text: Vec<_> = docs.iter().map(|d| (d.0.clone(), None)).collect();
        let written = streamed(&a, &text, 0.5);
        assert_eq!((written.train, written.val), (5, 5));
        let plain = |r: std::ops::Range<usize>, starts| TokenSplit {
            ids: &ids[r],
            counted: None,
            starts: Some(starts),
        };
        write_token_file(&b, plain(0..5, &[0, 4]), plain(5..10, &[0, 2]), "abc", 1000).unwrap();
        assert_eq!(std::fs::read(&a).unwrap(), std::fs::read(&b).unwrap());
        // Nothing held out.
        assert_eq!(streamed(&a, &text, 0.0).val, 0);
    }

    #[test]
    fn an_id_outside_the_vocabulary_is_named_and_nothing_is_written() {
        let (dir, path) = crate::data::scratch_file("t.safetensors");
        let mut w = TokenFileWriter::create(&path, 300, false).unwrap();
        w.push(&[1, 2], None).unwrap();
        let e = w.push(&[3, 300], None).unwrap_err().to_string();
        assert!(e.contains("document 1 holds id 300"), "{e}");
        drop(w);
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0);
    }
}
