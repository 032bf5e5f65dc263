//! `NcclWorld`: collectives on CUDA device memory, through NCCL (cudarc's bindings).
//!
//! Data moves GPU to GPU with no copy through the host: each call reaches the tensors'
//! `CudaSlice`s through an in-place custom op and hands them to NCCL. Set-up and splitting
//! go through a host world, the *control* world (a `ThreadComm` when ranks are threads,
//! the `MpiWorld` when they are processes): rank 0 makes the NCCL unique id and broadcasts
//! it there. One code path serves one thread per GPU and one process per GPU.
//!
//! Calls run on a communication stream of their own. Before a call it waits for the work
//! issued so far on the rank's compute stream; a blocking call makes the compute stream
//! wait for it in turn, and a call started ahead (a prefetched all-gather, a gradient's
//! reduce-scatter or a bucket's all-reduce issued during backward) does so only in
//! [`Work::wait`], so it overlaps whatever the rank computes meanwhile.
//!
//! NCCL moves equal chunks: an all-gather's or reduce-scatter's full buffer must be
//! `world_size` times the shard (the strategies' flat layouts pad to that).

use crate::worlds::call::{gather_headers, CallHeader, Headers};
use candle_core::backend::BackendStorage;
use candle_core::cuda_backend::cudarc::driver::CudaStream;
use candle_core::cuda_backend::cudarc::nccl::safe::{Comm, Id, NcclType, ReduceOp as NcclOp};
use candle_core::cuda_backend::{CudaDType, CudaStorage};
use candle_core::{CpuStorage, DType, Device, InplaceOp1, InplaceOp2, Layout, Tensor};
use half::{bf16, f16};
use std::sync::{Arc, Mutex};
use wick_core::{
    all_gather_through_tensor, lock, reduce_scatter_padded, Call, CallKind, Collective,
    CollectiveError, CollectiveExt, Position, ReduceOp, Work,
};

/// An NCCL communicator, used by one call at a time.
struct SharedComm(Comm);

// SAFETY: an NCCL communicator may be used from any thread as long as calls on it do not
// overlap; every use goes through `NcclWorld::comm`'s mutex.
unsafe impl Send for SharedComm {}

/// One rank's NCCL communicator with the streams it orders against.
pub struct NcclWorld {
    comm: Mutex<SharedComm>,
    /// The stream Candle computes on for this rank's device.
    compute: Arc<CudaStream>,
    /// The stream NCCL runs on.
    comm_stream: Arc<CudaStream>,
    device: Device,
    control: Arc<dyn Collective>,
    rank: usize,
    size: usize,
}

fn nccl_op(op: ReduceOp) -> NcclOp {
    match op {
        ReduceOp::Sum => NcclOp::Sum,
        ReduceOp::Mean => NcclOp::Avg,
    }
}

/// The contiguous element range a layout covers.
fn range(layout: &Layout) -> candle_core::Result<std::ops::Range<usize>> {
    let (start, end) = layout.contiguous_offsets().ok_or_else(|| {
        candle_core::Error::Msg("nccl: expected a contiguous tensor, found a strided view".into())
    })?;
    Ok(start..end)
}

/// A call bound to a communicator, run by Candle as an in-place op on the output's storage.
struct Run<'a> {
    comm: &'a Comm,
    call: CallKind,
}

impl Run<'_> {
    fn two<T: CudaDType + NcclType>(
        &self,
        (dst, dst_l): (&mut CudaStorage, &Layout),
        (src, src_l): (&CudaStorage, &Layout),
    ) -> candle_core::Result<()> {
        let src_slice = T::as_cuda_slice(src)?.slice(range(src_l)?);
        let dst_full = T::as_cuda_slice_mut(dst)?;
        let mut dst_slice = dst_full.slice_mut(range(dst_l)?);
        let status = match self.call {
            CallKind::AllGather => self.comm.all_gather(&src_slice, &mut dst_slice),
            CallKind::ReduceScatter(op) => {
                self.comm
                    .reduce_scatter(&src_slice, &mut dst_slice, &nccl_op(op))
            }
            _ => unreachable!("in-place calls run through one()"),
        };
        status.map(drop).map_err(nccl_error)
    }

    fn one<T: CudaDType + NcclType>(
        &self,
        buf: &mut CudaStorage,
        layout: &Layout,
    ) -> candle_core::Result<()> {
        let full = T::as_cuda_slice_mut(buf)?;
        let mut slice = full.slice_mut(range(layout)?);
        let status = match self.call {
            CallKind::AllReduce(op) => self.comm.all_reduce_in_place(&mut slice, &nccl_op(op)),
            CallKind::Broadcast(root) => self.comm.broadcast_in_place(&mut slice, root as i32),
            _ => unreachable!("calls with an input run through two()"),
        };
        status.map(drop).map_err(nccl_error)
    }
}

