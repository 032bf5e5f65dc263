//! `ThreadWorld`: W ranks as threads of one process, exchanging tensors through shared memory.
//!
//! Each call publishes pointers to the rank's buffers, meets the others at a barrier, then
//! every rank copies or reduces directly from its peers' buffers into its own: one copy per
//! byte moved, nothing allocated per call. A second barrier keeps every buffer alive until
//! all peers are done reading it.

use crate::barrier::RankBarrier;
use crate::reduce::reduce_ranks;
use candle_core::{DType, Tensor};
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use wick_core::host::{with_bytes, with_bytes_mut, with_bytes_mut_from, HostAccessError};
use wick_core::{Collective, CollectiveError, ReduceOp};

/// How long a rank waits for its peers before a collective fails with a timeout.
const DEFAULT_TIMEOUT: Duration = Duration::from_secs(600);

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(usize)]
enum Op {
    AllGather = 1,
    ReduceScatter,
    AllReduce,
    Broadcast,
    Barrier,
}

impl Op {
    fn name(self) -> &'static str {
        match self {
            Op::AllGather => "all_gather",
            Op::ReduceScatter => "reduce_scatter",
            Op::AllReduce => "all_reduce",
            Op::Broadcast => "broadcast",
            Op::Barrier => "barrier",
        }
    }
}

/// What one rank published for the call in progress. Written by its owner before the first
/// barrier and read by peers after it; the barrier's lock orders the accesses.
#[derive(Default)]
struct Slot {
    op: AtomicUsize,
    arg: AtomicUsize,
    dtype: AtomicUsize,
    src: AtomicUsize,
    src_len: AtomicUsize,
    dst: AtomicUsize,
    dst_len: AtomicUsize,
}

#[derive(Clone, Copy)]
struct Published {
    op: usize,
    arg: usize,
    /// The element type ([`dtype_code`]); lengths count elements.
    dtype: usize,
    src: *const u8,
    src_len: usize,
    dst: *mut u8,
    dst_len: usize,
}

impl Slot {
    fn publish(&self, p: Published) {
        self.op.store(p.op, Ordering::Relaxed);
        self.arg.store(p.arg, Ordering::Relaxed);
        self.dtype.store(p.dtype, Ordering::Relaxed);
        self.src.store(p.src as usize, Ordering::Relaxed);
        self.src_len.store(p.src_len, Ordering::Relaxed);
        self.dst.store(p.dst as usize, Ordering::Relaxed);
        self.dst_len.store(p.dst_len, Ordering::Relaxed);
    }

    fn read(&self) -> Published {
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

struct Shared {
    size: usize,
    slots: Vec<Slot>,
    barrier: RankBarrier,
    timeout: Duration,
    /// Worlds split from this one, keyed by (split call, color), with their members' ranks
    /// here: a failure or departure here is passed on to them.
    children: Mutex<HashMap<(u64, usize), Child>>,
}

/// A world split from another: its members' ranks in the parent, and the world.
type Child = (Vec<usize>, ThreadWorld);

/// A world of ranks that are threads of this process.
#[derive(Clone)]
pub struct ThreadWorld {
    shared: Arc<Shared>,
}

/// Why a rank of [`ThreadWorld::run`] did not return a value.
#[derive(Debug, thiserror::Error)]
pub enum RankError<E> {
    /// The rank's closure returned an error.
    #[error("{0}")]
    Failed(E),
    /// The rank's closure panicked.
    #[error("panicked: {0}")]
    Panicked(String),
}

impl ThreadWorld {
    /// A world of `size` ranks (at least 1).
    pub fn new(size: usize) -> Self {
        Self::with_timeout(size, DEFAULT_TIMEOUT)
    }

    /// A world whose collectives give up after `timeout` without progress.
    pub fn with_timeout(size: usize, timeout: Duration) -> Self {
        assert!(size > 0, "a world needs at least one rank");
        ThreadWorld {
            shared: Arc::new(Shared {
                size,
                slots: (0..size).map(|_| Slot::default()).collect(),
                barrier: RankBarrier::new(size, timeout),
                timeout,
                children: Mutex::default(),
            }),
        }
    }

    /// The number of ranks.
    pub fn size(&self) -> usize {
        self.shared.size
    }

    /// The handle rank `rank` uses to take part in collectives.
    pub fn comm(&self, rank: usize) -> ThreadComm {
        assert!(rank < self.shared.size, "rank {rank} out of range");
        ThreadComm {
            rank,
            shared: self.shared.clone(),
            splits: AtomicU64::new(0),
        }
    }

    fn children(&self) -> Vec<Child> {
        let children = self
            .shared
            .children
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        children.values().cloned().collect()
    }

    /// Records that `rank` finished; worlds split from this one see it leave too.
    fn leave(&self, rank: usize) {
        self.shared.barrier.leave(rank);
        for (members, child) in self.children() {
            if let Some(sub) = members.iter().position(|&m| m == rank) {
                child.leave(sub);
            }
        }
    }

    /// Records that `rank` failed: every pending and later collective of the other ranks
    /// returns an error naming it.
    pub fn fail(&self, rank: usize, reason: impl Into<String>) {
        let reason = reason.into();
        self.shared.barrier.fail(rank, reason.clone());
        for (_, child) in self.children() {
            child.fail(rank, reason.clone());
        }
    }

    /// Runs `f` on every rank, each on its own thread, and returns each rank's outcome in
    /// rank order. A rank that errors or panics is reported to the others at once, so none
    /// of them hangs waiting for it.
    pub fn run<T, E, F>(&self, f: F) -> Vec<Result<T, RankError<E>>>
    where
        T: Send,
        E: std::fmt::Display + Send,
        F: Fn(ThreadComm) -> Result<T, E> + Sync,
    {
        std::thread::scope(|scope| {
            let handles: Vec<_> = (0..self.size())
                .map(|rank| {
                    let f = &f;
                    let comm = self.comm(rank);
                    std::thread::Builder::new()
                        .name(format!("wick-rank-{rank}"))
                        .spawn_scoped(scope, move || self.run_rank(rank, comm, f))
                        .expect("spawning a rank thread")
                })
                .collect();
            handles
                .into_iter()
                .map(|h| {
                    h.join()
                        .unwrap_or_else(|p| Err(RankError::Panicked(panic_message(&p))))
                })
                .collect()
        })
    }

    fn run_rank<T, E: std::fmt::Display, F: Fn(ThreadComm) -> Result<T, E>>(
        &self,
        rank: usize,
        comm: ThreadComm,
        f: &F,
    ) -> Result<T, RankError<E>> {
        let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| f(comm)));
        match outcome {
            Ok(Ok(value)) => {
                self.leave(rank);
                Ok(value)
            }
            Ok(Err(e)) => {
                self.fail(rank, e.to_string());
                Err(RankError::Failed(e))
            }
            Err(payload) => {
                let message = panic_message(&payload);
                self.fail(rank, format!("panicked: {message}"));
                Err(RankError::Panicked(message))
            }
        }
    }
}

