//! What the ranks of a `ThreadWorld` share: one slot per rank for the call in progress, the
//! barrier, and the worlds split from it, which hear of every failure and departure.

use super::barrier::RankBarrier;
use crate::worlds::call::CallHeader;
use candle_core::DType;
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;
use wick_core::{lock, CallKind};

/// What one rank published for the call in progress. Written by its owner before the first
/// barrier and read by peers after it; the barrier's lock orders the accesses.
#[derive(Default)]
pub(crate) struct Slot {
    op: AtomicUsize,
    arg: AtomicUsize,
    dtype: AtomicUsize,
    src: AtomicUsize,
    src_len: AtomicUsize,
    dst: AtomicUsize,
    dst_len: AtomicUsize,
}

/// A rank's call as its peers read it: the header, and where its buffers are.
#[derive(Clone, Copy)]
pub(crate) struct Published {
    pub(crate) op: usize,
    pub(crate) arg: usize,
    /// The element type (`CallHeader::dtype`); lengths count elements.
    pub(crate) dtype: usize,
    pub(crate) src: *const u8,
    pub(crate) src_len: usize,
    pub(crate) dst: *mut u8,
    pub(crate) dst_len: usize,
}

impl Slot {
    pub(crate) fn publish(&self, p: Published) {
        self.op.store(p.op, Ordering::Relaxed);
        self.arg.store(p.arg, Ordering::Relaxed);
        self.dtype.store(p.dtype, Ordering::Relaxed);
        self.src.store(p.src as usize, Ordering::Relaxed);
        self.src_len.store(p.src_len, Ordering::Relaxed);
        self.dst.store(p.dst as usize, Ordering::Relaxed);
        self.dst_len.store(p.dst_len, Ordering::Relaxed);
    }

    pub(crate) fn read(&self) -> Published {
        Published {
            op: self.op.load(Ordering::Relaxed),
            arg: self.arg.load(Ordering::Relaxed),
            dtype: self.dtype.load(Ordering::Relaxed),
            src: self.src.load(Ordering::Relaxed) as *const u8,
            src_len: self.src_len.load(Ordering::Relaxed),
            dst: self.dst.load(Ordering::Relaxed) as *mut u8,
            dst_len: self.dst_len.load(Ordering::Relaxed),
        }
    }
}

/// What the ranks of one world share: a slot each for the call in progress, the barrier
/// that orders the calls, and the worlds split from it.
pub(crate) struct Shared {
    pub(crate) size: usize,
    pub(crate) slots: Vec<Slot>,
    pub(crate) barrier: RankBarrier,
    pub(crate) timeout: Duration,
    /// Worlds split from this one, keyed by (split call, color), with their members' ranks
    /// here: a failure or departure of a member is passed on to them. Held weakly: a
    /// split world lives while its members' handles do.
    pub(crate) children: Mutex<HashMap<(u64, usize), Child>>,
}

/// A world split from another: its members' ranks in the parent, and its shared state.
pub(crate) type Child = (Vec<usize>, Weak<Shared>);

impl Published {
    /// A call of `op` that reads `src` and writes `dst`, bytes of `dtype`.
    pub(crate) fn new(op: CallKind, dtype: DType, src: &[u8], dst: &mut [u8]) -> Self {
        Self::at(
            op,
            dtype,
            (src.as_ptr(), src.len()),
            (dst.as_mut_ptr(), dst.len()),
        )
    }

    /// A call of `op` that reads and overwrites `buf`, bytes of `dtype`.
    pub(crate) fn in_place(op: CallKind, dtype: DType, buf: &mut [u8]) -> Self {
        let (at, len) = (buf.as_mut_ptr(), buf.len());
        Self::at(op, dtype, (at.cast_const(), len), (at, len))
    }

    fn at(
        op: CallKind,
        dtype: DType,
        (src, src_bytes): (*const u8, usize),
        (dst, dst_bytes): (*mut u8, usize),
    ) -> Self {
        let elem = dtype.size_in_bytes();
        let h = CallHeader::new(op, dtype, src_bytes / elem, dst_bytes / elem);
        Published {
            op: h.op,
            arg: h.arg,
            dtype: h.dtype,
            src,
            src_len: h.src_len,
            dst,
            dst_len: h.dst_len,
        }
    }