fn nccl_error(e: impl std::fmt::Debug) -> candle_core::Error {
    candle_core::Error::Msg(format!("nccl: {e:?}"))
}

fn host_only(name: &str) -> candle_core::Error {
    candle_core::Error::Msg(format!(
        "{name}: NcclWorld moves CUDA tensors only, found a cpu tensor"
    ))
}

impl InplaceOp2 for Run<'_> {
    fn name(&self) -> &'static str {
        "wick-nccl"
    }
    fn cpu_fwd(
        &self,
        _: &mut CpuStorage,
        _: &Layout,
        _: &CpuStorage,
        _: &Layout,
    ) -> candle_core::Result<()> {
        Err(host_only(self.call.name()))
    }
    fn cuda_fwd(
        &self,
        dst: &mut CudaStorage,
        dst_l: &Layout,
        src: &CudaStorage,
        src_l: &Layout,
    ) -> candle_core::Result<()> {
        match dst.dtype() {
            DType::F32 => self.two::<f32>((dst, dst_l), (src, src_l)),
            DType::BF16 => self.two::<bf16>((dst, dst_l), (src, src_l)),
            DType::F16 => self.two::<f16>((dst, dst_l), (src, src_l)),
            // Bytes (a quantized base's blocks) are gathered, never summed.
            DType::U8 if self.call == CallKind::AllGather => {
                self.two::<u8>((dst, dst_l), (src, src_l))
            }
            other => candle_core::bail!("nccl: no {} for {other:?}", self.call.name()),
        }
    }
}

impl InplaceOp1 for Run<'_> {
    fn name(&self) -> &'static str {
        "wick-nccl"
    }
    fn cpu_fwd(&self, _: &mut CpuStorage, _: &Layout) -> candle_core::Result<()> {
        Err(host_only(self.call.name()))
    }
    fn cuda_fwd(&self, buf: &mut CudaStorage, layout: &Layout) -> candle_core::Result<()> {
        match buf.dtype() {
            DType::F32 => self.one::<f32>(buf, layout),
            DType::BF16 => self.one::<bf16>(buf, layout),
            DType::F16 => self.one::<f16>(buf, layout),
            DType::U8 if matches!(self.call, CallKind::Broadcast(_)) => self.one::<u8>(buf, layout),
            other => candle_core::bail!("nccl: no {} for {other:?}", self.call.name()),
        }
    }
}

/// Makes `compute` wait for the work issued on `comm_stream` so far (rank `rank`'s `call`).
fn compute_waits(
    compute: &CudaStream,
    comm_stream: &CudaStream,
    rank: usize,
    call: CallKind,
) -> Result<(), CollectiveError> {
    compute
        .join(comm_stream)
        .map_err(|e| CollectiveError::Unsupported {
            rank,
            op: call.name(),
            message: format!("stream wait failed: {e:?}"),
        })
}

/// The NCCL unique id as 32 f32 words whose bits are its bytes, so that a host world's
/// broadcast (which copies bytes) carries it.
fn id_words(id: &Id) -> Vec<f32> {
    id.internal()
        .chunks_exact(4)
        .map(|c| {
            f32::from_bits(u32::from_ne_bytes([
                c[0] as u8, c[1] as u8, c[2] as u8, c[3] as u8,
            ]))
        })
        .collect()
}

fn id_from_words(words: &[f32]) -> Id {
    let mut internal = [0 as std::ffi::c_char; 128];
    for (chunk, w) in internal.chunks_exact_mut(4).zip(words) {
        for (c, b) in chunk.iter_mut().zip(w.to_bits().to_ne_bytes()) {
            *c = b as std::ffi::c_char;
        }
    }
    Id::uninit(internal)
}

impl NcclWorld {
    /// Whether this build has NCCL: `true` here (the `nccl` feature).
    pub const ENABLED: bool = true;

