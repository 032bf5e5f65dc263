//! Checkpoints: a directory with one safetensors file per rank (its ranges of the parameters
//! and optimizer state) and a JSON manifest written last (docs/design.md, "Checkpoints").
//!
//! Saving is crash-safe (temporary names, renamed into place); loading checks the whole
//! checkpoint before it changes anything and reads by parameter name, so it loads at any
//! world size; [`consolidate`] turns one into a plain safetensors file.

mod checkpoint_weights;
mod consolidate;
mod error;
mod fault;
mod files;
mod manifest;
mod model_checkpoint;
mod path;
mod pending;
mod reader;
mod save;

pub use consolidate::consolidate;
pub use error::CheckpointError;
pub use fault::{SaveFault, SavePoint};
pub(crate) use files::check_writable;
pub use manifest::{
    DataPosition, FileRecord, GroupRecord, LossScaleRecord, LrScheduleRecord, Manifest,
    OptimizerRecord, ParamRecord, PieceRecord, RngRecord, FISHER_YATES, FORMAT, FORMAT_VERSION,
    MANIFEST_FILE,
};
pub use model_checkpoint::{Mode, ModelCheckpoint, LAST_FILE};
pub use path::resolve_checkpoint;
pub(crate) use pending::PendingSave;
pub use reader::Checkpoint;
pub(crate) use save::{begin, save, SaveInfo};
