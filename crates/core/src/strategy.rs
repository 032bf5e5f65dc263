//! The `Strategy` trait: how parameters, gradients and optimizer state are laid out over
//! the ranks, and how a step keeps them consistent.

use crate::{
    Collective, LossScale, OptimizerConfig, RankState, Result, ShardedContext, StateReader,
    TrainModule,
};
use candle_core::{Device, Shape, Tensor};
use std::sync::Arc;

/// Where a micro-batch's backward stands in its optimizer step (what Lightning's
/// `no_backward_sync` context says).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GradSync {
    /// The last micro-batch before the step: gradients are reduced across ranks.
    Reduce,
    /// An earlier one: gradients stay local, unreduced, and add up with the next ones.
    Accumulate,
}

impl GradSync {
    /// [`GradSync::Reduce`] for the last of `count` micro-batches (`micro` from 0).
    pub fn for_micro_batch(micro: usize, count: usize) -> Self {
        if micro + 1 >= count {
            GradSync::Reduce
        } else {
            GradSync::Accumulate
        }
    }
}

/// What an optimizer step does when its reduced gradients hold inf or NaN on some rank
/// (Lightning's `error_if_nonfinite`, or skipping as a loss scaler does).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum OnNonFinite {
    /// Fail with [`Error::NonFinite`](crate::Error::NonFinite), naming the first rank and
    /// parameter.
    #[default]
    Error,
    /// Skip the step on every rank: parameters and optimizer state stay as they were.
    Skip,
}

impl std::fmt::Display for OnNonFinite {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            OnNonFinite::Error => "error",
            OnNonFinite::Skip => "skip",
        })
    }
}

impl std::str::FromStr for OnNonFinite {
    type Err = crate::Error;
    fn from_str(text: &str) -> crate::Result<Self> {
        match text {
            "error" => Ok(OnNonFinite::Error),
            "skip" => Ok(OnNonFinite::Skip),
            other => Err(crate::Error::config(
                "on-nonfinite",
                format!("'{other}' is not one of error, skip"),
            )),
        }
    }
}

/// What one [`StrategyStep::optimizer_step`] did: the same on every rank.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct StepReport {
    /// The step was skipped for inf or NaN gradients (by [`OnNonFinite::Skip`] or the loss
    /// scaler): the parameters and the optimizer state are unchanged.
    pub skipped: bool,
    /// The global L2 norm of the reduced gradients before clipping (`None` on a skipped
    /// step).
    pub grad_norm: Option<f64>,
    /// Where the dynamic loss scaler stands after the step (`16-mixed`).
    pub loss_scale: Option<LossScale>,
}

/// What the trainer asks of every optimizer step, whatever the strategy: given with the
/// optimizer at [`RankStrategy::configure_optimizer`], for the fit about to run.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct StepOptions {
    /// Clip the reduced gradients to this global L2 norm before each step (as torch's
    /// `clip_grad_norm_`), or not at all.
    pub clip_grad_norm: Option<f64>,
    /// What a step does when the reduced gradients hold inf or NaN on some rank (checked
    /// every step, after reduction). Under dynamic loss scaling such steps are the
    /// scaler's to skip, whatever this says.
    pub on_nonfinite: OnNonFinite,
    /// Look, during the first forward and backward after the optimizer was given, for
    /// parameters that get no gradient; that backward's [`BackwardReport`] names them.
    pub find_unused_parameters: bool,
}

/// What one [`StrategyStep::backward`] found: the same on every rank.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct BackwardReport {
    /// The parameters this backward gave no gradient, by name, where it looked (the first
    /// backward after the optimizer was given with
    /// [`StepOptions::find_unused_parameters`]); `None` elsewhere.
    pub unused_parameters: Option<Vec<String>>,
}

/// A distribution strategy as built from its options, before any world exists: what the
/// trainer holds, shared by every rank (DeepSpeed's config, Lightning's `Strategy` object).
///
/// Its one job is to open a rank's sharding context ([`Strategy::open`]); the
/// [`RankStrategy`] that context closes into holds everything that exists only once the
/// world is up: this rank's parameters or shards, its groups, and (from the first fit on)
/// its optimizer state. So no call can come before the parameters exist: there is nothing
/// to call until the rank part does.
///
/// The sequence for one rank, which [`configure_rank`] writes once:
/// - [`open`](Strategy::open) on the rank's world and device;
/// - the module creates its parameters inside [`OpenSharding::context`]
///   (`configure_sharded_model`);
/// - [`close`](OpenSharding::close) freezes the layout (buffers, buckets, shards), giving
///   the rank's [`RankStrategy`], which builds an optimizer at each fit
///   ([`RankStrategy::configure_optimizer`]).
pub trait Strategy: Send + Sync {
    /// The registry name (`single`, `ddp`, ...).
    fn name(&self) -> &str;

