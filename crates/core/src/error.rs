//! Error types shared by the wick crates.

/// Failure of a collective call. Every variant says which rank saw it or caused it.
#[derive(Debug, Clone, thiserror::Error)]
pub enum CollectiveError {
    /// Another rank failed (returned an error or panicked); this rank's call was abandoned.
    #[error("rank {rank} failed: {reason}")]
    PeerFailed {
        /// The rank that failed first.
        rank: usize,
        /// Its error or panic message.
        reason: String,
    },
    /// Another rank left the world (finished its work) while this rank still waited on it.
    #[error("rank {rank} left the world while rank {waiting} waited in {op}")]
    PeerLeft {
        /// The rank that left.
        rank: usize,
        /// The rank that was waiting.
        waiting: usize,
        /// The collective being waited on.
        op: &'static str,
    },
    /// A collective called on a world of threads after its stage ended: the module's
    /// parameters are sharded over ranks that no longer run.
    #[error(
        "rank {rank}: {op} after the trainer's stage ended: this module's parameters are \
         sharded over {world_size} ranks as threads, which finished with the stage, so it runs \
         only inside the trainer: use Trainer::validate, Trainer::test or Trainer::predict to \
         run it, and Trainer::full_parameters for its weights"
    )]
    Ended {
        /// The calling rank.
        rank: usize,
        /// The number of ranks the world had.
        world_size: usize,
        /// The collective.
        op: &'static str,
    },
    /// Ranks called different collectives, or the same one with incompatible sizes.
    #[error("rank {rank}: {op}: {message}")]
    Mismatch {
        /// The rank reporting the mismatch.
        rank: usize,
        /// The collective.
        op: &'static str,
        /// What differed.
        message: String,
    },
    /// No progress for longer than the world's timeout.
    #[error(
        "rank {rank}: {op} timed out after {seconds} s waiting for {}",
        waited_for(missing)
    )]
    Timeout {
        /// The rank that gave up.
        rank: usize,
        /// The collective.
        op: &'static str,
        /// The timeout.
        seconds: u64,
        /// The ranks that had not arrived, where the world can tell (empty otherwise):
        /// the ones that stalled, not the ones that gave up waiting.
        missing: Vec<usize>,
    },
    /// The tensors passed cannot be used by this world (dtype, device, layout).
    #[error("rank {rank}: {op}: {message}")]
    Unsupported {
        /// The calling rank.
        rank: usize,
        /// The collective.
        op: &'static str,
        /// What is not supported.
        message: String,
    },
}

fn waited_for(missing: &[usize]) -> String {
    match missing {
        [] => "the other ranks".into(),
        [one] => format!("rank {one}"),
        more => format!("ranks {more:?}"),
    }
}

impl CollectiveError {
    /// The rank whose failure this error only reports, if it is such a report: the rank
    /// that failed first ([`CollectiveError::PeerFailed`]), or the first rank a timeout
    /// waited for in vain (it stalled; the rank that timed out did not).
    pub fn blames(&self) -> Option<usize> {
        match self {
            CollectiveError::PeerFailed { rank, .. } => Some(*rank),
            CollectiveError::Timeout { missing, .. } => missing.first().copied(),
            _ => None,
        }
    }

