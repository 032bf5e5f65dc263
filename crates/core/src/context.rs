//! The sharding context: the only place a module's parameters are created.
//!
//! A strategy opens it with a [`ParamSource`] that decides what a parameter request makes
//! (a full replica, or only this rank's shard). The accelerator enters it around
//! `configure_sharded_model` and leaves it after; a request made outside is an error, so a
//! parameter can never be created by a path the strategy does not see.

use crate::{lock, BlockFormat, Collective, CollectiveExt, ParamInit, WeightSource};
use candle_core::{DType, Device, Shape, Tensor};
use candle_nn::var_builder::SimpleBackend;
use candle_nn::{Init, VarBuilder};
use std::cell::Cell;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

thread_local! {
    static ACTIVE: Cell<bool> = const { Cell::new(false) };
}

/// Whether this thread is inside a strategy's sharding context right now.
pub fn sharding_context_active() -> bool {
    ACTIVE.with(Cell::get)
}

/// What becomes of the block a unit built at wrap time, as its strategy says when the unit
/// ends ([`ParamSource::end_unit`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum UnitBlock {
    /// The parameters are whole and stay put: the block built at wrap time serves every
    /// step.
    Kept,
    /// The parameters are sharded: the block is rebuilt each step over the step's
    /// parameters ([`ParamSource::unit_params`]).
    Rebuilt,
}

/// The two forms of a unit's run that [`ParamSource::apply_unit`] picks from, both the
/// block applied to an input.
pub struct UnitRuns {
    /// The block built over a `VarBuilder` the strategy hands in, for a unit the strategy
    /// runs itself (gathered for each use, under full sharding).
    pub in_strategy: UnitFn,
    /// The block over this step's parameters ([`Wrapped::get`]), run directly or
    /// recomputed in backward.
    pub on_params: RecomputeFn,
}

/// One parameter a module asks for inside a strategy's context: what
/// [`ParamSource::get_or_create`] makes.
#[derive(Clone, Copy)]
pub struct ParamRequest<'a> {
    /// The full name (`blocks.0.attn.q_proj.weight`).
    pub name: &'a str,
    /// The full shape, whatever part of it this rank holds.
    pub shape: &'a Shape,
    /// Where its values come from: loaded weights or an init.
    pub init: &'a ParamInit,
    /// The dtype the module asked for.
    pub dtype: DType,
    /// The rank's device.
    pub device: &'a Device,
    /// Whether it trains. One that does not (a base weight under LoRA) is a plain tensor,
    /// not a variable: backward gives it no gradient, and the strategy keeps no gradient
    /// buffer, no reduction and no optimizer state for it.
    pub trainable: bool,
    /// The form a frozen parameter is born quantized in ([`ShardedContext::quantize_frozen`]),
    /// if any: the tensor returned is then its stored blocks (u8,
    /// [`BlockFormat::stored_len`] bytes for the full shape), which the module decodes where
    /// it uses them. A strategy that cannot keep it so refuses the request by name.
    pub quantize: Option<BlockFormat>,
}

/// What a strategy does with a parameter request made inside its context.
pub trait ParamSource: Send + Sync {
    /// Creates the parameter `request` names (or returns it, when asked again with the
    /// same shape). Under a sharding strategy the tensor returned is this rank's view of
    /// the parameter and the bytes behind it are only this rank's shard.
    fn get_or_create(&self, request: ParamRequest<'_>) -> candle_core::Result<Tensor>;

    /// Whether `name` was created already.
    fn contains(&self, name: &str) -> bool;

    /// Starts a wrapped unit called `name`: parameters requested until
    /// [`ParamSource::end_unit`] belong to it. Returns the unit's id.
    fn begin_unit(&self, name: &str) -> candle_core::Result<usize> {
        let _ = name;
        Ok(0)
    }

    /// Ends the unit `unit` (its layout is complete: a sharding strategy makes its shard
    /// now), saying what becomes of the block built at wrap time.
    fn end_unit(&self, unit: usize) -> candle_core::Result<UnitBlock> {
        let _ = unit;
        Ok(UnitBlock::Kept)
    }

    /// Applies unit `unit` to `input` ([`Wrapped::apply`]): the one door through which a
    /// unit's forward enters the strategy, which runs it as it plans (directly, recomputed
    /// in backward, or gathered for this use only) under its policy (mixed precision's
    /// casts). The default runs the block over this step's parameters.
    fn apply_unit(&self, unit: usize, xs: &Tensor, runs: UnitRuns) -> candle_core::Result<Tensor> {
        let _ = unit;
        (runs.on_params)(xs)
    }

    /// A `VarBuilder` (at the root of the model's names) over the unit's parameters for the
    /// current step, for a unit whose block is [`UnitBlock::Rebuilt`]; the handle narrows
    /// it to its own name. Gathering is a collective, done once per step and kept until the
    /// step's backward.
    fn unit_params(&self, unit: usize) -> candle_core::Result<VarBuilder<'static>> {
        let _ = unit;
        candle_core::bail!("this strategy does not gather units")
    }
}

