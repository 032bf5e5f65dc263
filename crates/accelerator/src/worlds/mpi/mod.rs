//! `MpiWorld`: ranks as processes over MPI (cargo feature `mpi`), through rsmpi and the
//! system's Open MPI.
//!
//! Every call first exchanges a small header (which collective, dtype, argument, lengths),
//! so that ranks that disagree all return the same `Mismatch` error instead of corrupting
//! memory or hanging, and so that uneven shards work as in `ThreadWorld`. Data then moves
//! as bytes in one MPI call. Reductions are an all-to-all of chunks followed by a local sum
//! in rank order with the same code as `ThreadWorld` (16-bit types accumulate in f32 and
//! round once), so both worlds give the same bits.
//!
//! This file is the protocol and the transport; `setup.rs` holds MPI's initialization,
//! its end, and the lock that serializes every call; `in_flight.rs` a nonblocking call
//! until its wait.

use crate::worlds::call::{CallHeader, Headers};
use crate::worlds::host::HostAccessError;
use crate::worlds::host_calls::{run_on_host, Done, HostEngine};
use crate::worlds::reduce::reduce_ranks;
use candle_core::DType;
use mpi::datatype::{Partition, PartitionMut};
use mpi::topology::Color;
use mpi::traits::*;
mod in_flight;
mod setup;
mod started;

use setup::{mpi_lock, Comm};
use std::sync::{Arc, Mutex, MutexGuard};
use wick_core::{lock, Call, CallKind, Collective, CollectiveError, Position, ReduceOp, Work};

/// One rank's collectives over an MPI communicator; implements [`Collective`] for f32,
/// bf16 and f16 CPU tensors.
pub struct MpiWorld {
    /// Shared with the reductions in flight, which finish on it when waited for.
    comm: Arc<Comm>,
    rank: usize,
    size: usize,
    /// The receive buffer of reductions, kept so a step allocates nothing after warm-up.
    scratch: Mutex<Vec<u8>>,
}

impl MpiWorld {
    fn mismatch(&self, op: CallKind, message: String) -> CollectiveError {
        CollectiveError::Mismatch {
            rank: self.rank,
            op: op.name(),
            message,
        }
    }

