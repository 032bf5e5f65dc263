//! Callbacks that ship with the trainer: [`EarlyStopping`] and [`LearningRateMonitor`].
//! (Checkpointing is [`ModelCheckpoint`](crate::ModelCheckpoint), part of the trainer's
//! configuration because every rank must save at the same step.)

mod early_stopping;
mod lr_monitor;

pub use early_stopping::EarlyStopping;
pub use lr_monitor::LearningRateMonitor;