    /// Joins the NCCL world of the ranks of `control`, this rank computing on `device` (a
    /// CUDA device, a different GPU for every rank: NCCL refuses two ranks on one GPU).
    /// A collective over `control`: every rank calls it at the same point.
    pub fn new(control: Arc<dyn Collective>, device: &Device) -> Result<Self, CollectiveError> {
        let rank = control.rank();
        let size = control.world_size();
        let fail = |message: String| CollectiveError::Unsupported {
            rank,
            op: "nccl set-up",
            message,
        };
        let Device::Cuda(cuda) = device else {
            return Err(fail(format!(
                "NcclWorld needs a CUDA device, got {:?}",
                device.location()
            )));
        };
        let compute = cuda.cuda_stream();
        let comm_stream = compute
            .context()
            .new_stream()
            .map_err(|e| fail(format!("cannot make a communication stream: {e:?}")))?;
        // Rank 0's id reaches every rank through the control world.
        let mine = match rank {
            0 => Id::new().map_err(|e| fail(format!("ncclGetUniqueId failed: {e:?}")))?,
            _ => id_from_words(&[0.0; 32]),
        };
        let words = Tensor::new(id_words(&mine), &Device::Cpu).map_err(|e| fail(e.to_string()))?;
        control.broadcast_in_place(&words, 0)?;
        let words = words.to_vec1::<f32>().map_err(|e| fail(e.to_string()))?;
        // NCCL takes the GPU from the calling thread's current device.
        compute
            .context()
            .bind_to_thread()
            .map_err(|e| fail(format!("cannot make GPU current: {e:?}")))?;
        let comm = Comm::from_rank(comm_stream.clone(), rank, size, id_from_words(&words))
            .map_err(|e| fail(format!("ncclCommInitRank failed: {e:?}")))?;
        Ok(NcclWorld {
            comm: Mutex::new(SharedComm(comm)),
            compute,
            comm_stream,
            device: device.clone(),
            control,
            rank,
            size,
        })
    }

    fn error(&self, call: CallKind, message: String) -> CollectiveError {
        CollectiveError::Unsupported {
            rank: self.rank,
            op: call.name(),
            message,
        }
    }

    fn check_device(&self, call: CallKind, t: &Tensor) -> Result<(), CollectiveError> {
        if !t.device().same_device(&self.device) {
            return Err(self.error(
                call,
                format!(
                    "tensor on {:?}, but this rank's NCCL world is on {:?}",
                    t.device().location(),
                    self.device.location()
                ),
            ));
        }
        Ok(())
    }

    /// Issues `call` on the communication stream, after the compute stream's work so far.
    /// The caller makes the compute stream wait (at once, or in a `Work`).
    fn issue(
        &self,
        call: CallKind,
        dst: &Tensor,
        src: Option<&Tensor>,
    ) -> Result<(), CollectiveError> {
        self.check_device(call, dst)?;
        let comm = lock(&self.comm);
        self.comm_stream
            .join(&self.compute)
            .map_err(|e| self.error(call, format!("stream wait failed: {e:?}")))?;
        let run = Run {
            comm: &comm.0,
            call,
        };
        let outcome = match src {
            Some(src) => {
                self.check_device(call, src)?;
                dst.inplace_op2(src, &run)
            }
            None => dst.inplace_op1(&run),
        };
        outcome.map_err(|e| self.error(call, e.to_string()))
    }

    fn equal_chunks(
        &self,
        call: CallKind,
        shard: &Tensor,
        full: &Tensor,
    ) -> Result<(), CollectiveError> {
        if full.elem_count() != shard.elem_count() * self.size {
            return Err(CollectiveError::Mismatch {
                rank: self.rank,
                op: call.name(),
                message: format!(
                    "NCCL moves equal chunks: the full buffer has {} elements, not {} ranks x \
                     {} of the shard",
                    full.elem_count(),
                    self.size,
                    shard.elem_count()
                ),
            });
        }
        Ok(())
    }

    /// A call issued on the communication stream that the compute stream waits for only
    /// in [`Work::wait`], so that it overlaps whatever the rank computes meanwhile. The
    /// call's tensors live until then: freed earlier, their memory could be handed to the
    /// compute stream while NCCL still reads or writes it.
    fn joined_on_wait<const N: usize>(&self, call: CallKind, tensors: [&Tensor; N]) -> Work {
        let (compute, comm_stream, rank) =
            (self.compute.clone(), self.comm_stream.clone(), self.rank);
        let kept: Vec<Tensor> = tensors.into_iter().cloned().collect();
        Work::pending(move || {
            let joined = compute_waits(&compute, &comm_stream, rank, call);
            drop(kept);
            joined
        })
    }

    /// An in-place call (all-reduce, broadcast) on a device tensor, joined in the wait.
    fn in_place(&self, call: CallKind, tensor: &Tensor) -> Result<Work, CollectiveError> {
        self.check_agreement(call, tensor, 0)?;
        self.issue(call, tensor, None)?;
        Ok(self.joined_on_wait(call, [tensor]))
    }

