//! `ThreadComm`: one rank's collectives over a `ThreadWorld`, through shared memory.
//!
//! Each call publishes pointers to the rank's buffers, meets the others at a barrier, then
//! every rank copies or reduces directly from its peers' buffers into its own: one copy per
//! byte moved, nothing allocated per call. A second barrier keeps every buffer alive until
//! all peers are done reading it.

use super::shared::{Published, Shared};
use crate::worlds::call::{CallHeader, Headers};
use crate::worlds::host_calls::{run_on_host, Done, HostEngine};
use crate::worlds::reduce::reduce_ranks;
use candle_core::DType;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use wick_core::{Call, CallKind, Collective, CollectiveError, Position, ReduceOp, Work};

/// One rank's handle on a [`ThreadWorld`](super::ThreadWorld); implements [`Collective`] for f32, bf16 and f16
/// CPU tensors.
pub struct ThreadComm {
    rank: usize,
    shared: Arc<Shared>,
    /// Split calls made so far (the same count on every rank at the same point).
    splits: AtomicU64,
}

impl ThreadComm {
    pub(crate) fn new(rank: usize, shared: Arc<Shared>) -> Self {
        ThreadComm {
            rank,
            shared,
            splits: AtomicU64::new(0),
        }
    }

    fn mismatch(&self, op: CallKind, message: String) -> CollectiveError {
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
    /// rank is done with every buffer: also when `work` fails or panics, since the closing
    /// wait is the guard's drop (see `barrier.rs`).
    fn exchange(
        &self,
        mine: Published,
        op: CallKind,
        work: impl FnOnce() -> Result<(), CollectiveError>,
    ) -> Result<(), CollectiveError> {
        let shared = &*self.shared;
        shared.slots[self.rank].publish(mine);
        let _closing = shared.barrier.open(self.rank, op.name())?;
        // Every rank evaluates the same check on the same published data, so either all
        // ranks run `work` or all return the same mismatch.
        self.check_agreement(op).and_then(|()| work())
    }

    /// Every rank's header of the call in progress, for the checks all ranks run.
    fn headers(&self, op: CallKind) -> Headers<impl Fn(usize) -> CallHeader + '_> {
        Headers {
            rank: self.rank,
            size: self.shared.size,
            op,
            of: move |s| self.peer(s).header(),
        }
    }

    fn check_agreement(&self, op: CallKind) -> Result<(), CollectiveError> {
        self.headers(op).agree()
    }

    fn same_lengths(
        &self,
        op: CallKind,
        len: impl Fn(CallHeader) -> usize,
    ) -> Result<usize, CollectiveError> {
        self.headers(op).same_length(len)
    }

    fn offsets_check(
        &self,
        op: CallKind,
        lens: impl Fn(CallHeader) -> usize,
        total: usize,
    ) -> Result<(), CollectiveError> {
        self.headers(op).shards_add_up(lens, total)
    }
}

/// The byte-level calls, which `run_on_host` lends a call's tensors to.
impl HostEngine for ThreadComm {
    fn rank(&self) -> usize {
        self.rank
    }

    fn size(&self) -> usize {
        self.shared.size
    }

    /// All-gather on host bytes of `dtype`: every rank's `src`, in rank order, into `dst`.
    fn gather_bytes(&self, dtype: DType, src: &[u8], dst: &mut [u8]) -> Done {
        let op = CallKind::AllGather;
        let elem = dtype.size_in_bytes();
        let mine = Published::new(op, dtype, src, dst);
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

    fn reduce_scatter_bytes(&self, dtype: DType, src: &[u8], dst: &mut [u8], op: ReduceOp) -> Done {
        let kind = CallKind::ReduceScatter(op);
        let elem = dtype.size_in_bytes();
        let mine = Published::new(kind, dtype, src, dst);
        self.exchange(mine, kind, || {
            let total = self.same_lengths(kind, |p| p.src_len)?;
            self.offsets_check(kind, |p| p.dst_len, total)?;
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
                    op,
                );
            }
            Ok(())
        })
    }

    fn all_reduce_bytes(&self, dtype: DType, buf: &mut [u8], op: ReduceOp) -> Done {
        let kind = CallKind::AllReduce(op);
        let elem = dtype.size_in_bytes();
        let len = buf.len() / elem;
        let mine = Published::in_place(kind, dtype, buf);
        let n = self.shared.size;
        let chunk = |r: usize| (r * len / n, (r + 1) * len / n);
        self.exchange(mine, kind, || {
            self.same_lengths(kind, |p| p.src_len)?;
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
                    op,
                );
            }
            Ok(())
        })?;
        // Phase 2: copy every other rank's reduced chunk into this buffer.
        self.exchange(mine, kind, || {
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
    }

    fn broadcast_bytes(&self, dtype: DType, buf: &mut [u8], root: usize) -> Done {
        let op = CallKind::Broadcast(root);
        let mine = Published::in_place(op, dtype, buf);
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
    }

    fn barrier(&self) -> Done {
        // Published like any call, so a barrier facing another collective is a mismatch.
        let mine = Published::in_place(CallKind::Barrier, DType::F32, &mut []);
        self.exchange(mine, CallKind::Barrier, || Ok(()))
    }
}

impl Collective for ThreadComm {
    fn position(&self) -> Position {
        Position::new(self.rank, self.shared.size)
    }

    /// Every call completes here: ranks as threads move bytes by copying from each other's
    /// buffers, with no progress engine to leave a call to. Uneven parts go as they are:
    /// every rank's shard length travels in the call's header, and the header check holds
    /// them against the full buffer.
    fn start(&self, call: Call<'_>) -> Result<Work, CollectiveError> {
        run_on_host(self, call).map(|()| Work::done())
    }

    fn split(&self, color: usize) -> Result<Arc<dyn Collective>, CollectiveError> {
        let call = self.splits.fetch_add(1, Ordering::SeqCst);
        let size = self.shared.size;
        // Each color's 8 bytes travel as they are (the gather copies bits; F32 names only
        // the element size), so colors never collide, however large.
        let mut colors = vec![0u8; 8 * size];
        self.gather_bytes(DType::F32, &(color as u64).to_le_bytes(), &mut colors)?;
        let colors: Vec<u64> = colors
            .chunks_exact(8)
            .map(|c| u64::from_le_bytes(c.try_into().expect("8 bytes")))
            .collect();
        let members: Vec<usize> = (0..size).filter(|&r| colors[r] == color as u64).collect();
        let sub_rank = members
            .iter()
            .position(|&r| r == self.rank)
            .expect("this rank has its own color");
        let world = self.shared.child((call, color), members);
        Ok(Arc::new(ThreadComm::new(sub_rank, world)))
    }
}