    /// Which model state this strategy shards over the ranks.
    fn sharding(&self) -> Sharding;

    /// The ranks this strategy can run on; `Err` names what is wrong with `world_size`.
    fn check_world_size(&self, world_size: usize) -> Result<()> {
        let _ = world_size;
        Ok(())
    }

    /// Opens this rank's sharding context on `world` (which strategies that shard in groups
    /// split) and `device`; parameters created in it draw their initial values from `seed`.
    fn open(&self, world: Arc<dyn Collective>, device: Device, seed: u64) -> Result<OpenSharding>;
}

/// One rank's sharding context while the module creates its parameters in it: what
/// [`Strategy::open`] gives and [`OpenSharding::close`] ends.
pub struct OpenSharding {
    context: ShardedContext,
    close: Box<CloseSharding>,
}

/// How a strategy turns the parameters created in its context into the rank's part.
pub type CloseSharding = dyn FnOnce() -> Result<Box<dyn RankStrategy>> + Send;

impl OpenSharding {
    /// A rank's `context`, which `close` ends (a strategy's [`Strategy::open`] makes it).
    pub fn new(context: ShardedContext, close: Box<CloseSharding>) -> Self {
        OpenSharding { context, close }
    }

    /// The context `configure_sharded_model` creates the parameters in.
    pub fn context(&self) -> &ShardedContext {
        &self.context
    }

    /// Freezes the parameter layout (buffers, buckets, shards) once the module created its
    /// parameters, giving the rank's part. Fails with [`Error::NoParameters`](crate::Error)
    /// when the module created no trainable one.
    pub fn close(self) -> Result<Box<dyn RankStrategy>> {
        (self.close)()
    }
}

/// Creates `module`'s parameters on this rank under `strategy`: opens the sharding context on
/// `world` and `device`, runs `configure_sharded_model` inside it, and closes it. It
/// touches no device of its own: the trainer calls it once per rank, on the world and device
/// the accelerator set up.
pub fn configure_rank<M: TrainModule + ?Sized>(
    strategy: &dyn Strategy,
    world: Arc<dyn Collective>,
    device: Device,
    seed: u64,
    module: &mut M,
) -> Result<Box<dyn RankStrategy>> {
    let open = strategy.open(world, device, seed)?;
    {
        let ctx = open.context();
        let _inside = ctx.enter();
        module.configure_sharded_model(ctx)?;
    }
    open.close()
}

/// One rank's part of a strategy once its parameters exist: made by
/// [`OpenSharding::close`], it holds this rank's parameters or shards, its groups and,
/// once configured, its optimizer state, and plays two roles beside its own, each a trait of its own so a reader
/// (and a wrapper) sees which calls belong where:
/// - steps ([`StrategyStep`]): [`backward`](StrategyStep::backward) once per micro-batch,
///   then [`optimizer_step`](StrategyStep::optimizer_step), each returning its report;
/// - state ([`StrategyState`]): sizes, full parameters, and a checkpoint's save and load.
pub trait RankStrategy: StrategyStep + StrategyState + Send {
    /// The registry name of the strategy that made it.
    fn name(&self) -> &str;

    /// Attaches the world of the stage about to run (each stage brings its own; strategies
    /// that shard in groups split it again).
    fn connect(&mut self, world: Arc<dyn Collective>, device: Device) -> Result<()>;

    /// Builds a fresh optimizer from `config` over this rank's parameters or shards (its
    /// state empty, its step count 0), with what each step of the fit about to run does
    /// beside it: the trainer calls it at the start of every fit, after the module's
    /// `configure_optimizers`. An optimizer step or a checkpoint load before it is an
    /// [`Error::StepOrder`](crate::Error::StepOrder).
    fn configure_optimizer(&mut self, config: &OptimizerConfig, options: StepOptions);
}
/// A strategy's training step: backward per micro-batch, then the optimizer step.
pub trait StrategyStep {
    /// Back-propagates `loss` and accumulates the gradients. `sync` says where this
    /// micro-batch stands in its optimizer step: strategies that reduce gradients inside
    /// backward (the sharded ones) reduce them under [`GradSync::Reduce`] and keep them
    /// local under [`GradSync::Accumulate`]; the others reduce in `optimizer_step` anyway.
    fn backward(&mut self, loss: &Tensor, sync: GradSync) -> Result<BackwardReport>;

