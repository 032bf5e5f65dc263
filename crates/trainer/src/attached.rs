//! A module as the trainer's stages take it, carrying what a trainer set up for it (its
//! session): the rank replicas and strategies that hold its parameters between stages.

use std::ops::Deref;
use wick_core::RankStrategy;

/// A module in the form in which [`Trainer`](crate::Trainer)'s stages take it, with what
/// they set up for it.
///
/// What a trainer sets up for a module (the rank replicas and the strategies that hold its
/// sharded parameters and optimizer state) is kept in its `Attached`, so that
/// [`Trainer::validate`](crate::Trainer::validate) after a fit sees the trained weights,
/// even with other modules fitted by the same trainer in between. That state belongs to
/// this `Attached` and to no other: a module dropped, or a variable given a new
/// `Attached`, is a new module to every trainer, configured afresh. A stage of another
/// trainer sets the module up again under its own strategy.
///
/// It reads as the module ([`Deref`]) but gives no `&mut` to it, since a module swapped in
/// place would inherit the old one's state: take it out with [`Attached::into_inner`].
///
/// ```
/// use wick_trainer::Attached;
///
/// let a = Attached::new(vec![1.0f32, 2.0]);
/// assert_eq!(a.len(), 2);
/// assert_eq!(a.num_parameters(), None); // no trainer configured it yet
/// assert_eq!(a.into_inner(), vec![1.0, 2.0]);
/// ```
pub struct Attached<M> {
    module: M,
    session: Option<Session<M>>,
}

/// What one trainer set up for a module: each local rank's strategy, made when the module
/// created its parameters, and the modules of the local ranks after the first (whose module
/// is the `Attached` one). It exists only once every local rank set the module up.
pub(crate) struct Session<M> {
    /// The identity of the [`Trainer`](crate::Trainer) that set it up.
    pub(crate) trainer: u64,
    pub(crate) strategies: Vec<Box<dyn RankStrategy>>,
    pub(crate) replicas: Vec<M>,
}

impl<M: std::fmt::Debug> std::fmt::Debug for Attached<M> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Attached")
            .field("module", &self.module)
            .field("configured", &self.session.is_some())
            .finish()
    }
}

impl<M> Attached<M> {
    /// `module`, not yet configured by any trainer.
    pub fn new(module: M) -> Self {
        Self {
            module,
            session: None,
        }
    }

    /// The module, no longer known to any trainer.
    pub fn into_inner(self) -> M {
        self.module
    }

    /// The first rank's strategy of the session, once a trainer configured this module.
    fn configured(&self) -> Option<&dyn RankStrategy> {
        Some(self.session.as_ref()?.strategies.first()?.as_ref())
    }

    /// Trainable scalar parameters, once a trainer configured this module.
    pub fn num_parameters(&self) -> Option<usize> {
        self.configured().map(|s| s.num_parameters())
    }

    /// Frozen scalar parameters (no gradient, no optimizer state: LoRA's base weights),
    /// once a trainer configured this module.
    pub fn num_frozen_parameters(&self) -> Option<usize> {
        self.configured().map(|s| s.num_frozen_parameters())
    }

    /// Model-state bytes the first local rank holds, once a trainer configured this module
    /// (after a fit, gradients and optimizer state included).
    pub fn state_bytes(&self) -> Option<wick_core::StateBytes> {
        self.configured().map(|s| s.state_bytes())
    }

    /// The module and the session of `trainer`, for the trainer's own stages only: the
    /// session it set up before, or `None` (another trainer's is dropped).
    pub(crate) fn parts_for(&mut self, trainer: u64) -> (&mut M, &mut Option<Session<M>>) {
        if self.session.as_ref().is_some_and(|s| s.trainer != trainer) {
            self.session = None;
        }
        (&mut self.module, &mut self.session)
    }
}

impl<M> Deref for Attached<M> {
    type Target = M;

    fn deref(&self) -> &M {
        &self.module
    }
}

impl<M> From<M> for Attached<M> {
    fn from(module: M) -> Self {
        Self::new(module)
    }
}
