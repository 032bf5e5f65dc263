//! `MpiWorld` in a build without the `mpi` feature: the same names as the real one, so the
//! accelerator has one code path; there is never a value of it, and asking for the process
//! world is a clear error.

use std::convert::Infallible;
use std::sync::Arc;
use wick_core::CollectiveError;

/// Ranks as processes over MPI, in a build without the `mpi` feature: it cannot be made;
/// [`MpiWorld::process_world`] says how to get the real one.
pub struct MpiWorld {
    never: Infallible,
}

impl MpiWorld {
    /// Whether this build has MPI: `false` here.
    pub const ENABLED: bool = false;

    /// An error: this build has no MPI.
    pub fn process_world() -> Result<Arc<MpiWorld>, CollectiveError> {
        Err(CollectiveError::Unsupported {
            rank: 0,
            op: "init",
            message: "this wick was built without the `mpi` feature; rebuild with \
                      `--features mpi` to run ranks as processes"
                .into(),
        })
    }

    /// Ends the job (unreachable: no value of this type exists).
    pub fn abort(&self, _code: i32) -> ! {
        match self.never {}
    }
}

crate::worlds::stand_in_collective!(MpiWorld);

#[cfg(test)]
mod tests {
    #[test]
    fn asking_for_the_process_world_says_which_feature_is_missing() {
        let e = super::MpiWorld::process_world().err().unwrap().to_string();
        assert!(e.contains("--features mpi"), "{e}");
    }
}