    /// An all-reduce of a host tensor: copied to this rank's GPU, reduced there, and
    /// copied back into `tensor`'s own storage.
    fn staged(&self, tensor: &Tensor, op: ReduceOp) -> Result<(), CollectiveError> {
        let call = CallKind::AllReduce(op);
        let fail = |e: candle_core::Error| self.error(call, e.to_string());
        let on_gpu = tensor.to_device(&self.device).map_err(fail)?;
        self.in_place(call, &on_gpu)?.wait()?;
        let back = on_gpu.to_device(&Device::Cpu).map_err(fail)?;
        tensor
            .flatten_all()
            .and_then(|t| t.slice_set(&back.flatten_all()?, 0, 0))
            .map_err(fail)
    }

    /// In debug builds, every rank's header of `call` (`input`'s dtype and length, and
    /// `output` elements) is exchanged over the control world and checked as the host
    /// worlds check theirs, so that ranks that disagree (another collective, dtype, root
    /// or length) all return the same `Mismatch` instead of hanging inside NCCL. One small
    /// host all-gather a call; release builds skip it.
    fn check_agreement(
        &self,
        call: CallKind,
        input: &Tensor,
        output: usize,
    ) -> Result<(), CollectiveError> {
        if !cfg!(debug_assertions) {
            return Ok(());
        }
        let mine = CallHeader::new(call, input.dtype(), input.elem_count(), output);
        let headers = gather_headers(&*self.control, mine)?;
        let checks = Headers {
            rank: self.rank,
            size: self.size,
            op: call,
            of: |s| headers[s],
        };
        checks.agree()?;
        checks.same_length(|h| h.src_len)?;
        checks.same_length(|h| h.dst_len).map(drop)
    }

    /// Bytes of device memory in use on this rank's GPU (total minus free, as the driver
    /// reports; it counts every process on the GPU).
    pub fn device_memory_used(&self) -> Result<usize, CollectiveError> {
        let (free, total) =
            self.compute.context().mem_get_info().map_err(|e| {
                self.error(CallKind::AllGather, format!("cuMemGetInfo failed: {e:?}"))
            })?;
        Ok(total - free)
    }
}

impl Collective for NcclWorld {
    fn position(&self) -> Position {
        Position::new(self.rank, self.size)
    }

    /// Every call is issued on the communication stream and joined in [`Work::wait`]; the
    /// blocking forms are that, waited for at once. A host tensor of an all-reduce (the
    /// scalars the trainer logs) is staged through this rank's GPU.
    fn start(&self, call: Call<'_>) -> Result<Work, CollectiveError> {
        match call {
            Call::AllGather { shard, full } => {
                let call = CallKind::AllGather;
                self.equal_chunks(call, shard, full)?;
                self.check_agreement(call, shard, full.elem_count())?;
                self.issue(call, full, Some(shard))?;
                Ok(self.joined_on_wait(call, [shard, full]))
            }
            Call::AllGatherHost { shard, full } => {
                all_gather_through_tensor(self, shard, full).map(|()| Work::done())
            }
            Call::ReduceScatter { full, shard, op } => {
                let call = CallKind::ReduceScatter(op);
                self.equal_chunks(call, shard, full)?;
                self.check_agreement(call, full, shard.elem_count())?;
                self.issue(call, shard, Some(full))?;
                Ok(self.joined_on_wait(call, [full, shard]))
            }
            Call::ReduceScatterParts {
                full,
                shard,
                parts,
                op,
            } => reduce_scatter_padded(self, full, shard, parts, op),
            Call::AllReduce { tensor, op } if tensor.device().is_cpu() => {
                self.staged(tensor, op).map(|()| Work::done())
            }
            Call::AllReduce { tensor, op } => self.in_place(CallKind::AllReduce(op), tensor),
            Call::Broadcast { tensor, root } => {
                let call = CallKind::Broadcast(root);
                if root >= self.size {
                    return Err(CollectiveError::Mismatch {
                        rank: self.rank,
                        op: call.name(),
                        message: format!("root {root} is not a rank of a world of {}", self.size),
                    });
                }
                self.in_place(call, tensor)
            }
            Call::Barrier => self.control.barrier().map(|()| Work::done()),
        }
    }

    fn split(&self, color: usize) -> Result<Arc<dyn Collective>, CollectiveError> {
        let control = self.control.split(color)?;
        Ok(Arc::new(NcclWorld::new(control, &self.device)?))
    }
}
