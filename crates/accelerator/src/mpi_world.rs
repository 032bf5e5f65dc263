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
//! MPI calls are serialized by one process-wide lock: MPI is initialized with at least
//! `MPI_THREAD_SERIALIZED`, and a rank is one process, so the lock is never contended in
//! training; it only makes the handles safe to share.

use crate::call::{dtype_code, Op};
use crate::host::{with_bytes, with_bytes_mut, with_bytes_mut_from, HostAccessError};
use crate::reduce::reduce_ranks;
use candle_core::{DType, Tensor};
use mpi::datatype::{Partition, PartitionMut};
use mpi::topology::{Color, SimpleCommunicator};
use mpi::traits::*;
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};
use wick_core::{lock, Collective, CollectiveError, ReduceOp, Work};

/// One lock for every MPI call of this process.
static MPI_LOCK: Mutex<()> = Mutex::new(());

fn mpi_lock() -> MutexGuard<'static, ()> {
    // Nothing guarded can be left half-updated by a panic: the lock orders calls only.
    lock(&MPI_LOCK)
}

/// A communicator handle that may move between threads.
struct Comm(SimpleCommunicator);

// SAFETY: MPI is initialized with at least MPI_THREAD_SERIALIZED (checked in
// `MpiWorld::process_world`) and every use of the handle holds `MPI_LOCK`.
unsafe impl Send for Comm {}
unsafe impl Sync for Comm {}

/// One rank's collectives over an MPI communicator; implements [`Collective`] for f32,
/// bf16 and f16 CPU tensors.
pub struct MpiWorld {
    comm: Comm,
    rank: usize,
    size: usize,
    /// The receive buffer of reductions, kept so a step allocates nothing after warm-up.
    scratch: Mutex<Vec<u8>>,
}

/// The world of every process, made once per process.
static PROCESS_WORLD: OnceLock<Result<Arc<MpiWorld>, String>> = OnceLock::new();

extern "C" fn finalize_mpi() {
    // SAFETY: runs once at process exit, after every rank's work returned.
    unsafe {
        let mut finalized = 0;
        mpi::ffi::MPI_Finalized(&mut finalized);
        if finalized == 0 {
            mpi::ffi::MPI_Finalize();
        }
    }
}

extern "C" {
    fn atexit(f: extern "C" fn()) -> std::os::raw::c_int;
}

/// Header words: op, dtype, argument, and two lengths in elements.
type Header = [u64; 5];

impl MpiWorld {
    /// The world of every process the launcher started (`MPI_COMM_WORLD`). The first call
    /// initializes MPI and arranges `MPI_Finalize` at process exit.
    pub fn process_world() -> Result<Arc<MpiWorld>, CollectiveError> {
        PROCESS_WORLD
            .get_or_init(|| {
                let _guard = mpi_lock();
                if !mpi::is_initialized() {
                    let (universe, provided) =
                        mpi::initialize_with_threading(mpi::Threading::Multiple)
                            .ok_or("MPI could not be initialized")?;
                    if provided < mpi::Threading::Serialized {
                        return Err(format!(
                            "MPI provides thread level {provided:?}; wick needs Serialized or better"
                        ));
                    }
                    // MPI_Finalize runs at exit instead of when `universe` drops: the world
                    // lives as long as the process, and MPI cannot be initialized twice.
                    std::mem::forget(universe);
                    // SAFETY: registers a plain function with the C runtime.
                    unsafe { atexit(finalize_mpi) };
                }
                Ok(Arc::new(Self::over(SimpleCommunicator::world())))
            })
            .clone()
            .map_err(|message| CollectiveError::Unsupported {
                rank: 0,
                op: "init",
                message,
            })
    }

    fn over(comm: SimpleCommunicator) -> Self {
        MpiWorld {
            rank: comm.rank() as usize,
            size: comm.size() as usize,
            comm: Comm(comm),
            scratch: Mutex::default(),
        }
    }

