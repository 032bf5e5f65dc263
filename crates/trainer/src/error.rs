//! The trainer's error type.

use std::path::PathBuf;

/// Why a trainer call failed.
#[derive(Debug, thiserror::Error)]
pub enum TrainerError {
    /// An error from wick's libraries (strategy, collectives, tensors, options).
    #[error(transparent)]
    Wick(#[from] wick_core::Error),
    /// One or more ranks failed; `rank` is the one that failed first, and `ranks` has every
    /// failing rank's own error, each prefixed by its rank.
    #[error("rank {rank} failed: {message}")]
    RankFailed {
        /// The rank whose failure caused the others.
        rank: usize,
        /// Its error.
        message: String,
        /// Every failing rank with its error message.
        ranks: Vec<(usize, String)>,
    },
    /// Parameters received no gradient at the first step and the trainer was asked to
    /// refuse that (`TrainerBuilder::error_on_unused_parameters`).
    #[error(
        "{} parameter(s) received no gradient at the first step (a layer without backward, \
         such as candle-nn's fused LayerNorm, or one the loss does not use): {}",
        names.len(),
        names.join(", ")
    )]
    UnusedParameters {
        /// The parameters, by name.
        names: Vec<String>,
    },
    /// A step's loss or reduced gradients held inf or NaN, under
    /// [`OnNonFinite::Error`](wick_core::OnNonFinite::Error) (the default).
    #[error("non-finite {what} at step {step} on rank {rank}; --on-nonfinite skip (TrainerBuilder::on_nonfinite) skips such steps instead")]
    NonFinite {
        /// The optimizer step (from 1).
        step: usize,
        /// The rank that found it (for gradients: the first whose part holds one).
        rank: usize,
        /// What: the loss and its value, or the first parameter whose gradient holds one.
        what: String,
    },
    /// Every reduced gradient was zero at the first optimizer step: nothing would train.
    /// A run fails here rather than go on at a loss that cannot move (the silent failure
    /// of QLoRA under FSDP elsewhere).
    #[error("every gradient is zero at step 1 (global norm 0): nothing would train; are all targets ignored, or does the loss not reach a trainable parameter?")]
    ZeroGradient,
    /// A checkpoint could not be saved or loaded.
    #[error(transparent)]
    Checkpoint(#[from] crate::checkpoint::CheckpointError),
    /// Fit stopped early because a preemption was asked for ([`Preemption`](crate::Preemption)):
    /// every rank finished the same optimizer step and, when checkpoints are configured,
    /// saved it.
    #[error("{}", interrupted(*signal, *step, checkpoint.as_deref()))]
    Interrupted {
        /// The signal this process received; `None` when it reached another rank only.
        signal: Option<i32>,
        /// The last optimizer step done.
        step: usize,
        /// The checkpoint of that step.
        checkpoint: Option<PathBuf>,
    },
    /// Writing logs failed.
    #[error("{}: {cause}", path.display())]
    Io {
        /// The file.
        path: PathBuf,
        /// The cause (in the message, not a separate source: it prints once).
        cause: std::io::Error,
    },
}

/// [`TrainerError::Interrupted`]'s message.
fn interrupted(signal: Option<i32>, step: usize, checkpoint: Option<&std::path::Path>) -> String {
    let by = match signal {
        Some(s) => crate::preemption::signal_name(s),
        None => "a signal to another rank".into(),
    };
    let saved = match checkpoint {
        Some(dir) => format!("saved {}", dir.display()),
        None => "no checkpoint saved (none configured)".into(),
    };
    format!("interrupted by {by} after step {step}; {saved}")
}

impl TrainerError {
    /// Shorthand for an invalid option.
    pub fn config(option: &str, message: impl Into<String>) -> Self {
        TrainerError::Wick(wick_core::Error::config(option, message))
    }

    /// The collective error this error is or carries, however deep: a collective run
    /// inside a Candle op (zero3's and fsdp's) arrives wrapped in the op's error.
    pub(crate) fn collective(&self) -> Option<&wick_core::CollectiveError> {
        match self {
            TrainerError::Wick(e) => wick_core::CollectiveError::find_in(e),
            other => wick_core::CollectiveError::find_in(other),
        }
    }
}

impl From<candle_core::Error> for TrainerError {
    fn from(e: candle_core::Error) -> Self {
        TrainerError::Wick(wick_core::Error::Candle(e))
    }
}

impl From<wick_core::CollectiveError> for TrainerError {
    fn from(e: wick_core::CollectiveError) -> Self {
        TrainerError::Wick(wick_core::Error::Collective(e))
    }
}
