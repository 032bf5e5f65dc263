//! Why a model, its config or its tokenizer could not be read.

use std::path::{Path, PathBuf};

pub use crate::config::ConfigError;

/// A model that could not be made; each names the file.
#[derive(Debug, thiserror::Error)]
pub enum ModelError {
    /// `config.json` is unreadable or describes a model wick does not build.
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// A weights file is unusable.
    #[error(transparent)]
    File(#[from] wick_core::FileError),
    /// A file of a model directory is missing or unreadable.
    #[error("{}: {message}", path.display())]
    Missing {
        /// The file or directory.
        path: PathBuf,
        /// What is missing or why it cannot be read.
        message: String,
    },
    /// LoRA options wick does not build (the message names the option).
    #[error("LoRA: {0}")]
    Lora(String),
    /// `tokenizer.json` cannot be loaded.
    #[error("{}: not a tokenizer wick can load: {message}", path.display())]
    Tokenizer {
        /// The file.
        path: PathBuf,
        /// The tokenizers crate's error.
        message: String,
    },
}

/// The text of the file at `path`; where it cannot be read, [`ModelError::Missing`] naming
/// it and why.
pub(crate) fn read_text(path: &Path) -> Result<String, ModelError> {
    std::fs::read_to_string(path).map_err(|e| ModelError::Missing {
        path: path.to_path_buf(),
        message: e.to_string(),
    })
}
