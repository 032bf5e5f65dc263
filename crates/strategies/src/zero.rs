//! ZeRO stages 1 and 2: replicated parameters, optimizer state (and, at stage 2, gradients)
//! sharded over the ranks.
//!
//! All parameters form one flat layout padded to a multiple of W. At each step the
//! gradients are flattened; stage 1 all-reduces them and keeps its range, stage 2
//! reduce-scatters them so only the range survives. Each rank steps its range of the
//! parameters with its shard of optimizer state, then one all-gather hands every rank the
//! updated parameters.

use crate::flat_layout::FlatLayout;
use crate::replicated::{tensor_bytes, Replicated};
use candle_core::{DType, Device, Tensor, Var};
use std::sync::Arc;
use wick_core::{
    Collective, OptimizerConfig, ReduceOp, Result, ShardedContext, StateBytes, Strategy,
};

/// Which state ZeRO shards.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Stage {
    /// Optimizer state.
    One,
    /// Optimizer state and gradients.
    Two,
}

/// ZeRO stage 1 or 2.
pub struct Zero {
    stage: Stage,
    layout: Option<FlatLayout>,
    state: Replicated,
}

impl Zero {
    /// Stage 1: optimizer state sharded.
    pub fn stage1() -> Self {
        Zero {
            stage: Stage::One,
            layout: None,
            state: Replicated::default(),
        }
    }

    /// Stage 2: optimizer state and gradients sharded.
    pub fn stage2() -> Self {
        Zero {
            stage: Stage::Two,
            ..Zero::stage1()
        }
    }

    fn layout(&self) -> Result<&FlatLayout> {
        self.layout
            .as_ref()
            .ok_or_else(|| wick_core::Error::NotReady {
                strategy: self.name().to_string(),
                message: "step before configure_sharded_model".into(),
            })
    }
}

/// `tensors` flattened end to end and zero-padded to `padded` elements.
pub(crate) fn flatten_padded(
    tensors: &[Tensor],
    numel: usize,
    padded: usize,
    device: &Device,
) -> Result<Tensor> {
    let mut parts = tensors
        .iter()
        .map(|t| t.flatten_all())
        .collect::<candle_core::Result<Vec<_>>>()?;
    if padded > numel {
        parts.push(Tensor::zeros(padded - numel, DType::F32, device)?);
    }
    Ok(Tensor::cat(&parts, 0)?)
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

impl Strategy for Zero {
    fn name(&self) -> &str {
        match self.stage {
            Stage::One => "zero1",
            Stage::Two => "zero2",
        }
    }

    fn for_new_rank(&self) -> Box<dyn Strategy> {
        Box::new(Zero {
            stage: self.stage,
            layout: None,
            state: Replicated::default(),
        })
    }

    fn connect(&mut self, world: Arc<dyn Collective>, device: Device) {
        self.state.connect(world, device)
    }

    fn sharded_context(&mut self, seed: u64) -> Result<ShardedContext> {
        let name = self.name().to_string();
        self.state.sharded_context(&name, seed)
    }

    fn finish_sharding(&mut self) -> Result<()> {
        let name = self.name().to_string();
        self.state.finish_sharding(&name)?;
        let world_size = self.state.world(&name)?.world_size();
        let entries = self
            .state
            .names
            .iter()
            .cloned()
            .zip(self.state.params.iter().map(|p| p.shape().clone()));
        self.layout = Some(FlatLayout::new(entries, world_size));
        Ok(())
    }

    fn is_configured(&self) -> bool {
        self.state.is_configured()
    }

    fn configure_optimizer(&mut self, config: &OptimizerConfig) -> Result<()> {
        self.state.configure_optimizer(config)
    }

    fn backward(&mut self, loss: &Tensor) -> Result<()> {
        self.state.backward(loss)
    }

    fn optimizer_step(&mut self) -> Result<()> {
        let name = self.name().to_string();
        let layout = self.layout()?.clone();
        let world = self.state.world(&name)?.clone();
        let device = self.state.params[0].device().clone();
        let rank = world.rank();
        let range = layout.shard(rank);

        let grads = self.state.take_grads()?;
        let flat_grad = flatten_padded(&grads, layout.numel(), layout.padded(), &device)?;
        drop(grads);
        let shard_grad = match self.stage {
            Stage::One => {
                world.all_reduce_in_place(&flat_grad, ReduceOp::Mean)?;
                self.state.grad_bytes = tensor_bytes(&flat_grad);
                flat_grad.narrow(0, range.start, range.len())?
            }
            Stage::Two => {
                let shard = Tensor::zeros(range.len(), DType::F32, &device)?;
                world.reduce_scatter_into(&flat_grad, &shard, ReduceOp::Mean)?;
                drop(flat_grad);
                self.state.grad_bytes = tensor_bytes(&shard);
                shard
            }
        };

        let params: Vec<Tensor> = self
            .state
            .params
            .iter()
            .map(|v| v.as_tensor().clone())
            .collect();
        let shard = Var::from_tensor(&shard_of(&layout, rank, &params, &device)?)?;
        self.state
            .optimizer(&name)?
            .step(std::slice::from_ref(&shard), &[shard_grad])?;

        let full = Tensor::zeros(layout.padded(), DType::F32, &device)?;
        world.all_gather_into(shard.as_tensor(), &full)?;
        for (entry, var) in layout.entries().iter().zip(&self.state.params) {
            var.set(
                &full
                    .narrow(0, entry.offset, entry.numel())?
                    .reshape(entry.shape.clone())?,
            )?;
        }
        Ok(())
    }

    fn full_parameters(&self) -> Result<Vec<(String, Tensor)>> {
        self.state.full_parameters()
    }

    fn num_parameters(&self) -> usize {
        self.state.num_parameters()
    }

    fn state_bytes(&self) -> StateBytes {
        self.state.state_bytes()
    }
}
