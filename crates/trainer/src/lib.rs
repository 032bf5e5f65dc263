//! wick-trainer: the `Trainer`, which sequences a run and nothing more.
//!
//! It owns the stage order of fit, validate, test and predict (DESIGN.md), the training and
//! evaluation loops, callbacks, how each global batch is split over the ranks ([`DataLoader`]),
//! the metrics CSV and the progress bar. Devices, worlds and the sharded setup belong to
//! wick-accelerator; parameter layout and optimizer state to the strategy.

mod data;
mod error;
mod metrics_csv;
mod progress;
mod rank_run;
mod summary;
mod trainer;

pub use data::{DataLoader, Dataset};
pub use error::TrainerError;
pub use trainer::{Metrics, Trainer, TrainerBuilder};
