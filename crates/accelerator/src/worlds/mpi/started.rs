//! `MpiWorld`'s calls started ahead: MPI's nonblocking collectives on the tensors' own host
//! bytes, waited for in [`Work::wait`]. A device tensor would be staged through a host copy
//! that must outlive the call, so those complete at once instead.

use super::in_flight::{address, Exchange, InFlight};
use super::setup::mpi_lock;
use super::{displacements, equal, real_mut, MpiWorld};
use crate::worlds::host::{check_reducible, with_bytes, with_bytes_mut, with_bytes_mut_from};
use candle_core::Tensor;
use mpi::datatype::PartitionMut;
use mpi::traits::*;
use wick_core::{Call, CallKind, Collective, CollectiveError, ReduceOp, Work};

/// Whether every tensor lives in host memory.
fn on_host(tensors: &[&Tensor]) -> bool {
    tensors.iter().all(|t| t.device().is_cpu())
}

impl MpiWorld {
    /// A nonblocking `MPI_Iallgather` (`MPI_Iallgatherv` for uneven shards): the header
    /// exchange happens now, the data moves until [`Work::wait`]. `full` must not be read
    /// before then.
    pub(super) fn all_gather_started(
        &self,
        shard: &Tensor,
        full: &Tensor,
    ) -> Result<Work, CollectiveError> {
        if !on_host(&[shard, full]) {
            return self
                .run(Call::AllGather { shard, full })
                .map(|()| Work::done());
        }
        let dtype = shard.dtype();
        let started = with_bytes_mut_from(full, shard, |dst, src| {
            let (counts, displs) =
                self.shard_layout(CallKind::AllGather, dtype, src.len(), dst.len())?;
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
            let keep = (counts, displs, shard.clone(), full.clone());
            InFlight::new(code, request, keep, self.rank, CallKind::AllGather)
        })
        .map_err(self.unsupported(CallKind::AllGather))??;
        Ok(Work::pending(move || started.wait()))
    }

    /// The all-to-all of [`Self::reduce_scatter`] as `MPI_Ialltoallv`; the local sum
    /// in rank order runs in [`Work::wait`].
    pub(super) fn reduce_scatter_started(
        &self,
        full: &Tensor,
        shard: &Tensor,
        reduce: ReduceOp,
    ) -> Result<Work, CollectiveError> {
        if !on_host(&[full, shard]) {
            let call = Call::ReduceScatter {
                full,
                shard,
                op: reduce,
            };
            return self.run(call).map(|()| Work::done());
        }
        let op = CallKind::ReduceScatter(reduce);
        let dtype = full.dtype();
        check_reducible(dtype).map_err(self.unsupported(op))?;
        let mine = shard.elem_count() * dtype.size_in_bytes();
        let exchange = with_bytes(full, |src| {
            let (send, offsets) = self.shard_layout(op, dtype, mine, src.len())?;
            self.start_exchange(op, src, (offsets, send), mine, full.clone())
        })
        .map_err(self.unsupported(op))??;
        let (shard, n, unsupported) = (shard.clone(), self.size, self.host_error(op));
        Ok(Work::pending(move || {
            with_bytes_mut(&shard, |dst| exchange.reduce_into(dtype, n, dst, reduce))
                .map_err(unsupported)?
        }))
    }

    /// The all-to-all of [`Self::all_reduce`] as `MPI_Ialltoallv`; the sum of this
    /// rank's part and the all-gather of every rank's part run in [`Work::wait`].
    pub(super) fn all_reduce_started(
        &self,
        tensor: &Tensor,
        reduce: ReduceOp,
    ) -> Result<Work, CollectiveError> {
        if !on_host(&[tensor]) {
            let call = Call::AllReduce { tensor, op: reduce };
            return self.run(call).map(|()| Work::done());
        }
        let op = CallKind::AllReduce(reduce);
        let dtype = tensor.dtype();
        check_reducible(dtype).map_err(self.unsupported(op))?;
        let n = self.size;
        let (counts, offsets) = self.all_reduce_parts(dtype, tensor.elem_count(), reduce)?;
        let mine = counts[self.rank] as usize;
        let exchange = with_bytes(tensor, |src| {
            self.start_exchange(
                op,
                src,
                (offsets.clone(), counts.clone()),
                mine,
                tensor.clone(),
            )
        })
        .map_err(self.unsupported(op))??;
        let (tensor, comm, unsupported) = (tensor.clone(), self.comm.clone(), self.host_error(op));
        Ok(Work::pending(move || {
            let mut reduced = vec![0u8; mine + 1];
            exchange.reduce_into(dtype, n, &mut reduced[..mine], reduce)?;
            with_bytes_mut(&tensor, |buf| {
                let mut spare = [0u8];
                let _guard = mpi_lock();
                let mut out = PartitionMut::new(real_mut(buf, &mut spare), counts, offsets);
                comm.0.all_gather_varcount_into(&reduced[..mine], &mut out);
            })
            .map_err(unsupported)
        }))
    }

    /// [`Self::reduce_chunks`]'s all-to-all, nonblocking (`MPI_Ialltoallv`), into a buffer of
    /// its own; `keep` holds `src`'s storage until the call completes.
    fn start_exchange(
        &self,
        op: CallKind,
        src: &[u8],
        send: (Vec<i32>, Vec<i32>),
        mine: usize,
        keep: Tensor,
    ) -> Result<Exchange, CollectiveError> {
        let n = self.size;
        // Never empty, so that its address is a real one (see `real`).
        let mut received = vec![0u8; n * mine + 1];
        let recv_counts = vec![self.count(op, mine)?; n];
        let recv_displs = displacements(&recv_counts);
        let (send_displs, send_counts) = send;
        let byte = u8::equivalent_datatype().as_raw();
        let _guard = mpi_lock();
        // SAFETY: MPI is given a null request to fill, and buffers and count arrays that the
        // returned `InFlight` and `Exchange` keep alive (heap memory, never moved) until
        // MPI_Wait returns.
        let mut request = unsafe { std::mem::zeroed::<mpi::ffi::MPI_Request>() };
        let code = unsafe {
            mpi::ffi::MPI_Ialltoallv(
                address(src),
                send_counts.as_ptr(),
                send_displs.as_ptr(),
                byte,
                received.as_mut_ptr().cast(),
                recv_counts.as_ptr(),
                recv_displs.as_ptr(),
                byte,
                self.comm.0.as_raw(),
                &mut request,
            )
        };
        let keep = (keep, send_counts, send_displs, recv_counts, recv_displs);
        Ok(Exchange {
            call: InFlight::new(code, request, keep, self.rank, op)?,
            received,
            mine,
        })
    }
}
