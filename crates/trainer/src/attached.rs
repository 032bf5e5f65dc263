//! How a trainer recognises the module it configured: by an identity the module carries,
//! never by where the module happens to sit in memory.

use std::ops::Deref;
use std::sync::atomic::{AtomicU64, Ordering};

/// A module together with an identity no other module ever gets, the form in which
/// [`Trainer`](crate::Trainer)'s stages take it.
///
/// A trainer keeps what it set up for a module between stages (the rank replicas and the
/// strategies that hold its sharded parameters and optimizer state), so that
/// [`Trainer::validate`](crate::Trainer::validate) after a fit sees the trained weights.
/// That state belongs to this `Attached` and to no other: a module dropped, or a variable
/// given a new `Attached`, is a new module to every trainer, configured afresh, even where
/// the new one lands at the old one's address.
///
/// It reads as the module ([`Deref`]) but gives no `&mut` to it, since a module swapped in
/// place would inherit the old one's state: take it out with [`Attached::into_inner`].
///
/// ```
/// use wick_trainer::Attached;
///
/// let a = Attached::new(vec![1.0f32, 2.0]);
/// let b = Attached::new(vec![1.0f32, 2.0]);
/// assert_eq!(*a, *b);
/// assert_ne!(a.id(), b.id());
/// assert_eq!(a.into_inner(), vec![1.0, 2.0]);
/// ```
#[derive(Debug)]
pub struct Attached<M> {
    id: u64,
    module: M,
}

impl<M> Attached<M> {
    /// `module` with an identity of its own.
    pub fn new(module: M) -> Self {
        // Never reused within the process: 2^64 attachments is more than any run makes.
        static NEXT: AtomicU64 = AtomicU64::new(0);
        Self {
            id: NEXT.fetch_add(1, Ordering::Relaxed),
            module,
        }
    }

    /// This module's identity: distinct for every `Attached` made in this process.
    pub fn id(&self) -> u64 {
        self.id
    }

    /// The module, no longer known to any trainer.
    pub fn into_inner(self) -> M {
        self.module
    }

    /// The module, for the trainer's own stages only.
    pub(crate) fn module_mut(&mut self) -> &mut M {
        &mut self.module
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