fn panic_message(payload: &Box<dyn std::any::Any + Send>) -> String {
    if let Some(s) = payload.downcast_ref::<&str>() {
        s.to_string()
    } else if let Some(s) = payload.downcast_ref::<String>() {
        s.clone()
    } else {
        "unknown panic payload".to_string()
    }
}

/// One rank's handle on a [`ThreadWorld`]; implements [`Collective`] for f32 CPU tensors.
pub struct ThreadComm {
    rank: usize,
    shared: Arc<Shared>,
    /// Split calls made so far (the same count on every rank at the same point).
    splits: AtomicU64,
}

/// The element types a thread world moves, as published codes.
const DTYPES: [DType; 3] = [DType::F32, DType::BF16, DType::F16];

fn dtype_code(dtype: DType) -> usize {
    DTYPES
        .iter()
        .position(|&d| d == dtype)
        .unwrap_or(usize::MAX)
}

impl ThreadComm {
    fn unsupported(&self, op: Op) -> impl Fn(HostAccessError) -> CollectiveError + '_ {
        move |e| CollectiveError::Unsupported {
            rank: self.rank,
            op: op.name(),
            message: e.0,
        }
    }

    fn mismatch(&self, op: Op, message: String) -> CollectiveError {
        CollectiveError::Mismatch {
            rank: self.rank,
            op: op.name(),
            message,
        }
    }

    /// What rank `s` published for the call in progress.
    fn peer(&self, s: usize) -> Published {
        self.shared.slots[s].read()
    }

    /// Publishes this rank's buffers, waits for all ranks, checks they agree on the call,
    /// runs `work` (which reads peers through [`ThreadComm::peer`]), and waits until every
    /// rank is done with every buffer.
    fn exchange(
        &self,
        mine: Published,
        op: Op,
        work: impl FnOnce() -> Result<(), CollectiveError>,
    ) -> Result<(), CollectiveError> {
        let shared = &*self.shared;
        shared.slots[self.rank].publish(mine);
        shared.barrier.wait(self.rank, op.name())?;
        // Every rank evaluates the same check on the same published data, so either all
        // ranks run `work` or all return the same mismatch.
        let outcome = self.check_agreement(op).and_then(|()| work());
        shared.barrier.wait(self.rank, op.name())?;
        outcome
    }

    fn check_agreement(&self, op: Op) -> Result<(), CollectiveError> {
        let first = self.peer(0);
        for s in 0..self.shared.size {
            let p = self.peer(s);
            if p.op != op as usize {
                return Err(self.mismatch(
                    op,
                    format!("rank {s} called a different collective at the same point"),
                ));
            }
            if p.arg != first.arg {
                return Err(self.mismatch(
                    op,
                    format!(
                        "rank {s} passed {} where rank 0 passed {}",
                        p.arg, first.arg
                    ),
                ));
            }
            if p.dtype != first.dtype {
                return Err(self.mismatch(op, format!("rank {s} passed another dtype than rank 0")));
            }
        }
        Ok(())
    }

    fn same_lengths(
        &self,
        op: Op,
        len: impl Fn(Published) -> usize,
    ) -> Result<usize, CollectiveError> {
        let first = len(self.peer(0));
        if (0..self.shared.size).any(|s| len(self.peer(s)) != first) {
            return Err(self.mismatch(op, "ranks passed buffers of different lengths".into()));
        }
        Ok(first)
    }

    fn offsets_check(
        &self,
        op: Op,
        lens: impl Fn(Published) -> usize,
        total: usize,
    ) -> Result<(), CollectiveError> {
        let sum: usize = (0..self.shared.size).map(|s| lens(self.peer(s))).sum();
        if sum != total {
            return Err(self.mismatch(
                op,
                format!(
                    "the ranks' shards add up to {sum} elements but the full buffer holds {total}"
                ),
            ));
        }
        Ok(())
    }

    /// All-gather on host bytes of `dtype`: every rank's `src`, in rank order, into `dst`.
    fn gather_bytes(
        &self,
        dtype: DType,
        src: &[u8],
        dst: &mut [u8],
    ) -> Result<(), CollectiveError> {
        let op = Op::AllGather;
        let elem = dtype.size_in_bytes();
        let mine = Published {
            op: op as usize,
            arg: 0,
            dtype: dtype_code(dtype),
            src: src.as_ptr(),
            src_len: src.len() / elem,
            dst: dst.as_mut_ptr(),
            dst_len: dst.len() / elem,
        };
        self.exchange(mine, op, || {
            let total = self.same_lengths(op, |p| p.dst_len)?;
            self.offsets_check(op, |p| p.src_len, total)?;
            let mut offset = 0;
            for s in 0..self.shared.size {
                let p = self.peer(s);
                // SAFETY: rank s's shard is valid for src_len elements until the closing
                // barrier, and nobody writes it during the call; our destination range is
                // in bounds (checked above) and only this rank writes it.
                unsafe {
                    std::ptr::copy_nonoverlapping(
                        p.src,
                        mine.dst.add(offset * elem),
                        p.src_len * elem,
                    );
                }
                offset += p.src_len;
            }
            Ok(())
        })
    }
}

