//! ZeRO stages 1 and 2: replicated parameters, optimizer state (and, at stage 2, gradients)
//! sharded over the ranks.
//!
//! All parameters form one flat layout padded to a multiple of W. Both stages reduce the
//! gradients in buckets issued during backward, as ddp does: stage 1 all-reduces each bucket
//! and keeps its range of the result; stage 2 reduce-scatters each bucket to the ranks that
//! own its elements, so only the range survives and the full gradients are freed as
//! backward goes. Each rank steps its range of the parameters with its shard of optimizer
//! state, then all-gathers, in rounds that never build the full flat buffer, hand every
//! rank the updated parameters.

use crate::layout::flat_grad::flatten_consuming;
use crate::layout::flat_layout::FlatLayout;
use crate::replicated::bucket_reduce::{buckets, BucketPlan, DEFAULT_BUCKET_CAP_BYTES};
use crate::replicated::grad_reduce::GradReduce;
use crate::replicated::replicated_state::{tensor_bytes, ReplicatedState};
use crate::replicated::replicated_strategy::Replicated;
use crate::step::nonfinite::{first_nonfinite_in, step_report};
use candle_core::{DType, Device, Tensor, Var};
use wick_core::{Collective, CollectiveExt, Result, Sharding, StepReport};

/// Which state ZeRO shards.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Stage {
    /// Optimizer state.
    One,
    /// Optimizer state and gradients.
    Two,
}

/// ZeRO stage 1 or 2.
pub type Zero = Replicated<ZeroReduce>;

/// The step of ZeRO stages 1 and 2 ([`Zero`]): gradients reduced to this rank's shard, the
/// shard stepped with its optimizer state, the updated parameters all-gathered.
#[derive(Debug, Clone, Copy)]
pub struct ZeroReduce {
    stage: Stage,
    chunk: usize,
    /// The gradient buckets (as ddp's).
    bucket_cap_bytes: usize,
}

impl Zero {
    /// Stage 1: optimizer state sharded.
    pub fn stage1() -> Self {
        Self::at(Stage::One, "zero1")
    }

    /// Stage 2: optimizer state and gradients sharded.
    pub fn stage2() -> Self {
        Self::at(Stage::Two, "zero2")
    }

    fn at(stage: Stage, name: &'static str) -> Self {
        Replicated::with_reduce(
            name,
            ZeroReduce {
                stage,
                chunk: DEFAULT_CHUNK,
                bucket_cap_bytes: DEFAULT_BUCKET_CAP_BYTES,
            },
        )
    }

    /// Elements per rank in each round of stage 2's all-gather of the updated parameters
    /// (default 1Mi: 4 MiB); smaller rounds use less memory and more calls.
    pub fn with_chunk(mut self, elements: usize) -> Self {
        self.reduce_mut().chunk = elements.max(1);
        self
    }

    /// The gradient bucket size in bytes (default 25 MiB, as ddp's): stage 1 all-reduces
    /// each bucket, stage 2 reduce-scatters it.
    pub fn with_bucket_cap_bytes(mut self, bytes: usize) -> Self {
        self.reduce_mut().bucket_cap_bytes = bytes.max(1);
        self
    }
}

/// Elements per rank in each round of stage 2's all-gather (4 MiB).
const DEFAULT_CHUNK: usize = 1 << 20;

/// The rounds of a chunked collective over shards of `layout`: (start within the shard,
/// length), `chunk` elements per rank at most. Round (start, len) moves rank r's flat
/// elements [r*S + start, r*S + start + len) to or from offset r*len of a W*len buffer.
fn rounds(layout: &FlatLayout, chunk: usize) -> impl Iterator<Item = (usize, usize)> {
    let s = layout.shard_len();
    (0..s)
        .step_by(chunk)
        .map(move |start| (start, chunk.min(s - start)))
}

/// Flat (contiguous) views of `tensors`, sharing their storage.
fn flat_views(tensors: impl Iterator<Item = Tensor>) -> Result<Vec<Tensor>> {
    Ok(tensors
        .map(|t| t.flatten_all())
        .collect::<candle_core::Result<Vec<_>>>()?)
}

/// All-gathers the updated shards straight into the replicated parameters, round by round,
/// so no full flat buffer is ever allocated.
fn gather_into_params(
    world: &dyn Collective,
    chunk: usize,
    layout: &FlatLayout,
    shard: &Tensor,
    params: &[Var],
) -> Result<()> {
    let (s, w) = (layout.shard_len(), layout.world_size());
    // Contiguous parameters: their flat views share the parameters' storage.
    let flat_params = flat_views(params.iter().map(|p| p.as_tensor().clone()))?;
    for (start, len) in rounds(layout, chunk) {
        let piece = shard.narrow(0, start, len)?.contiguous()?;
        let gathered = Tensor::zeros(len * w, DType::F32, shard.device())?;
        world.all_gather_into(&piece, &gathered)?;
        for r in 0..w {
            for (i, _, within, at) in layout.pieces_in(r * s + start..r * s + start + len) {
                let src = gathered.narrow(0, r * len + at, within.len())?;
                flat_params[i].slice_set(&src, 0, within.start)?;
            }
        }
    }
    Ok(())
}

