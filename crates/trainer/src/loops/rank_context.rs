//! What one rank runs a stage with.

use super::CallbackList;
use crate::config::Config;
use crate::logging::progress::Progress;
use crate::logging::sinks::StepSinks;
use std::sync::Arc;
use wick_accelerator::RankEnv;
use wick_core::{RankStrategy, WaitClock};

/// A rank's context for one stage, plain data: its environment, the clock of its
/// collectives, its module and strategy, its callbacks, the trainer's configuration, and
/// on rank 0 the terminal's bars and the fit's step sinks. The loops take it by reference
/// and own their own state.
pub(crate) struct RankContext<'a, M> {
    pub(crate) env: RankEnv,
    /// The time this rank spent in collectives (its world is `env.world`).
    pub(crate) clock: Arc<WaitClock>,
    /// Rank 0's bars on a terminal.
    pub(crate) bars: Option<Progress>,
    /// Rank 0's step sinks (the metrics file, the program's), during fit.
    pub(crate) sinks: StepSinks<'a>,
    pub(crate) module: &'a mut M,
    pub(crate) strategy: &'a mut dyn RankStrategy,
    pub(crate) callbacks: CallbackList,
    pub(crate) config: &'a Config,
}
