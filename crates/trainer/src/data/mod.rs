//! What a fit runs over: [`Dataset`](crate::Dataset) and [`DataLoader`](crate::DataLoader),
//! which splits each global batch over the ranks in an [`EpochOrder`](crate::EpochOrder), and token files of text tokenized once
//! ([`TokenDataset`](crate::TokenDataset)), and preference pairs from them
//! ([`PreferenceDataset`](crate::PreferenceDataset)).

pub(crate) mod data_loader;
pub(crate) mod document_plan;
pub(crate) mod epoch_order;
pub(crate) mod packing;
pub(crate) mod preference_dataset;
pub(crate) mod split_file;
pub(crate) mod token_dataset;
pub(crate) mod token_file;
pub(crate) mod token_file_writer;
pub(crate) mod token_parts;

use epoch_order::EpochOrder;

/// `name` in a fresh directory, which is removed when the returned guard drops.
#[cfg(test)]
pub(crate) fn scratch_file(name: &str) -> (tempfile::TempDir, std::path::PathBuf) {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let path = dir.path().join(name);
    (dir, path)
}