    fn unsupported(&self, op: CallKind) -> impl Fn(HostAccessError) -> CollectiveError + '_ {
        move |e| CollectiveError::Unsupported {
            rank: self.rank,
            op: op.name(),
            message: e.0,
        }
    }

    /// [`Self::unsupported`] as a value a pending call can own.
    fn host_error(
        &self,
        op: CallKind,
    ) -> impl Fn(HostAccessError) -> CollectiveError + Send + 'static {
        let rank = self.rank;
        move |e| CollectiveError::Unsupported {
            rank,
            op: op.name(),
            message: e.0,
        }
    }

    /// Agrees on an all-reduce of `tensor` and splits it: rank s reduces elements
    /// [len*s/n, len*(s+1)/n), then every rank gathers them. Returns the parts' byte counts
    /// and offsets.
    fn all_reduce_parts(
        &self,
        dtype: DType,
        len: usize,
        reduce: ReduceOp,
    ) -> Result<(Vec<i32>, Vec<i32>), CollectiveError> {
        let op = CallKind::AllReduce(reduce);
        let n = self.size;
        let headers = self.agree(op, dtype, len, 0)?;
        self.headers(op, &headers).same_length(|h| h.src_len)?;
        let elem = dtype.size_in_bytes();
        let counts = self.counts(op, (0..n).map(|s| (len * (s + 1) / n - len * s / n) * elem))?;
        let offsets = displacements(&counts);
        Ok((counts, offsets))
    }

    /// An MPI count of `bytes`, or an error for buffers past MPI's `int` counts.
    fn count(&self, op: CallKind, bytes: usize) -> Result<i32, CollectiveError> {
        i32::try_from(bytes).map_err(|_| CollectiveError::Unsupported {
            rank: self.rank,
            op: op.name(),
            message: format!("{bytes} bytes in one call exceed MPI's 2 GiB count limit"),
        })
    }

    fn counts(
        &self,
        op: CallKind,
        bytes: impl Iterator<Item = usize>,
    ) -> Result<Vec<i32>, CollectiveError> {
        bytes.map(|b| self.count(op, b)).collect()
    }

    /// Exchanges every rank's header for this call (`a` and `b` are its two lengths, in
    /// elements) and checks that they called the same collective with the same dtype and
    /// argument. Returns the headers in rank order; every rank sees the same ones, so every
    /// rank takes the same branch afterwards. Also a synchronization point: no rank leaves
    /// before every rank entered.
    fn agree(
        &self,
        op: CallKind,
        dtype: DType,
        a: usize,
        b: usize,
    ) -> Result<Vec<CallHeader>, CollectiveError> {
        let mine = CallHeader::new(op, dtype, a, b).to_words();
        let mut all = vec![0u64; mine.len() * self.size];
        {
            let _guard = mpi_lock();
            self.comm.0.all_gather_into(&mine[..], &mut all[..]);
        }
        let headers: Vec<CallHeader> = all
            .chunks_exact(mine.len())
            .map(CallHeader::from_words)
            .collect();
        self.headers(op, &headers).agree()?;
        Ok(headers)
    }

    /// The checks every rank runs on the headers it received.
    fn headers<'a>(
        &self,
        op: CallKind,
        headers: &'a [CallHeader],
    ) -> Headers<impl Fn(usize) -> CallHeader + 'a> {
        Headers {
            rank: self.rank,
            size: self.size,
            op,
            of: move |s| headers[s],
        }
    }

    /// Agrees on a call that splits a full buffer into the ranks' shards (all-gather,
    /// reduce-scatter): every rank passed the same full length, and the shards add up to
    /// it. Returns each rank's shard as byte counts and byte offsets.
    fn shard_layout(
        &self,
        op: CallKind,
        dtype: DType,
        shard_bytes: usize,
        full_bytes: usize,
    ) -> Result<(Vec<i32>, Vec<i32>), CollectiveError> {
        let elem = dtype.size_in_bytes();
        // The header's lengths: this rank's shard, then the full buffer.
        let headers = self.agree(op, dtype, shard_bytes / elem, full_bytes / elem)?;
        let checks = self.headers(op, &headers);
        let total = checks.same_length(|h| h.dst_len)?;
        checks.shards_add_up(|h| h.src_len, total)?;
        let counts = self.counts(op, headers.iter().map(|h| h.src_len * elem))?;
        let offsets = displacements(&counts);
        Ok((counts, offsets))
    }

    /// Sends chunk s of `src` (at `send` offsets and counts) to rank s, receives this rank's
    /// chunk from every rank (`mine` bytes each) and sums them in rank order into `dst`, or,
    /// when `dst` is `None`, into the scratch buffer after the received chunks. Returns the
    /// scratch buffer, locked.
    fn reduce_chunks(
        &self,
        dtype: DType,
        src: &[u8],
        send: (&[i32], &[i32]),
        mine: usize,
        dst: Option<&mut [u8]>,
        op: ReduceOp,
    ) -> MutexGuard<'_, Vec<u8>> {
        let n = self.size;
        let mut scratch = lock(&self.scratch);
        // Never empty, so that its address is a real one (see `real`).
        if scratch.len() < (n + 1) * mine + 1 {
            scratch.resize((n + 1) * mine + 1, 0);
        }
        let recv_counts = vec![mine as i32; n];
        let recv_displs = displacements(&recv_counts);
        {
            let _guard = mpi_lock();
            let spare = [0u8];
            let from = Partition::new(real(src, &spare), send.1, send.0);
            let mut into = PartitionMut::new(&mut scratch[..n * mine], recv_counts, recv_displs);
            self.comm.0.all_to_all_varcount_into(&from, &mut into);
        }
        let elem = dtype.size_in_bytes();
        let (received, tail) = scratch.split_at_mut(n * mine);
        let out = match dst {
            Some(dst) => dst.as_mut_ptr(),
            None => tail.as_mut_ptr(),
        };
        let base = received.as_ptr();
        // SAFETY: `received` holds n chunks of `mine` bytes; `out` is valid for `mine` bytes
        // (this rank's chunk, or the scratch tail) and does not overlap `received`.
        unsafe {
            reduce_ranks(dtype, out, mine / elem, n, |s| base.add(s * mine), op);
        }
        scratch
    }
}

/// `bytes`, or, when it is empty, an empty slice of `spare`. An empty Vec's pointer is
/// dangling (1 for bytes), and Open MPI reads the address 1 as `MPI_IN_PLACE`.
fn real<'a>(bytes: &'a [u8], spare: &'a [u8; 1]) -> &'a [u8] {
    if bytes.is_empty() {
        &spare[..0]
    } else {
        bytes
    }
}

/// [`real`] for a buffer MPI writes.
fn real_mut<'a>(bytes: &'a mut [u8], spare: &'a mut [u8; 1]) -> &'a mut [u8] {
    if bytes.is_empty() {
        &mut spare[..0]
    } else {
        bytes
    }
}

/// Whether every rank's count is the same.
fn equal(counts: &[i32]) -> bool {
    counts.iter().all(|&c| c == counts[0])
}

/// The offsets of consecutive chunks of `counts` bytes.
fn displacements(counts: &[i32]) -> Vec<i32> {
    counts
        .iter()
        .scan(0i32, |at, &c| {
            let start = *at;
            *at += c;
            Some(start)
        })
        .collect()
}

/// The calls, blocking (`run` in [`Collective`]) and started (`start`).
impl MpiWorld {}

/// The byte-level calls, MPI's blocking collectives, which `run_on_host` lends a call's
/// tensors to.
impl HostEngine for MpiWorld {
    fn rank(&self) -> usize {
        self.rank
    }

    fn size(&self) -> usize {
        self.size
    }

