//! The `Strategy` trait: how parameters, gradients and optimizer state are laid out over
//! the ranks, and how a step keeps them consistent.

use crate::{
    Collective, LossScale, OptimizerConfig, RankState, Result, ShardedContext, StateReader,
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

/// What one [`Strategy::optimizer_step`] did: the same on every rank.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct StepReport {
    /// The step was skipped for inf or NaN gradients (by [`OnNonFinite::Skip`] or the loss
    /// scaler): the parameters and the optimizer state are unchanged.
    pub skipped: bool,
    /// The global L2 norm of the reduced gradients before clipping, where the step
    /// computed it (with gradient clipping on).
    pub grad_norm: Option<f64>,
    /// Where the dynamic loss scaler stands after the step (`16-mixed`).
    pub loss_scale: Option<LossScale>,
}

/// One rank's instance of a distribution strategy.
///
/// The trainer gives each rank its own instance ([`Strategy::for_new_rank`]) and calls, in
/// order: [`connect`](Strategy::connect) at every stage, [`sharded_context`](Strategy::sharded_context)
/// and [`finish_sharding`](Strategy::finish_sharding) once around `configure_sharded_model`,
/// [`configure_optimizer`](Strategy::configure_optimizer) at each fit, then per step
/// [`backward`](Strategy::backward) (once per micro-batch) and
/// [`optimizer_step`](Strategy::optimizer_step).
pub trait Strategy: Send {
    /// The registry name (`single`, `ddp`, ...).
    fn name(&self) -> &str;

    /// A fresh, unconfigured instance with the same options, for another rank.
    fn for_new_rank(&self) -> Box<dyn Strategy>;

    /// The ranks this strategy can run on; `Err` names what is wrong with `world_size`.
    fn check_world_size(&self, world_size: usize) -> Result<()> {
        let _ = world_size;
        Ok(())
    }

    /// Attaches this rank's world for the stage about to run (a collective for strategies
    /// that split it into groups).
    fn connect(&mut self, world: Arc<dyn Collective>, device: Device) -> Result<()>;

    /// Opens the context in which the module creates its parameters.
    fn sharded_context(&mut self, seed: u64) -> Result<ShardedContext>;

    /// Called after `configure_sharded_model` returned and the context closed: freeze the
    /// parameter layout (buffers, buckets, shards).
    fn finish_sharding(&mut self) -> Result<()>;

    /// Whether `configure_sharded_model` already ran for this instance.
    fn is_configured(&self) -> bool;

    /// Builds the optimizer over this rank's parameters (or their shards).
    fn configure_optimizer(&mut self, config: &OptimizerConfig) -> Result<()>;

    /// Clip the reduced gradients to this global L2 norm before each optimizer step (as
    /// torch's `clip_grad_norm_`), or not at all.
    fn set_clip_grad_norm(&mut self, max_norm: Option<f64>);

    /// What [`optimizer_step`](Strategy::optimizer_step) does when the reduced gradients
    /// hold inf or NaN on some rank (checked every step, on the gradients after reduction).
    /// Under dynamic loss scaling such steps are the scaler's to skip, whatever this says.
    fn set_on_nonfinite(&mut self, policy: OnNonFinite);

    /// Which wrapped units recompute their forward in backward instead of keeping their
    /// activations (activation checkpointing); set before `sharded_context`, kept for
    /// [`Strategy::for_new_rank`].
    fn set_activation_checkpointing(&mut self, ac: crate::ActivationCheckpointing);

    /// Back-propagates `loss` and accumulates the gradients. `sync` says where this
    /// micro-batch stands in its optimizer step: strategies that reduce gradients inside
    /// backward (the sharded ones) reduce them under [`GradSync::Reduce`] and keep them
    /// local under [`GradSync::Accumulate`]; the others reduce in `optimizer_step` anyway.
    fn backward(&mut self, loss: &Tensor, sync: GradSync) -> Result<()>;

    /// Frees whatever a forward that no backward follows (an evaluation or prediction
    /// step) gathered: a strategy that keeps a unit's gathered parameters until backward
    /// would otherwise hold them until the next one.
    fn free_gathered(&mut self) {}

    /// Looks, during the next forward and [`backward`](Strategy::backward), for parameters
    /// that get no gradient; [`unused_parameters`](Strategy::unused_parameters) tells them
    /// after that backward. Called before the forward.
    fn find_unused_parameters(&mut self);

    /// The parameters the last `backward` after
    /// [`find_unused_parameters`](Strategy::find_unused_parameters) gave no gradient, by
    /// name (the same on every rank: every rank runs the same graph).
    fn unused_parameters(&self) -> Vec<String>;

    /// Synchronizes the accumulated gradients, steps the optimizer at learning rate `lr`
    /// (the trainer passes its schedule's rate for this step), clears the gradients, and
    /// reports what the step did. Under dynamic loss scaling, a step whose gradients hold
    /// inf or NaN on any rank is skipped on every rank.
    fn optimizer_step(&mut self, lr: f64) -> Result<StepReport>;

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
    /// [`configure_optimizer`](Strategy::configure_optimizer).
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