/// Handed to `configure_sharded_model`: a candle-nn [`VarBuilder`] whose parameters the
/// strategy creates, plus the world the rank is part of.
#[derive(Clone)]
pub struct ShardedContext {
    source: Arc<dyn ParamSource>,
    open: Arc<AtomicBool>,
    choices: Arc<ParamChoices>,
    world: Arc<dyn Collective>,
    device: Device,
    strategy: String,
}

impl ShardedContext {
    /// A closed context over `source`; [`ShardedContext::enter`] opens it.
    pub fn new(
        source: Arc<dyn ParamSource>,
        world: Arc<dyn Collective>,
        device: Device,
        strategy: impl Into<String>,
    ) -> Self {
        ShardedContext {
            source,
            open: Arc::new(AtomicBool::new(false)),
            choices: Arc::default(),
            world,
            device,
            strategy: strategy.into(),
        }
    }

    /// A candle-nn `VarBuilder` (f32) whose parameter requests go to the strategy.
    pub fn var_builder(&self) -> VarBuilder<'static> {
        let backend = GuardedSource {
            source: self.source.clone(),
            open: self.open.clone(),
            choices: self.choices.clone(),
            strategy: self.strategy.clone(),
        };
        VarBuilder::from_backend(Box::new(backend), DType::F32, self.device.clone())
    }

    /// Parameters created from now on take their values from `weights` (for instance
    /// [`PretrainedWeights`](crate::PretrainedWeights) over a consolidated checkpoint) instead
    /// of their initializer; each rank reads only the elements it keeps. A parameter the
    /// weights lack, or hold with another shape, is an error naming it.
    pub fn load_weights(&self, weights: Arc<dyn WeightSource>) {
        *lock(&self.choices.weights) = Some(weights);
    }

    /// Parameters created from now on are trainable only when `filter` says so of their
    /// full name; the others are frozen (see [`ParamSource::get_or_create`]). Without a
    /// filter every parameter is trainable. LoRA freezes all but its adapters this way.
    pub fn train_only(&self, filter: impl Fn(&str) -> bool + Send + Sync + 'static) {
        *lock(&self.choices.trainable) = Some(Arc::new(filter));
    }

    /// Parameters whose full name `filter` picks are drawn from their initializer even
    /// when [`ShardedContext::load_weights`] gave weights: the new layers of a pretrained
    /// model, such as LoRA's adapters.
    pub fn init_only(&self, filter: impl Fn(&str) -> bool + Send + Sync + 'static) {
        *lock(&self.choices.fresh) = Some(Arc::new(filter));
    }

    /// Frozen parameters created from now on for whose full name `format_of` gives a form
    /// are born quantized in it (QLoRA's base): the strategy keeps their stored blocks,
    /// never the f32 tensor, and hands them out as a u8 tensor (see
    /// [`ParamRequest::quantize`]).
    pub fn quantize_frozen(
        &self,
        format_of: impl Fn(&str) -> Option<BlockFormat> + Send + Sync + 'static,
    ) {
        *lock(&self.choices.quantized) = Some(Arc::new(format_of));
    }

    /// This rank's index.
    pub fn rank(&self) -> usize {
        self.world.rank()
    }

    /// The number of ranks.
    pub fn world_size(&self) -> usize {
        self.world.world_size()
    }

    /// The world, usable inside the hook (it is up before the hook runs).
    pub fn world(&self) -> &Arc<dyn Collective> {
        &self.world
    }

    /// This rank's device.
    pub fn device(&self) -> &Device {
        &self.device
    }

    /// The name of the strategy that opened the context.
    pub fn strategy(&self) -> &str {
        &self.strategy
    }

    /// Whether parameters can be created through this context now.
    pub fn is_open(&self) -> bool {
        self.open.load(Ordering::SeqCst)
    }

    /// Wraps a block as a unit: `build` makes the block from a `VarBuilder` rooted at `name`.
    ///
    /// `build` runs once now to create the unit's parameters (through the strategy), and the
    /// returned handle yields the block at every forward: under replicated strategies the
    /// block built now, under sharded ones a block rebuilt over this step's gathered
    /// parameters. `build` must ask for the same names and shapes every time.
    pub fn wrap<T, F>(&self, name: &str, build: F) -> candle_core::Result<Wrapped<T>>
    where
        T: Clone + Send,
        F: Fn(VarBuilder<'static>) -> candle_core::Result<T> + Send + Sync + 'static,
    {
        if !self.is_open() {
            candle_core::bail!("unit '{name}' wrapped outside configure_sharded_model")
        }
        let unit = self.source.begin_unit(name)?;
        let built = build(self.var_builder().pp(name));
        let block = self.source.end_unit(unit)?;
        let registered = (block == UnitBlock::Kept).then_some(built?);
        Ok(Wrapped {
            name: name.to_string(),
            unit,
            source: self.source.clone(),
            build: Arc::new(build),
            registered,
        })
    }

    /// Opens the context on this thread until the guard drops.
    pub fn enter(&self) -> ContextGuard {
        self.open.store(true, Ordering::SeqCst);
        ACTIVE.with(|a| a.set(true));
        ContextGuard {
            open: self.open.clone(),
        }
    }
}

