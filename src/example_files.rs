//! The rows of instruction-data files, each a JSON object: JSON Lines (a row a line), or
//! Parquet, the format the Hugging Face Hub serves datasets in (files named `*.parquet`,
//! read by the `parquet` crate of arrow-rs: a row's columns as the object's keys, lists and
//! structs as JSON arrays and objects). Several files can be mixed by weights, as
//! `datasets.interleave_datasets` mixes them.

use anyhow::Context;
use serde_json::Value;
use std::path::Path;

/// A row and where it is, for errors: "FILE:LINE" of JSON Lines, "FILE: row N" of Parquet.
pub struct Row {
    /// Where the row is.
    pub at: String,
    /// Its columns.
    pub value: Value,
}

/// Every row of the file at `path` (blank lines of JSON Lines skipped); a line that is not
/// JSON is an error naming it.
pub fn rows(path: &Path) -> anyhow::Result<Vec<Row>> {
    if path.extension().is_some_and(|e| e == "parquet") {
        return parquet_rows(path);
    }
    let text =
        std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    let mut out = Vec::new();
    for (n, line) in text.lines().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        let at = format!("{}:{}", path.display(), n + 1);
        let value =
            serde_json::from_str(line).map_err(|e| anyhow::anyhow!("{at}: not JSON: {e}"))?;
        out.push(Row { at, value });
    }
    Ok(out)
}

/// Every row of the Parquet file at `path`.
fn parquet_rows(path: &Path) -> anyhow::Result<Vec<Row>> {
    use parquet::file::reader::{FileReader, SerializedFileReader};
    let file = std::fs::File::open(path).with_context(|| format!("reading {}", path.display()))?;
    let reader = SerializedFileReader::new(file)
        .with_context(|| format!("{}: not a Parquet file", path.display()))?;
    let mut out = Vec::new();
    for (n, row) in reader.get_row_iter(None)?.enumerate() {
        let at = format!("{}: row {}", path.display(), n + 1);
        let row = row.with_context(|| at.clone())?;
        out.push(Row {
            at,
            value: row.to_json_value(),
        });
    }
    Ok(out)
}

/// The order in which to take the rows of files of `lens` rows mixed by `weights`: each
/// next row from file i with probability w_i / sum(w), drawn by a generator seeded with
/// `seed`, until a file drawn has no rows left (`interleave_datasets`' `first_exhausted`).
/// (file, row) pairs.
pub fn interleaved(lens: &[usize], weights: &[f64], seed: u64) -> Vec<(usize, usize)> {
    let total: f64 = weights.iter().sum();
    let mut next = vec![0; lens.len()];
    let mut out = Vec::new();
    for draw in 0u64.. {
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
        if next[file] == lens[file] {
            return out;
        }
        out.push((file, next[file]));
        next[file] += 1;
    }
    unreachable!("a file drawn runs out before 2^64 draws")
}