    /// The call's header, for the agreement checks.
    pub(crate) fn header(&self) -> CallHeader {
        CallHeader {
            op: self.op,
            dtype: self.dtype,
            arg: self.arg,
            src_len: self.src_len,
            dst_len: self.dst_len,
        }
    }
}

impl Shared {
    /// The state of a new world of `size` ranks whose waits give up after `timeout`.
    pub(crate) fn new(size: usize, timeout: Duration) -> Arc<Self> {
        let waiting = (0..size).map(|_| AtomicBool::new(false)).collect();
        Self::named((0..size).collect(), waiting, timeout)
    }

    /// A world whose ranks errors name `names` (their ranks in the world split first),
    /// flagged in that world's `waiting`.
    fn named(names: Vec<usize>, waiting: Arc<[AtomicBool]>, timeout: Duration) -> Arc<Self> {
        let size = names.len();
        Arc::new(Shared {
            size,
            slots: (0..size).map(|_| Slot::default()).collect(),
            barrier: RankBarrier::new(names, waiting, timeout),
            timeout,
            children: Mutex::default(),
        })
    }

    /// The live worlds split from this one, each with this world's ranks of its members.
    fn children(&self) -> Vec<(Vec<usize>, Arc<Shared>)> {
        let mut children = lock(&self.children);
        children.retain(|_, (_, child)| child.strong_count() > 0);
        children
            .values()
            .filter_map(|(members, child)| Some((members.clone(), child.upgrade()?)))
            .collect()
    }

    /// The world that split call `key.0` made for color `key.1`, made by whichever of its
    /// `members` asks first.
    pub(crate) fn child(&self, key: (u64, usize), members: Vec<usize>) -> Arc<Shared> {
        let mut children = lock(&self.children);
        children.retain(|_, (_, child)| child.strong_count() > 0);
        if let Some(world) = children.get(&key).and_then(|(_, child)| child.upgrade()) {
            return world;
        }
        let names = members.iter().map(|&m| self.barrier.name(m)).collect();
        let world = Shared::named(names, self.barrier.waiting(), self.timeout);
        // A member may have failed or left before this world was made (the world its
        // first member made may be gone with that member's handle): it hears of it now.
        self.barrier.pass_on(&world.barrier, &members);
        children.insert(key, (members, Arc::downgrade(&world)));
        world
    }

    /// Records that `rank` finished; worlds split from this one see it leave too.
    pub(crate) fn leave(&self, rank: usize) {
        self.barrier.leave(rank);
        for (members, child) in self.children() {
            if let Some(sub) = members.iter().position(|&m| m == rank) {
                child.leave(sub);
            }
        }
    }

    /// Records that `rank` (of this world) failed, here and in every world split from this
    /// one that it is a member of; `reported` is the rank named in the errors (its rank in
    /// the world it failed in). A world it is not in goes on: its members finish the call
    /// they are in, and hear of the failure at their next call in a world shared with it.
    pub(crate) fn fail(&self, rank: usize, reported: usize, reason: String) {
        self.barrier.fail(reported, reason.clone());
        for (members, child) in self.children() {
            if let Some(sub) = members.iter().position(|&m| m == rank) {
                child.fail(sub, reported, reason.clone());
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_failure_reaches_only_the_split_worlds_of_its_rank() {
        let world = Shared::new(4, Duration::from_secs(1));
        let low = world.child((0, 0), vec![0, 1]);
        let high = world.child((0, 1), vec![2, 3]);
        world.fail(3, 3, "boom".into());
        assert!(low.barrier.failure().is_none());
        let failed = high.barrier.failure();
        // Rank 3 of the parent is rank 1 of its group, named by its parent rank.
        assert_eq!(failed.map(|(rank, _)| rank), Some(3));
    }

    #[test]
    fn a_split_world_lives_while_its_handles_do() {
        let world = Shared::new(2, Duration::from_secs(1));
        let child = world.child((0, 0), vec![0, 1]);
        assert!(Arc::ptr_eq(&child, &world.child((0, 0), vec![0, 1])));
        drop(child);
        assert!(world.children().is_empty());
        assert!(lock(&world.children).is_empty());
    }
}
