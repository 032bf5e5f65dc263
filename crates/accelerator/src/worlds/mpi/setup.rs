//! MPI's setup for `MpiWorld`: initialization once per process with a thread level that
//! allows calls from any thread, `MPI_Finalize` at exit, and one process-wide lock.
//!
//! MPI calls are serialized by that lock: MPI is initialized with at least
//! `MPI_THREAD_SERIALIZED`, and a rank is one process, so the lock is never contended in
//! training; it only makes the handles safe to share.

use super::MpiWorld;
use mpi::topology::SimpleCommunicator;
use mpi::traits::*;
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};
use wick_core::{lock, CollectiveError};

/// One lock for every MPI call of this process.
static MPI_LOCK: Mutex<()> = Mutex::new(());

pub(super) fn mpi_lock() -> MutexGuard<'static, ()> {
    // Nothing guarded can be left half-updated by a panic: the lock orders calls only.
    lock(&MPI_LOCK)
}

/// A communicator handle that may move between threads.
pub(super) struct Comm(pub(super) SimpleCommunicator);

// SAFETY: MPI is initialized with at least MPI_THREAD_SERIALIZED (checked in
// `MpiWorld::process_world`) and every use of the handle holds `MPI_LOCK`.
unsafe impl Send for Comm {}
unsafe impl Sync for Comm {}

/// The world of every process, made once per process.
static PROCESS_WORLD: OnceLock<Result<Arc<MpiWorld>, String>> = OnceLock::new();

extern "C" fn finalize_mpi() {
    // SAFETY: runs once at process exit, after every rank's work returned.
    unsafe {
        let mut finalized = 0;
        mpi::ffi::MPI_Finalized(&mut finalized);
        if finalized == 0 {
            mpi::ffi::MPI_Finalize();
        }
    }
}

extern "C" {
    fn atexit(f: extern "C" fn()) -> std::os::raw::c_int;
}

impl MpiWorld {
    /// Whether this build has MPI: `true` here (the `mpi` feature).
    pub const ENABLED: bool = true;

    /// The world of every process the launcher started (`MPI_COMM_WORLD`). The first call
    /// initializes MPI and arranges `MPI_Finalize` at process exit.
    pub fn process_world() -> Result<Arc<MpiWorld>, CollectiveError> {
        PROCESS_WORLD
            .get_or_init(|| {
                let _guard = mpi_lock();
                if !mpi::is_initialized() {
                    let (universe, provided) =
                        mpi::initialize_with_threading(mpi::Threading::Multiple)
                            .ok_or("MPI could not be initialized")?;
                    if provided < mpi::Threading::Serialized {
                        return Err(format!(
                            "MPI provides thread level {provided:?}; wick needs Serialized or better"
                        ));
                    }
                    // MPI_Finalize runs at exit instead of when `universe` drops: the world
                    // lives as long as the process, and MPI cannot be initialized twice.
                    std::mem::forget(universe);
                    // SAFETY: registers a plain function with the C runtime.
                    unsafe { atexit(finalize_mpi) };
                }
                Ok(Arc::new(Self::over(SimpleCommunicator::world())))
            })
            .clone()
            .map_err(|message| CollectiveError::Unsupported {
                rank: 0,
                op: "init",
                message,
            })
    }

    pub(super) fn over(comm: SimpleCommunicator) -> Self {
        MpiWorld {
            rank: comm.rank() as usize,
            size: comm.size() as usize,
            comm: Arc::new(Comm(comm)),
            scratch: Mutex::default(),
        }
    }

    /// Ends every process of the job with `code`, as `MPI_Abort` does: for a rank that
    /// failed, so that no other rank waits for it.
    pub fn abort(&self, code: i32) -> ! {
        self.comm.0.abort(code)
    }
}