    /// Frees whatever a forward that no backward follows (an evaluation or prediction
    /// step) gathered: a strategy that keeps a unit's gathered parameters until backward
    /// would otherwise hold them until the next one.
    fn free_gathered(&mut self) {}

    /// Synchronizes the accumulated gradients, steps the optimizer at learning rate `lr`
    /// (the trainer passes its schedule's rate for this step), clears the gradients, and
    /// reports what the step did. Under dynamic loss scaling, a step whose gradients hold
    /// inf or NaN on any rank is skipped on every rank.
    fn optimizer_step(&mut self, lr: f64) -> Result<StepReport>;
}

/// A strategy's model state: what it holds, in full and in ranges, and a checkpoint's save
/// and load of it.
pub trait StrategyState {
    /// Every parameter in full, by name, in registration order, the frozen ones (see
    /// [`ShardedContext::train_only`]) after the trainable ones of their unit. Collective
    /// under sharding strategies: every rank must call it.
    fn full_parameters(&self) -> Result<Vec<(String, Tensor)>>;

    /// The number of trainable scalar parameters of the whole model.
    fn num_parameters(&self) -> usize;

    /// The number of frozen scalar parameters: no gradient and no optimizer state.
    fn num_frozen_parameters(&self) -> usize {
        0
    }

    /// Bytes of model state this rank holds, counted from its tensors.
    fn state_bytes(&self) -> StateBytes;

    /// Which model state this strategy shards over the ranks.
    fn sharding(&self) -> Sharding;

    /// Every trainable parameter's name and full shape, in registration order (no
    /// collective): what a checkpoint holds.
    fn parameter_shapes(&self) -> Vec<(String, Shape)>;

    /// This rank's range of the trainable parameters and optimizer state, for a checkpoint
    /// (no collective; together the ranks' ranges cover every element once). Frozen
    /// parameters are not saved: they come back from where they were loaded.
    fn save_state(&self) -> Result<RankState>;

    /// Replaces the parameters and optimizer state (and its step count) with the saved ones
    /// `reader` serves, whatever world size saved them. Called after
    /// [`configure_optimizer`](RankStrategy::configure_optimizer).
    fn load_state(&mut self, reader: &dyn StateReader) -> Result<()>;
}

/// Which of parameters, gradients and optimizer state a strategy shards.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Sharding {
    /// Parameters are stored as shards.
    pub params: bool,
    /// Reduced gradients are kept as shards.
    pub grads: bool,
    /// Optimizer state is kept as shards.
    pub optimizer: bool,
}

impl Sharding {
    /// Model-state bytes per rank for `params` f32 parameters over `world_size` ranks with
    /// AdamW (4 bytes parameter, 4 gradient, 8 state), part by part: the ZeRO paper's
    /// formulas with K = 8, without padding.
    pub fn adamw_formula(&self, params: usize, world_size: usize) -> StateBytes {
        self.adamw_formula_with_frozen(params, 0, world_size)
    }

    /// [`Sharding::adamw_formula`] for `params` trainable parameters beside `frozen` ones
    /// (LoRA's base weights), which have no gradient and no optimizer state: they count in
    /// the parameters' bytes only.
    pub fn adamw_formula_with_frozen(
        &self,
        params: usize,
        frozen: usize,
        world_size: usize,
    ) -> StateBytes {
        let part = |sharded: bool, bytes: usize, count: usize| {
            if sharded {
                bytes * count / world_size
            } else {
                bytes * count
            }
        };
        StateBytes {
            params: part(self.params, 4, params + frozen),
            grads: part(self.grads, 4, params),
            optimizer: part(self.optimizer, 8, params),
        }
    }

    /// [`Sharding::adamw_formula`] in all (16Ψ, 8Ψ + 8Ψ/W, 4Ψ + 12Ψ/W, 16Ψ/W).
    pub fn adamw_formula_bytes(&self, params: usize, world_size: usize) -> usize {
        self.adamw_formula(params, world_size).total()
    }
}

/// Bytes of model state held by one rank.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct StateBytes {
    /// Parameters (full or shards).
    pub params: usize,
    /// The gradients the last optimizer step consumed, after reduction (full or shards).
    pub grads: usize,
    /// Optimizer state (moments, momentum buffers).
    pub optimizer: usize,
}

impl StateBytes {
    /// All three together.
    pub fn total(&self) -> usize {
        self.params + self.grads + self.optimizer
    }
}