/// This rank's range of the flat concatenation of `tensors`, copied out piece by piece
/// (never the whole concatenation), zero-padded to the shard length.
pub(crate) fn shard_of(
    layout: &FlatLayout,
    rank: usize,
    tensors: &[Tensor],
    device: &Device,
) -> Result<Tensor> {
    let mut parts = Vec::new();
    let mut filled = 0;
    for (index, _, within, at) in layout.pieces(rank) {
        debug_assert_eq!(at, filled);
        parts.push(
            tensors[index]
                .flatten_all()?
                .narrow(0, within.start, within.len())?,
        );
        filled = at + within.len();
    }
    if filled < layout.shard_len() {
        parts.push(Tensor::zeros(
            layout.shard_len() - filled,
            DType::F32,
            device,
        )?);
    }
    Ok(Tensor::cat(&parts, 0)?)
}

impl ZeroReduce {
    /// How a step's gradients are reduced: stage 1 all-reduces each bucket, stage 2
    /// reduce-scatters it to the owners of its elements.
    fn plan(&self, state: &ReplicatedState) -> BucketPlan {
        let buckets = buckets(&state.params, self.bucket_cap_bytes);
        match self.stage {
            Stage::One => BucketPlan::whole(buckets),
            Stage::Two => {
                let rank = state.world().rank();
                BucketPlan::sharded(buckets, state.layout.clone(), rank)
            }
        }
    }
}

impl ZeroReduce {
    /// Stage 1's step: the full averaged gradient is kept through the step (stage 1 shards
    /// only the optimizer state); its buffer then receives the gathered update.
    fn step_whole_grads(
        &self,
        state: &mut ReplicatedState,
        layout: &FlatLayout,
        world: &dyn Collective,
    ) -> Result<StepReport> {
        let (device, rank) = (state.params[0].device().clone(), world.rank());
        let range = layout.shard(rank);
        let plan = self.plan(state);
        let grads = state.averaged_grads(plan)?.into_iter().map(Some);
        let flat_grad = flatten_consuming(grads, layout, DType::F32, &device)?;
        // Every rank holds the whole averaged gradient: each decides alone.
        let whole = 0..flat_grad.elem_count();
        let locate = |grads: &[Tensor], _| first_nonfinite_in(layout, whole, &grads[0]);
        let mut whole = [flat_grad];
        let grad_norm = state.check(&mut whole, locate, None)?;
        if grad_norm.is_none() {
            return Ok(step_report(None));
        }
        let [flat_grad] = whole;
        let shard = param_shard(layout, rank, &state.params)?;
        state.grad_bytes = tensor_bytes(&flat_grad);
        let shard_grad = flat_grad.narrow(0, range.start, range.len())?;
        state
            .optimizer()?
            .step(std::slice::from_ref(&shard), &[shard_grad])?;
        world.all_gather_into(shard.as_tensor(), &flat_grad)?;
        for (entry, var) in layout.entries().iter().zip(&state.params) {
            var.set(&entry.view(&flat_grad)?)?;
        }
        Ok(step_report(grad_norm))
    }

    /// Stage 2's step: each rank steps the gradient shard reduced to it, the full gradients
    /// gone before the parameter shard is copied out.
    fn step_sharded_grads(
        &self,
        state: &mut ReplicatedState,
        layout: &FlatLayout,
        world: &dyn Collective,
    ) -> Result<StepReport> {
        let rank = world.rank();
        let range = layout.shard(rank);
        let plan = self.plan(state);
        // A sharded plan reduces every bucket into the one flat shard of this rank.
        let shard_grad = Tensor::cat(&state.averaged_grads(plan)?, 0)?;
        let locate =
            |grads: &[Tensor], _| first_nonfinite_in(layout, range.start..range.end, &grads[0]);
        let mut shard_grads = [shard_grad];
        let grad_norm = state.check(&mut shard_grads, locate, Some(world))?;
        if grad_norm.is_none() {
            return Ok(step_report(None));
        }
        let [shard_grad] = shard_grads;
        let shard = param_shard(layout, rank, &state.params)?;
        state.grad_bytes = tensor_bytes(&shard_grad);
        state
            .optimizer()?
            .step(std::slice::from_ref(&shard), &[shard_grad])?;
        gather_into_params(world, self.chunk, layout, shard.as_tensor(), &state.params)?;
        Ok(step_report(grad_norm))
    }
}

/// This rank's range of the parameters, the buffer its optimizer steps in place.
fn param_shard(layout: &FlatLayout, rank: usize, params: &[Var]) -> Result<Var> {
    let device = params[0].device().clone();
    let params: Vec<Tensor> = params.iter().map(|v| v.as_tensor().clone()).collect();
    let shard = shard_of(layout, rank, &params, &device)?;
    Ok(Var::from_tensor(&shard)?)
}

impl GradReduce for ZeroReduce {
    fn step(&self, state: &mut ReplicatedState) -> Result<StepReport> {
        let layout = state.layout.clone();
        let world = state.world().clone();
        match self.stage {
            Stage::One => self.step_whole_grads(state, &layout, world.as_ref()),
            Stage::Two => self.step_sharded_grads(state, &layout, world.as_ref()),
        }
    }

    fn overlapped(&self, state: &ReplicatedState) -> Option<BucketPlan> {
        Some(self.plan(state))
    }

    fn sharding(&self) -> Sharding {
        Sharding {
            params: false,
            grads: self.stage == Stage::Two,
            optimizer: true,
        }
    }
}
