//! How the trainer gets one module per rank when ranks are threads of this process.

use wick_core::TrainModule;

/// A module the trainer can copy for other rank threads.
///
/// Every `TrainModule + Clone` is one (the copy is made before `configure_sharded_model`,
/// so it is cheap). A module that cannot be cloned implements it returning `None`: it then
/// trains as the one rank of its process, under a launcher (`mpirun`, `srun`) or on one
/// device, and asking for more ranks as threads is a clear error.
pub trait Replicate: TrainModule + Sized {
    /// A copy for another rank thread, or `None` when this module cannot be copied.
    fn replica(&self) -> Option<Self>;
}

impl<M: TrainModule + Clone> Replicate for M {
    fn replica(&self) -> Option<Self> {
        Some(self.clone())
    }
}