/// Keeps a [`ShardedContext`] open; dropping it closes the context.
pub struct ContextGuard {
    open: Arc<AtomicBool>,
}

impl Drop for ContextGuard {
    fn drop(&mut self) {
        self.open.store(false, Ordering::SeqCst);
        ACTIVE.with(|a| a.set(false));
    }
}

/// A choice of parameters by full name: [`ShardedContext::train_only`],
/// [`ShardedContext::init_only`].
type NameFilter = Arc<dyn Fn(&str) -> bool + Send + Sync>;

/// The form a parameter is born quantized in, by full name: [`ShardedContext::quantize_frozen`].
type FormatOf = Arc<dyn Fn(&str) -> Option<BlockFormat> + Send + Sync>;

/// What the model chose for the parameters it creates from now on, shared by a context and
/// the `VarBuilder`s it hands out.
#[derive(Default)]
struct ParamChoices {
    /// Where values come from instead of initializers.
    weights: Mutex<Option<Arc<dyn WeightSource>>>,
    /// Which train (all, when none).
    trainable: Mutex<Option<NameFilter>>,
    /// Which take their initializer even with weights loaded.
    fresh: Mutex<Option<NameFilter>>,
    /// Which frozen ones are born quantized, and in what form.
    quantized: Mutex<Option<FormatOf>>,
}

struct GuardedSource {
    source: Arc<dyn ParamSource>,
    open: Arc<AtomicBool>,
    choices: Arc<ParamChoices>,
    strategy: String,
}

