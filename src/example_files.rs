//! The rows of instruction-data files, each a JSON object: JSON Lines (a row a line), or
//! Parquet, the format the Hugging Face Hub serves datasets in (files named `*.parquet`,
//! read by the `parquet` crate of arrow-rs: a row's columns as the object's keys, lists and
//! structs as JSON arrays and objects). Several files can be mixed by weights, as
//! `datasets.interleave_datasets` mixes them.

use anyhow::Context;
use serde_json::Value;
use std::io::BufRead;
use std::path::Path;

/// A row and where it is, for errors: "FILE:LINE" of JSON Lines, "FILE: row N" of Parquet.
pub struct Row {
    /// Where the row is.
    pub at: String,
    /// Its columns.
    pub value: Value,
}

/// The rows of one file, read as they are asked for (a corpus of any size is never held
/// whole): JSON Lines line by line, blank lines skipped, a line that is not JSON an error
/// naming it; Parquet row by row.
pub struct Rows {
    /// How many rows the file holds.
    pub len: usize,
    rows: Box<dyn Iterator<Item = anyhow::Result<Row>>>,
}

impl Iterator for Rows {
    type Item = anyhow::Result<Row>;

    fn next(&mut self) -> Option<Self::Item> {
        self.rows.next()
    }
}

/// The rows of the file at `path`, counted first (JSON Lines by a pass over its lines,
/// Parquet from its metadata).
pub fn rows(path: &Path) -> anyhow::Result<Rows> {
    if path.extension().is_some_and(|e| e == "parquet") {
        return parquet_rows(path);
    }
    let lines = || -> anyhow::Result<_> {
        let file =
            std::fs::File::open(path).with_context(|| format!("reading {}", path.display()))?;
        Ok(std::io::BufReader::new(file).lines().enumerate())
    };
    let mut len = 0;
    for (n, line) in lines()? {
        let line = line.with_context(|| format!("{}:{}", path.display(), n + 1))?;
        len += usize::from(!line.trim().is_empty());
    }
    let name = path.display().to_string();
    let rows = lines()?.filter_map(move |(n, line)| {
        let at = format!("{name}:{}", n + 1);
        let line = match line {
            Ok(line) if line.trim().is_empty() => return None,
            Ok(line) => line,
            Err(e) => return Some(Err(anyhow::anyhow!("{at}: {e}"))),
        };
        Some(match serde_json::from_str(&line) {
            Ok(value) => Ok(Row { at, value }),
            Err(e) => Err(anyhow::anyhow!("{at}: not JSON: {e}")),
        })
    });
    Ok(Rows {
        len,
        rows: Box::new(rows),
    })
}

/// The rows of the Parquet file at `path`.
fn parquet_rows(path: &Path) -> anyhow::Result<Rows> {
    use parquet::file::reader::{FileReader, SerializedFileReader};
    let file = std::fs::File::open(path).with_context(|| format!("reading {}", path.display()))?;
    let reader = SerializedFileReader::new(file)
        .with_context(|| format!("{}: not a Parquet file", path.display()))?;
    let len = reader.metadata().file_metadata().num_rows() as usize;
    let name = path.display().to_string();
    let rows = reader.into_iter().enumerate().map(move |(n, row)| {
        let at = format!("{name}: row {}", n + 1);
        let row = row.with_context(|| at.clone())?;
        Ok(Row {
            at,
            value: row.to_json_value(),
        })
    });
    Ok(Rows {
        len,
        rows: Box::new(rows),
    })
}

/// The files to take each next row from, for files of `lens` rows mixed by `weights`:
/// file i with probability w_i / sum(w), drawn by a generator seeded with `seed`, until a
/// file drawn has no rows left (`interleave_datasets`' `first_exhausted`).
pub fn interleaved(lens: &[usize], weights: &[f64], seed: u64) -> impl Iterator<Item = usize> {
    let total: f64 = weights.iter().sum();
    let (lens, weights) = (lens.to_vec(), weights.to_vec());
    let mut taken = vec![0; lens.len()];
    (0u64..).map_while(move |draw| {
        // SplitMix64 over a counter: a well-mixed 64-bit stream.
        let z = wick_core::splitmix64(seed.wrapping_add(draw.wrapping_mul(0x9E37_79B9_7F4A_7C15)));
        let mut u = (z >> 11) as f64 / (1u64 << 53) as f64 * total;
        let mut file = weights.len() - 1;
        for (i, w) in weights.iter().enumerate() {
            if u < *w {
                file = i;
                break;
            }
            u -= w;
        }
        (taken[file] < lens[file]).then(|| {
            taken[file] += 1;
            file
        })
    })
}