    /// Ends every process of the job with `code`, as `MPI_Abort` does: for a rank that
    /// failed, so that no other rank waits for it.
    pub fn abort(&self, code: i32) -> ! {
        self.comm.0.abort(code)
    }

    fn mismatch(&self, op: Op, message: String) -> CollectiveError {
        CollectiveError::Mismatch {
            rank: self.rank,
            op: op.name(),
            message,
        }
    }

    fn unsupported(&self, op: Op) -> impl Fn(HostAccessError) -> CollectiveError + '_ {
        move |e| CollectiveError::Unsupported {
            rank: self.rank,
            op: op.name(),
            message: e.0,
        }
    }

    /// An MPI count of `bytes`, or an error for buffers past MPI's `int` counts.
    fn count(&self, op: Op, bytes: usize) -> Result<i32, CollectiveError> {
        i32::try_from(bytes).map_err(|_| CollectiveError::Unsupported {
            rank: self.rank,
            op: op.name(),
            message: format!("{bytes} bytes in one call exceed MPI's 2 GiB count limit"),
        })
    }

    fn counts(
        &self,
        op: Op,
        bytes: impl Iterator<Item = usize>,
    ) -> Result<Vec<i32>, CollectiveError> {
        bytes.map(|b| self.count(op, b)).collect()
    }

    /// Exchanges every rank's header for this call and checks that they called the same
    /// collective with the same dtype and argument. Returns the headers in rank order; every
    /// rank sees the same ones, so every rank takes the same branch afterwards. Also a
    /// synchronization point: no rank leaves before every rank entered.
    fn agree(
        &self,
        op: Op,
        dtype: DType,
        arg: usize,
        a: usize,
        b: usize,
    ) -> Result<Vec<Header>, CollectiveError> {
        let mine: Header = [
            op as u64,
            dtype_code(dtype) as u64,
            arg as u64,
            a as u64,
            b as u64,
        ];
        let mut all = vec![0u64; 5 * self.size];
        {
            let _guard = mpi_lock();
            self.comm.0.all_gather_into(&mine[..], &mut all[..]);
        }
        let headers: Vec<Header> = all
            .chunks_exact(5)
            .map(|c| [c[0], c[1], c[2], c[3], c[4]])
            .collect();
        let first = headers[0];
        for (s, h) in headers.iter().enumerate() {
            if h[0] != first[0] {
                return Err(self.mismatch(
                    op,
                    format!("rank {s} called a different collective at the same point"),
                ));
            }
            if h[2] != first[2] {
                return Err(self.mismatch(
                    op,
                    format!("rank {s} passed {} where rank 0 passed {}", h[2], first[2]),
                ));
            }
            if h[1] != first[1] {
                return Err(self.mismatch(op, format!("rank {s} passed another dtype than rank 0")));
            }
        }
        Ok(headers)
    }

    /// Field `field` of the headers (a length), when every rank passed the same.
    fn same_length(
        &self,
        op: Op,
        headers: &[Header],
        field: usize,
    ) -> Result<u64, CollectiveError> {
        let first = headers[0][field];
        if headers.iter().any(|h| h[field] != first) {
            return Err(self.mismatch(op, "ranks passed buffers of different lengths".into()));
        }
        Ok(first)
    }

    /// Agrees on a call that splits a full buffer into the ranks' shards (all-gather,
    /// reduce-scatter): every rank passed the same full length, and the shards add up to
    /// it. Returns each rank's shard as byte counts and byte offsets.
    fn shard_layout(
        &self,
        op: Op,
        dtype: DType,
        arg: usize,
        shard_bytes: usize,
        full_bytes: usize,
    ) -> Result<(Vec<i32>, Vec<i32>), CollectiveError> {
        let elem = dtype.size_in_bytes();
        let headers = self.agree(op, dtype, arg, shard_bytes / elem, full_bytes / elem)?;
        let total = self.same_length(op, &headers, 4)?;
        let sum: u64 = headers.iter().map(|h| h[3]).sum();
        if sum != total {
            return Err(self.mismatch(
                op,
                format!(
                    "the ranks' shards add up to {sum} elements but the full buffer holds {total}"
                ),
            ));
        }
        let counts = self.counts(op, headers.iter().map(|h| h[3] as usize * elem))?;
        let offsets = displacements(&counts);
        Ok((counts, offsets))
    }

    /// All-gather on host bytes of `dtype`: every rank's `src`, in rank order, into `dst`.
    fn gather_bytes(
        &self,
        dtype: DType,
        src: &[u8],
        dst: &mut [u8],
    ) -> Result<(), CollectiveError> {
        let (counts, displs) = self.shard_layout(Op::AllGather, dtype, 0, src.len(), dst.len())?;
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

/// The address of `bytes` for a raw MPI call: for an empty buffer an aligned dangling one,
/// never 1 (see `real`); MPI reads no byte of an empty buffer.
fn address(bytes: &[u8]) -> *const std::ffi::c_void {
    if bytes.is_empty() {
        std::ptr::NonNull::<u64>::dangling()
            .as_ptr()
            .cast_const()
            .cast()
    } else {
        bytes.as_ptr().cast()
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

fn reduce_code(op: ReduceOp) -> usize {
    match op {
        ReduceOp::Sum => 0,
        ReduceOp::Mean => 1,
    }
}

/// An `MPI_Iallgather(v)` in flight, with everything MPI reads or writes until it completes.
struct InFlight {
    request: mpi::ffi::MPI_Request,
    _counts: Vec<i32>,
    _displs: Vec<i32>,
    /// Keep both buffers' storage alive until the call completes.
    _buffers: (Tensor, Tensor),
    rank: usize,
}

// SAFETY: the request and the buffers are touched only by `wait`, under `MPI_LOCK`.
unsafe impl Send for InFlight {}

impl InFlight {
    fn wait(mut self) -> Result<(), CollectiveError> {
        let _guard = mpi_lock();
        // SAFETY: `request` came from MPI_Iallgather(v) and is waited on once.
        let code = unsafe { mpi::ffi::MPI_Wait(&mut self.request, mpi::ffi::RSMPI_STATUS_IGNORE) };
        if code != 0 {
            return Err(CollectiveError::Unsupported {
                rank: self.rank,
                op: "all_gather",
                message: format!("MPI_Wait returned error code {code}"),
            });
        }
        Ok(())
    }
}

impl Collective for MpiWorld {
    fn rank(&self) -> usize {
        self.rank
    }

    fn world_size(&self) -> usize {
        self.size
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

    /// A nonblocking `MPI_Iallgather` (`MPI_Iallgatherv` for uneven shards): the header
    /// exchange happens now, the data moves until [`Work::wait`]. `full` must not be read
    /// before then.
    fn all_gather_start(&self, shard: &Tensor, full: &Tensor) -> Result<Work, CollectiveError> {
        let dtype = shard.dtype();
        let started = with_bytes_mut_from(full, shard, |dst, src| {
            let (counts, displs) =
                self.shard_layout(Op::AllGather, dtype, 0, src.len(), dst.len())?;
            let byte = u8::equivalent_datatype().as_raw();
            let _guard = mpi_lock();
            // SAFETY: MPI is given a null request to fill, buffers and count
            // arrays that `InFlight` keeps alive until MPI_Wait returns.
            let mut request = unsafe { std::mem::zeroed::<mpi::ffi::MPI_Request>() };
            let (send, recv) = (address(src), address(dst).cast_mut());
            let code = unsafe {
                if equal(&counts) {
                    mpi::ffi::MPI_Iallgather(
                        send,
                        counts[0],
                        byte,
                        recv,
                        counts[0],
                        byte,
                        self.comm.0.as_raw(),
                        &mut request,
                    )
                } else {
                    mpi::ffi::MPI_Iallgatherv(
                        send,
                        src.len() as i32,
                        byte,
                        recv,
                        counts.as_ptr(),
                        displs.as_ptr(),
                        byte,
                        self.comm.0.as_raw(),
                        &mut request,
                    )
                }
            };
            if code != 0 {
                return Err(self.mismatch(
                    Op::AllGather,
                    format!("MPI_Iallgather returned error code {code}"),
                ));
            }
            Ok(InFlight {
                request,
                _counts: counts,
                _displs: displs,
                _buffers: (shard.clone(), full.clone()),
                rank: self.rank,
            })
        })
        .map_err(self.unsupported(Op::AllGather))??;
        Ok(Work::pending(move || started.wait()))
    }

    fn reduce_scatter_into(
        &self,
        full: &Tensor,
        shard: &Tensor,
        reduce: ReduceOp,
    ) -> Result<(), CollectiveError> {
        let op = Op::ReduceScatter;
        let dtype = full.dtype();
        with_bytes_mut_from(shard, full, |dst, src| {
            let (send, offsets) =
                self.shard_layout(op, dtype, reduce_code(reduce), dst.len(), src.len())?;
            drop(self.reduce_chunks(dtype, src, (&offsets, &send), dst.len(), Some(dst), reduce));
            Ok(())
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
        let n = self.size;
        with_bytes_mut(tensor, |buf| {
            let len = buf.len() / elem;
            let headers = self.agree(op, dtype, reduce_code(reduce), len, 0)?;
            self.same_length(op, &headers, 3)?;
            // Rank s reduces elements [len*s/n, len*(s+1)/n), then every rank gathers them.
            let counts =
                self.counts(op, (0..n).map(|s| (len * (s + 1) / n - len * s / n) * elem))?;
            let offsets = displacements(&counts);
            let mine = counts[self.rank] as usize;
            let scratch = self.reduce_chunks(dtype, buf, (&offsets, &counts), mine, None, reduce);
            let reduced = &scratch[n * mine..(n + 1) * mine];
            let mut spare = [0u8];
            let _guard = mpi_lock();
            let mut out = PartitionMut::new(real_mut(buf, &mut spare), counts, offsets);
            self.comm.0.all_gather_varcount_into(reduced, &mut out);
            Ok(())
        })
        .map_err(self.unsupported(op))?
    }

    fn broadcast_in_place(&self, tensor: &Tensor, root: usize) -> Result<(), CollectiveError> {
        let op = Op::Broadcast;
        if root >= self.size {
            return Err(self.mismatch(
                op,
                format!("root {root} is not a rank of a world of {}", self.size),
            ));
        }
        let dtype = tensor.dtype();
        let elem = dtype.size_in_bytes();
        with_bytes_mut(tensor, |buf| {
            let headers = self.agree(op, dtype, root, buf.len() / elem, 0)?;
            let root_len = headers[root][3];
            if headers[self.rank][3] != root_len {
                return Err(self.mismatch(
                    op,
                    format!(
                        "root has {root_len} elements, this rank {}",
                        buf.len() / elem
                    ),
                ));
            }
            self.same_length(op, &headers, 3)?;
            self.count(op, buf.len())?;
            let _guard = mpi_lock();
            let mut spare = [0u8];
            self.comm
                .0
                .process_at_rank(root as i32)
                .broadcast_into(real_mut(buf, &mut spare));
            Ok(())
        })
        .map_err(self.unsupported(op))?
    }

    fn barrier(&self) -> Result<(), CollectiveError> {
        // The header exchange is itself a synchronization, and a barrier facing another
        // collective is reported as a mismatch, as in ThreadWorld.
        self.agree(Op::Barrier, DType::F32, 0, 0, 0).map(|_| ())
    }

    fn split(&self, color: usize) -> Result<Arc<dyn Collective>, CollectiveError> {
        let op = Op::Split;
        // Agreed as a call of its own, so a split facing another collective is a mismatch.
        self.agree(op, DType::F32, 0, 0, 0)?;
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
