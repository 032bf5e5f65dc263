//! Fault injection into a save, for crash tests: a hook called at each moment a crash
//! could leave a checkpoint half-written.

use std::sync::Arc;

/// A moment in a save at which a fault can be injected (for crash tests).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SavePoint {
    /// Rank `rank` has written its file.
    RankFile {
        /// The rank.
        rank: usize,
    },
    /// Rank 0 is about to write the manifest.
    Manifest,
    /// Rank 0 is about to rename the finished directory into place.
    Commit,
}

/// Called at each [`SavePoint`]; an `Err` aborts the save there, as a crash would.
pub type SaveFault = Arc<dyn Fn(SavePoint) -> Result<(), String> + Send + Sync>;