impl Collective for ThreadComm {
    fn rank(&self) -> usize {
        self.rank
    }

    fn world_size(&self) -> usize {
        self.shared.size
    }

    fn all_gather_into(&self, shard: &Tensor, full: &Tensor) -> Result<(), CollectiveError> {
        with_bytes_mut_from(full, shard, |dst, src| {
            self.gather_bytes(shard.dtype(), src, dst)
        })
        .map_err(self.unsupported(Op::AllGather))?
    }

    fn all_gather_host(&self, shard: &Tensor, full: &mut [u8]) -> Result<(), CollectiveError> {
        with_bytes(shard, |src| self.gather_bytes(shard.dtype(), src, full))
            .map_err(self.unsupported(Op::AllGather))?
    }

    fn reduce_scatter_into(
        &self,
        full: &Tensor,
        shard: &Tensor,
        reduce: ReduceOp,
    ) -> Result<(), CollectiveError> {
        let op = Op::ReduceScatter;
        let dtype = full.dtype();
        let elem = dtype.size_in_bytes();
        with_bytes_mut_from(shard, full, |dst, src| {
            let mine = Published {
                op: op as usize,
                arg: reduce as usize,
                dtype: dtype_code(dtype),
                src: src.as_ptr(),
                src_len: src.len() / elem,
                dst: dst.as_mut_ptr(),
                dst_len: dst.len() / elem,
            };
            self.exchange(mine, op, || {
                let total = self.same_lengths(op, |p| p.src_len)?;
                self.offsets_check(op, |p| p.dst_len, total)?;
                let offset: usize = (0..self.rank).map(|s| self.peer(s).dst_len).sum();
                // SAFETY: every full buffer holds `total` elements and is read-only during
                // the call; our shard is written by this rank alone.
                unsafe {
                    reduce_ranks(
                        dtype,
                        mine.dst,
                        mine.dst_len,
                        self.shared.size,
                        |s| self.peer(s).src.add(offset * elem),
                        reduce,
                    );
                }
                Ok(())
            })
        })
        .map_err(self.unsupported(op))?
    }