    /// The first `CollectiveError` in `error`'s chain: itself, what wraps it in a
    /// `candle_core::Error` (a collective run inside an op, as zero3's and fsdp's are) or
    /// in wick's [`Error`], and their sources.
    pub fn find_in<'a>(error: &'a (dyn std::error::Error + 'static)) -> Option<&'a Self> {
        if let Some(found) = error.downcast_ref::<CollectiveError>() {
            return Some(found);
        }
        // `#[error(transparent)]` variants hand over their inner error's source, not the
        // inner error: look inside them by hand.
        let inner: Option<&(dyn std::error::Error + 'static)> =
            if let Some(e) = error.downcast_ref::<candle_core::Error>() {
                match e {
                    candle_core::Error::Io(io) => match io.get_ref() {
                        Some(inner) => Some(inner),
                        None => return None,
                    },
                    candle_core::Error::WrappedContext { wrapped, .. } => Some(wrapped.as_ref()),
                    candle_core::Error::WithBacktrace { inner, .. }
                    | candle_core::Error::Context { inner, .. }
                    | candle_core::Error::WithPath { inner, .. } => Some(inner.as_ref()),
                    _ => error.source(),
                }
            } else if let Some(e) = error.downcast_ref::<Error>() {
                match e {
                    Error::Collective(c) => return Some(c),
                    Error::Candle(c) => Some(c),
                    _ => error.source(),
                }
            } else {
                error.source()
            };
        inner.and_then(Self::find_in)
    }
}

/// A collective's error carried through a Candle op (zero3's and fsdp's collectives run
/// inside custom ops, whose error type is `candle_core::Error`). Candle's `Error::Wrapped`
/// keeps only a `Display`, so the type would be lost; its `Io` variant keeps a
/// `std::error::Error` and prints it as it is, so [`CollectiveError::find_in`] finds it
/// again, typed, and the message reads as the collective's own.
impl From<CollectiveError> for candle_core::Error {
    fn from(e: CollectiveError) -> Self {
        candle_core::Error::Io(std::io::Error::other(e))
    }
}

/// Errors of wick's libraries.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A tensor operation failed (also the error type of the module hooks).
    #[error(transparent)]
    Candle(#[from] candle_core::Error),
    /// A collective call failed.
    #[error(transparent)]
    Collective(#[from] CollectiveError),
    /// A weights or checkpoint file cannot be used.
    #[error(transparent)]
    File(#[from] FileError),
    /// An option has a value that cannot be used.
    #[error("invalid {option}: {message}")]
    Config {
        /// The option's name, as the user wrote it.
        option: String,
        /// What is wrong and what would be valid.
        message: String,
    },
    /// `configure_sharded_model` created no parameter, so there is nothing to train.
    #[error("the module created no parameters in configure_sharded_model; create them there through ctx.var_builder()")]
    NoParameters,
    /// A step's reduced gradients hold inf or NaN, and the strategy was asked to fail on
    /// that ([`OnNonFinite::Error`](crate::OnNonFinite::Error)). Every rank reports the same:
    /// the first rank whose part of the gradients is non-finite, and its first parameter.
    #[error("non-finite gradient: rank {rank} holds inf or NaN in '{parameter}' (the first such parameter)")]
    NonFinite {
        /// The first rank that found one, in the world the gradients were reduced over.
        rank: usize,
        /// Its first parameter with an inf or NaN gradient, by name.
        parameter: String,
    },
    /// The steps were called in an order the strategy cannot run (an optimizer step after a
    /// backward that kept its gradients local).
    #[error("strategy {strategy}: {message}")]
    StepOrder {
        /// The strategy's name.
        strategy: String,
        /// What came in the wrong order, and the order that works.
        message: String,
    },
}

impl Error {
    /// Shorthand for [`Error::Config`].
    pub fn config(option: impl Into<String>, message: impl Into<String>) -> Self {
        Error::Config {
            option: option.into(),
            message: message.into(),
        }
    }
}

/// Result with wick's [`Error`].
pub type Result<T> = std::result::Result<T, Error>;

/// A weights or checkpoint file that cannot be used as asked: names the file and, where
/// one is concerned, the tensor.
#[derive(Debug, Clone, thiserror::Error)]
#[error("{}{}: {message}", file.display(), tensor.as_ref().map(|t| format!(": tensor '{t}'")).unwrap_or_default())]
pub struct FileError {
    /// The file.
    pub file: std::path::PathBuf,
    /// The tensor concerned, if any.
    pub tensor: Option<String>,
    /// What is wrong.
    pub message: String,
}

impl FileError {
    /// An error about `file` (and `tensor`).
    pub fn new(
        file: impl AsRef<std::path::Path>,
        tensor: Option<&str>,
        message: impl Into<String>,
    ) -> Self {
        FileError {
            file: file.as_ref().to_path_buf(),
            tensor: tensor.map(str::to_string),
            message: message.into(),
        }
    }
}

impl From<FileError> for candle_core::Error {
    fn from(e: FileError) -> Self {
        candle_core::Error::Msg(e.to_string())
    }
}