impl SimpleBackend for GuardedSource {
    fn get(
        &self,
        shape: Shape,
        name: &str,
        init: Init,
        dtype: DType,
        dev: &Device,
    ) -> candle_core::Result<Tensor> {
        if !self.open.load(Ordering::SeqCst) {
            candle_core::bail!(
                "parameter '{name}' requested outside configure_sharded_model; \
                 the {} strategy creates parameters only inside its sharding context",
                self.strategy
            )
        }
        let fresh = lock(&self.choices.fresh).as_ref().is_some_and(|f| f(name));
        let init = match &*lock(&self.choices.weights) {
            Some(weights) if !fresh => ParamInit::Weights(weights.clone()),
            _ => ParamInit::Init(init),
        };
        let trainable = lock(&self.choices.trainable)
            .as_ref()
            .is_none_or(|f| f(name));
        let quantize = match &*lock(&self.choices.quantized) {
            Some(format_of) if !trainable => format_of(name),
            _ => None,
        };
        self.source.get_or_create(ParamRequest {
            name,
            shape: &shape,
            init: &init,
            dtype,
            device: dev,
            trainable,
            quantize,
        })
    }

    fn get_unchecked(&self, name: &str, _: DType, _: &Device) -> candle_core::Result<Tensor> {
        candle_core::bail!("parameter '{name}' requested without a shape; wick needs a shape to create or shard it")
    }

    fn contains_tensor(&self, name: &str) -> bool {
        self.source.contains(name)
    }
}

/// A unit's forward as the strategy runs it: build the block over the `VarBuilder`, apply it.
pub type UnitFn =
    Arc<dyn Fn(VarBuilder<'static>, &Tensor) -> candle_core::Result<Tensor> + Send + Sync>;

/// A wrapped block applied to an input: run directly, or again in backward where the
/// strategy recomputes the unit.
pub type RecomputeFn = Arc<dyn Fn(&Tensor) -> candle_core::Result<Tensor> + Send + Sync>;

type Build<T> = Arc<dyn Fn(VarBuilder<'static>) -> candle_core::Result<T> + Send + Sync>;

/// A wrapped block (see [`ShardedContext::wrap`]); [`Wrapped::get`] yields it for this step.
///
/// Under a sharding strategy the handle keeps nothing between calls: the gathered
/// parameters are owned by the strategy, which frees them after backward.
pub struct Wrapped<T> {
    name: String,
    unit: usize,
    source: Arc<dyn ParamSource>,
    build: Build<T>,
    registered: Option<T>,
}

impl<T: Clone> Wrapped<T> {
    /// The block over this step's parameters. Under a sharding strategy the first call of a
    /// step gathers the unit (a collective: every rank calls it at the same point), later
    /// calls in the same step reuse that gather, and the block is rebuilt over views of it
    /// (cheap: candle-nn layers only hold tensors).
    pub fn get(&self) -> candle_core::Result<T> {
        match &self.registered {
            Some(block) => Ok(block.clone()),
            None => (self.build)(self.source.unit_params(self.unit)?.pp(&self.name)),
        }
    }

    /// Applies the block to `input` with `f`, the way the strategy wants a unit run: under
    /// full sharding as one autograd unit whose gathered parameters are freed right after
    /// forward and gathered again in backward; under activation checkpointing as one whose
    /// forward runs again in backward; elsewhere simply `f(&self.get()?, input)`.
    /// `f` may run more than once per step (again in backward), so it must be pure.
    pub fn apply<F>(&self, input: &Tensor, f: F) -> candle_core::Result<Tensor>
    where
        T: Send + Sync + 'static,
        F: Fn(&T, &Tensor) -> candle_core::Result<Tensor> + Send + Sync + 'static,
    {
        let (build, name) = (self.build.clone(), self.name.clone());
        let f = Arc::new(f);
        let in_strategy: UnitFn = {
            let f = f.clone();
            Arc::new(move |vb, x| f(&build(vb.pp(&name))?, x))
        };
        let unit = self.clone();
        let on_params: RecomputeFn = Arc::new(move |x| f(&unit.get()?, x));
        self.source.apply_unit(
            self.unit,
            input,
            UnitRuns {
                in_strategy,
                on_params,
            },
        )
    }

    /// The unit's name.
    pub fn name(&self) -> &str {
        &self.name
    }
}

impl<T: Clone> Clone for Wrapped<T> {
    fn clone(&self) -> Self {
        Wrapped {
            name: self.name.clone(),
            unit: self.unit,
            source: self.source.clone(),
            build: self.build.clone(),
            registered: self.registered.clone(),
        }
    }
}