    fn all_reduce_in_place(
        &self,
        tensor: &Tensor,
        reduce: ReduceOp,
    ) -> Result<(), CollectiveError> {
        let op = Op::AllReduce;
        let dtype = tensor.dtype();
        let elem = dtype.size_in_bytes();
        with_bytes_mut(tensor, |buf| {
            let len = buf.len() / elem;
            let mine = Published {
                op: op as usize,
                arg: reduce as usize,
                dtype: dtype_code(dtype),
                src: buf.as_ptr(),
                src_len: len,
                dst: buf.as_mut_ptr(),
                dst_len: len,
            };
            let n = self.shared.size;
            let chunk = |r: usize| (r * len / n, (r + 1) * len / n);
            self.exchange(mine, op, || {
                self.same_lengths(op, |p| p.src_len)?;
                // Phase 1: this rank reduces its chunk from every buffer into its own.
                let (a, b) = chunk(self.rank);
                // SAFETY: chunk `rank` of any buffer is read only by this rank in phase 1
                // and written only in this rank's own buffer.
                unsafe {
                    reduce_ranks(
                        dtype,
                        mine.dst.add(a * elem),
                        b - a,
                        n,
                        |s| self.peer(s).src.add(a * elem),
                        reduce,
                    );
                }
                Ok(())
            })?;
            // Phase 2: copy every other rank's reduced chunk into this buffer.
            self.exchange(mine, op, || {
                for s in (0..n).filter(|&s| s != self.rank) {
                    let (a, b) = chunk(s);
                    // SAFETY: chunk s of rank s's buffer is final and read-only now; chunk s
                    // of our buffer is written only by us and read by nobody in phase 2.
                    unsafe {
                        std::ptr::copy_nonoverlapping(
                            self.peer(s).src.add(a * elem),
                            mine.dst.add(a * elem),
                            (b - a) * elem,
                        );
                    }
                }
                Ok(())
            })
        })
        .map_err(self.unsupported(op))?
    }

    fn broadcast_in_place(&self, tensor: &Tensor, root: usize) -> Result<(), CollectiveError> {
        let op = Op::Broadcast;
        if root >= self.shared.size {
            return Err(self.mismatch(
                op,
                format!(
                    "root {root} is not a rank of a world of {}",
                    self.shared.size
                ),
            ));
        }
        let dtype = tensor.dtype();
        with_bytes_mut(tensor, |buf| {
            let len = buf.len() / dtype.size_in_bytes();
            let mine = Published {
                op: op as usize,
                arg: root,
                dtype: dtype_code(dtype),
                src: buf.as_ptr(),
                src_len: len,
                dst: buf.as_mut_ptr(),
                dst_len: len,
            };
            self.exchange(mine, op, || {
                let from = self.peer(root);
                if from.src_len != mine.dst_len {
                    return Err(self.mismatch(
                        op,
                        format!(
                            "root has {} elements, this rank {}",
                            from.src_len, mine.dst_len
                        ),
                    ));
                }
                if self.rank != root {
                    // SAFETY: the root's buffer is read-only until the closing barrier.
                    unsafe { std::ptr::copy_nonoverlapping(from.src, mine.dst, buf.len()) };
                }
                Ok(())
            })
        })
        .map_err(self.unsupported(op))?
    }

    fn split(&self, color: usize) -> Result<Arc<dyn Collective>, CollectiveError> {
        let call = self.splits.fetch_add(1, Ordering::SeqCst);
        let size = self.shared.size;
        let mine = Tensor::new(&[color as f32], &candle_core::Device::Cpu)
            .map_err(|e| self.mismatch(Op::AllGather, e.to_string()))?;
        let mut colors = [0u8; 4].repeat(size);
        self.all_gather_host(&mine, &mut colors)?;
        let colors: Vec<usize> = colors
            .chunks_exact(4)
            .map(|c| f32::from_ne_bytes([c[0], c[1], c[2], c[3]]) as usize)
            .collect();
        let members: Vec<usize> = (0..size).filter(|&r| colors[r] == color).collect();
        let sub_rank = members
            .iter()
            .position(|&r| r == self.rank)
            .expect("this rank has its own color");
        let world = {
            let mut children = self
                .shared
                .children
                .lock()
                .unwrap_or_else(|p| p.into_inner());
            let (_, world) = children.entry((call, color)).or_insert_with(|| {
                (
                    members.clone(),
                    ThreadWorld::with_timeout(members.len(), self.shared.timeout),
                )
            });
            world.clone()
        };
        Ok(Arc::new(world.comm(sub_rank)))
    }

    fn barrier(&self) -> Result<(), CollectiveError> {
        // Published like any call, so a barrier facing another collective is a mismatch.
        let mine = Published {
            op: Op::Barrier as usize,
            arg: 0,
            dtype: 0,
            src: std::ptr::null(),
            src_len: 0,
            dst: std::ptr::null_mut(),
            dst_len: 0,
        };
        self.exchange(mine, Op::Barrier, || Ok(()))
    }
}
