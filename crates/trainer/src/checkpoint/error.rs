//! Why a checkpoint could not be written or read.

use std::path::PathBuf;
use wick_core::FileError;

/// A checkpoint error; each names the file and, where one is concerned, the tensor or field.
#[derive(Debug, thiserror::Error)]
pub enum CheckpointError {
    /// The path is not a wick checkpoint directory.
    #[error("{}: not a wick checkpoint: {message}", path.display())]
    NotACheckpoint {
        /// The path given.
        path: PathBuf,
        /// What is missing.
        message: String,
    },
    /// The manifest is unreadable or inconsistent.
    #[error("{}: field '{field}': {message}", path.display())]
    Manifest {
        /// The manifest file.
        path: PathBuf,
        /// The field at fault.
        field: String,
        /// What is wrong.
        message: String,
    },
    /// A rank file or weights file is unusable (truncated, corrupted, missing a tensor, ...).
    #[error(transparent)]
    File(#[from] FileError),
    /// The checkpoint does not fit the model or run it is loaded into.
    #[error("{}: {message}", path.display())]
    Mismatch {
        /// The checkpoint.
        path: PathBuf,
        /// What differs.
        message: String,
    },
    /// The checkpoint a `last` file named cannot be used.
    #[error("{error} ({} points there)", last.display())]
    NamedBy {
        /// The `last` file.
        last: PathBuf,
        /// What is wrong with the checkpoint it names.
        error: Box<CheckpointError>,
    },
    /// Reading or writing failed.
    #[error("{}: {cause}", path.display())]
    Io {
        /// The file or directory.
        path: PathBuf,
        /// The cause (in the message, not a separate source: it prints once).
        cause: std::io::Error,
    },
}

impl CheckpointError {
    pub(crate) fn io(path: impl Into<PathBuf>) -> impl FnOnce(std::io::Error) -> Self {
        let path = path.into();
        move |cause| CheckpointError::Io { path, cause }
    }

    pub(crate) fn manifest(
        path: impl Into<PathBuf>,
        field: impl Into<String>,
        message: impl Into<String>,
    ) -> Self {
        CheckpointError::Manifest {
            path: path.into(),
            field: field.into(),
            message: message.into(),
        }
    }
}
