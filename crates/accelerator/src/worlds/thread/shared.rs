//! What the ranks of a `ThreadWorld` share: one slot per rank for the call in progress, the
//! barrier, and the worlds split from it, which hear of every failure and departure.

use super::barrier::RankBarrier;
use crate::worlds::call::{CallHeader, Op};
use candle_core::DType;
use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use wick_core::lock;

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
    /// here: a failure or departure here is passed on to them.
    pub(crate) children: Mutex<HashMap<(u64, usize), Child>>,
}

/// A world split from another: its members' ranks in the parent, and its shared state.
pub(crate) type Child = (Vec<usize>, Arc<Shared>);

impl Published {
    /// A call of `op` that reads `src` and writes `dst`, bytes of `dtype`.
    pub(crate) fn new(op: Op, arg: usize, dtype: DType, src: &[u8], dst: &mut [u8]) -> Self {
        Self::at(
            op,
            arg,
            dtype,
            (src.as_ptr(), src.len()),
            (dst.as_mut_ptr(), dst.len()),
        )
    }

    /// A call of `op` that reads and overwrites `buf`, bytes of `dtype`.
    pub(crate) fn in_place(op: Op, arg: usize, dtype: DType, buf: &mut [u8]) -> Self {
        let (at, len) = (buf.as_mut_ptr(), buf.len());
        Self::at(op, arg, dtype, (at.cast_const(), len), (at, len))
    }

    fn at(
        op: Op, arg: usize, dtype: DType, (src, src_bytes): (*const u8, usize),
        (dst, dst_bytes): (*mut u8, usize),
    ) -> Self {
        let elem = dtype.size_in_bytes();
        let h = CallHeader::new(op, dtype, arg, src_bytes / elem, dst_bytes / elem);
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
        Arc::new(Shared {
            size,
            slots: (0..size).map(|_| Slot::default()).collect(),
            barrier: RankBarrier::new(size, timeout),
            timeout,
            children: Mutex::default(),
        })
    }

    fn children(&self) -> Vec<Child> {
        lock(&self.children).values().cloned().collect()
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

    /// Records that `rank` failed, here and in every world split from this one.
    pub(crate) fn fail(&self, rank: usize, reason: String) {
        self.barrier.fail(rank, reason.clone());
        for (_, child) in self.children() {
            child.fail(rank, reason.clone());
        }
    }
}