    /// All-gather on host bytes of `dtype`: every rank's `src`, in rank order, into `dst`.
    fn gather_bytes(&self, dtype: DType, src: &[u8], dst: &mut [u8]) -> Done {
        let (counts, displs) =
            self.shard_layout(CallKind::AllGather, dtype, src.len(), dst.len())?;
        let (spare_in, mut spare_out) = ([0u8], [0u8]);
        let (src, dst) = (real(src, &spare_in), real_mut(dst, &mut spare_out));
        let _guard = mpi_lock();
        if equal(&counts) {
            // Every rank sees the same counts, so all take this branch: MPI_Allgather, whose
            // algorithms Open MPI tunes better than MPI_Allgatherv's.
            self.comm.0.all_gather_into(src, dst);
        } else {
            let mut out = PartitionMut::new(dst, counts, displs);
            self.comm.0.all_gather_varcount_into(src, &mut out);
        }
        Ok(())
    }

    fn reduce_scatter_bytes(&self, dtype: DType, src: &[u8], dst: &mut [u8], op: ReduceOp) -> Done {
        let kind = CallKind::ReduceScatter(op);
        let (send, offsets) = self.shard_layout(kind, dtype, dst.len(), src.len())?;
        drop(self.reduce_chunks(dtype, src, (&offsets, &send), dst.len(), Some(dst), op));
        Ok(())
    }

    fn all_reduce_bytes(&self, dtype: DType, buf: &mut [u8], op: ReduceOp) -> Done {
        let n = self.size;
        let (counts, offsets) =
            self.all_reduce_parts(dtype, buf.len() / dtype.size_in_bytes(), op)?;
        let mine = counts[self.rank] as usize;
        let scratch = self.reduce_chunks(dtype, buf, (&offsets, &counts), mine, None, op);
        let reduced = &scratch[n * mine..(n + 1) * mine];
        let mut spare = [0u8];
        let _guard = mpi_lock();
        let mut out = PartitionMut::new(real_mut(buf, &mut spare), counts, offsets);
        self.comm.0.all_gather_varcount_into(reduced, &mut out);
        Ok(())
    }

    fn broadcast_bytes(&self, dtype: DType, buf: &mut [u8], root: usize) -> Done {
        let op = CallKind::Broadcast(root);
        let elem = dtype.size_in_bytes();
        let headers = self.agree(op, dtype, buf.len() / elem, 0)?;
        let root_len = headers[root].src_len;
        if headers[self.rank].src_len != root_len {
            return Err(self.mismatch(
                op,
                format!(
                    "root has {root_len} elements, this rank {}",
                    buf.len() / elem
                ),
            ));
        }
        self.headers(op, &headers).same_length(|h| h.src_len)?;
        self.count(op, buf.len())?;
        let _guard = mpi_lock();
        let mut spare = [0u8];
        self.comm
            .0
            .process_at_rank(root as i32)
            .broadcast_into(real_mut(buf, &mut spare));
        Ok(())
    }

    fn barrier(&self) -> Done {
        // The header exchange is itself a synchronization, and a barrier facing another
        // collective is reported as a mismatch, as in ThreadWorld.
        self.agree(CallKind::Barrier, DType::F32, 0, 0).map(|_| ())
    }
}

impl Collective for MpiWorld {
    fn position(&self) -> Position {
        Position::new(self.rank, self.size)
    }

    /// Host tensors move while the rank computes (`MPI_Iallgather`, `MPI_Ialltoallv`);
    /// device tensors, a broadcast and a barrier complete here. Uneven parts go as they
    /// are, no padding: every rank's shard length travels in the call's header, and the
    /// header check holds them against the full buffer.
    fn start(&self, call: Call<'_>) -> Result<Work, CollectiveError> {
        match call {
            Call::AllGather { shard, full } => self.all_gather_started(shard, full),
            Call::ReduceScatter { full, shard, op }
            | Call::ReduceScatterParts {
                full, shard, op, ..
            } => self.reduce_scatter_started(full, shard, op),
            Call::AllReduce { tensor, op } => self.all_reduce_started(tensor, op),
            blocking => self.run(blocking).map(|()| Work::done()),
        }
    }

    /// MPI's blocking collectives, which Open MPI tunes better than its nonblocking ones.
    fn run(&self, call: Call<'_>) -> Result<(), CollectiveError> {
        run_on_host(self, call)
    }

    fn split(&self, color: usize) -> Result<Arc<dyn Collective>, CollectiveError> {
        let op = CallKind::Split;
        // Agreed as a call of its own, so a split facing another collective is a mismatch.
        self.agree(op, DType::F32, 0, 0)?;
        let value = i32::try_from(color)
            .map_err(|_| self.mismatch(op, format!("split color {color} is too large")))?;
        let _guard = mpi_lock();
        let sub = self
            .comm
            .0
            .split_by_color(Color::with_value(value))
            .expect("every rank passed a color, so every rank gets a communicator");
        Ok(Arc::new(Self::over(sub)))
    }
}
