//! Parameters born sharded: the `ParamSource` of ZeRO-3.
//!
//! Inside a wrapped unit, a parameter request only records (name, shape, init) and hands
//! back a zero-stride placeholder of the full shape (no memory behind it). When the unit
//! ends its flat layout is known, and this rank creates its shard, element by element, from
//! the counter-based init: the full parameter never exists. A frozen parameter born
//! quantized (QLoRA's base) is kept as its stored blocks, whole blocks to a rank, gathered as bytes
//! and handed out as its stored blocks. At each step the unit is gathered once (an autograd
//! op) and the model's block is rebuilt over views of it.

use crate::sharded::sharded_options::ShardedOptions;
use crate::sharded::unit_shards::{Request, UnitShards};
use crate::step::precision::Precision;
use crate::units::backward_reduction::BackwardReduction;
use crate::units::gather_op::GatherOp;
use crate::units::op_tensors::OnTensors;
use crate::units::param_request::{check_asked_again, check_dtype};
use crate::units::param_use::ParamUse;
use crate::units::prefetch::{Prefetcher, UnitParts};
use crate::units::recompute_op::RecomputedGrads;
use crate::units::storage_swap;
use crate::units::unit_op::UnitOp;
use crate::units::unit_views::{unit_var_builder, FrozenPart, GatheredPart, PartLayout};
use candle_core::{DType, Device, Tensor};
use candle_nn::VarBuilder;
use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};
use wick_core::{
    lock, ActivationCheckpointing, Collective, ParamRequest, RecomputeFn, UnitBlock, UnitFn,
    UnitRuns,
};

/// One wrapped unit: its layout, this rank's shard, and this step's gathered buffers.
pub(crate) struct ShardedUnit {
    pub(crate) name: String,
    requests: Vec<Request>,
    /// This rank's shards, once the unit has closed.
    pub(crate) shards: Option<UnitShards>,
    gathered: Option<Tensor>,
    /// The frozen parts' unpacked buffers, once gathered this step.
    gathered_frozen: Option<Vec<Tensor>>,
}

impl ShardedUnit {
    /// The parts a prefetch gathers: the trainable shard, then the frozen ones.
    fn parts(&self) -> Option<UnitParts> {
        let s = self.shards.as_ref()?;
        let mut parts = vec![(s.shard.as_tensor().clone(), s.layout.padded())];
        parts.extend((s.frozen.iter()).map(|f| (f.shard.clone(), f.layout.padded())));
        Some(parts)
    }

    /// The unit's shards, which exist once `configure_sharded_model` has finished.
    fn shards(&self) -> candle_core::Result<&UnitShards> {
        match &self.shards {
            Some(shards) => Ok(shards),
            None => candle_core::bail!(
                "unit '{}' used before configure_sharded_model finished",
                self.name
            ),
        }
    }
}

/// The error for a unit index no `wrap` handed out.
fn unknown_unit(unit: usize) -> candle_core::Error {
    candle_core::Error::Msg(format!("unknown unit {unit}"))
}

struct State {
    units: Vec<ShardedUnit>,
    open_unit: Option<usize>,
    /// Names of the wrapped blocks so far (a block may be wrapped once).
    wrapped: Vec<String>,
}

/// The unit that collects every block the auto-wrap policy does not match.
const ROOT_UNIT: &str = "root";

/// The units of one rank under ZeRO-3.
pub(crate) struct ShardedParams {
    seed: u64,
    reshard_after_forward: bool,
    /// Auto-wrap: a wrapped block becomes a unit of its own only when its name starts with
    /// one of these prefixes; the others share the root unit. `None`: every block is a unit.
    auto_wrap: Option<Vec<String>>,
    /// Gather the next unit in the background under full sharding.
    prefetch: bool,
    /// The bound on gathered parameters a prefetch respects.
    max_live_parameters: Option<usize>,
    prefetcher: Mutex<Option<Arc<Prefetcher>>>,
    /// Which units recompute their forward in backward rather than keep activations.
    activation_checkpointing: ActivationCheckpointing,
    precision: Precision,
    world: Mutex<Arc<dyn Collective>>,
    device: Device,
    state: Mutex<State>,
    pub(crate) reduction: Arc<BackwardReduction>,
    /// The first step's record of which parameters backward reached.
    pub(crate) param_use: Arc<ParamUse>,
    /// The shard gradients of recomputed units' backward, added after the loss's.
    pub(crate) recomputed: Arc<RecomputedGrads>,
}

impl ShardedParams {
    /// `reshard_after_forward`: units run through the unit op (full sharding) instead of
    /// being gathered once per step and kept until backward.
    pub(crate) fn new(
        seed: u64,
        world: Arc<dyn Collective>,
        device: Device,
        options: &ShardedOptions,
    ) -> Self {
        ShardedParams {
            seed,
            reshard_after_forward: options.reshard_after_forward,
            auto_wrap: options.auto_wrap.clone(),
            prefetch: options.prefetch && options.reshard_after_forward,
            max_live_parameters: options.max_live_parameters,
            prefetcher: Mutex::default(),
            activation_checkpointing: options.activation_checkpointing,
            precision: options.precision,
            world: Mutex::new(world),
            device,
            reduction: Arc::default(),
            param_use: Arc::default(),
            recomputed: Arc::default(),
            state: Mutex::new(State {
                units: Vec::new(),
                open_unit: None,
                wrapped: Vec::new(),
            }),
        }
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        lock(&self.state)
    }

    fn world(&self) -> Arc<dyn Collective> {
        lock(&self.world).clone()
    }

    /// Gathers through `world` from now on (each stage brings its own world).
    pub(crate) fn reconnect(&self, world: Arc<dyn Collective>) -> candle_core::Result<()> {
        *lock(&self.world) = world;
        self.release_gathered();
        self.start_prefetch()
    }

    /// (Re)starts prefetching over the current world. No-op without prefetch or units.
    fn start_prefetch(&self) -> candle_core::Result<()> {
        if !self.prefetch {
            return Ok(());
        }
        let units: Vec<UnitParts> = self
            .lock()
            .units
            .iter()
            .filter_map(ShardedUnit::parts)
            .collect();
        if units.is_empty() {
            return Ok(());
        }
        let param_dtype = self.precision.param_dtype();
        let prefetcher = Arc::new(Prefetcher::new(
            self.world(),
            units,
            param_dtype,
            self.max_live_parameters,
        ));
        *lock(&self.prefetcher) = Some(prefetcher);
        Ok(())
    }

    /// Lays out unit `unit` and makes this rank's shard of it.
    fn shard_unit(&self, unit: usize) -> candle_core::Result<()> {
        let requests = std::mem::take(&mut self.lock().units[unit].requests);
        let world = self.world();
        let made = UnitShards::new(&requests, self.seed, world.as_ref(), &self.device);
        let mut state = self.lock();
        let u = &mut state.units[unit];
        u.requests = requests;
        u.shards = Some(made?);
        Ok(())
    }

    /// Shards what is still open when the context closes (the auto-wrap root unit).
    pub(crate) fn shard_open_units(&self) -> candle_core::Result<()> {
        let pending: Vec<usize> = {
            let state = self.lock();
            (0..state.units.len())
                .filter(|&u| state.units[u].shards.is_none())
                .collect()
        };
        pending.into_iter().try_for_each(|u| self.shard_unit(u))?;
        self.start_prefetch()
    }

    /// Runs `f` over every unit.
    pub(crate) fn with_units<R>(&self, f: impl FnOnce(&mut [ShardedUnit]) -> R) -> R {
        f(&mut self.lock().units)
    }

    /// Forgets every gathered buffer (after backward, after a step), freeing the full parameters.
    pub(crate) fn release_gathered(&self) {
        for unit in self.lock().units.iter_mut() {
            unit.gathered = None;
            unit.gathered_frozen = None;
        }
        if let Some(p) = lock(&self.prefetcher).as_ref() {
            p.drain();
        }
    }
}

impl ShardedParams {
    /// Runs unit `unit` on `input` as the options say: gathered for this use only (full
    /// sharding), or over the step's gathered parameters, recomputed in backward where
    /// activation checkpointing picks the unit.
    fn run_planned(
        &self,
        unit: usize,
        input: &Tensor,
        runs: UnitRuns,
    ) -> candle_core::Result<Tensor> {
        if self.reshard_after_forward {
            self.run_unit(unit, input, runs.in_strategy)
        } else if self.activation_checkpointing.recomputes(unit) {
            self.recompute_unit(input, runs.on_params)
        } else {
            (runs.on_params)(input)
        }
    }

    /// Runs `run` (build the block over a `VarBuilder`, apply it to the input) as one unit
    /// of the autograd graph, gathered for this use and released after it.
    fn run_unit(&self, unit: usize, input: &Tensor, run: UnitFn) -> candle_core::Result<Tensor> {
        let (name, layout, shard, frozen) = {
            let state = self.lock();
            let u = state.units.get(unit).ok_or_else(|| unknown_unit(unit))?;
            let s = u.shards()?;
            (
                u.name.clone(),
                s.layout.clone(),
                s.shard.clone(),
                s.frozen.clone(),
            )
        };
        let (param_dtype, reduce_dtype) =
            (self.precision.param_dtype(), self.precision.reduce_dtype());
        // Only the first step's look for unused parameters needs the unit's names.
        let names = self
            .param_use
            .is_looking()
            .then(|| layout.entries().iter().map(|e| e.name.clone()).collect());
        let op = UnitOp {
            world: self.world(),
            name,
            unit,
            layout,
            frozen,
            run,
            reduction: self.reduction.clone(),
            uses: self.param_use.clone(),
            device: self.device.clone(),
            param_dtype,
            reduce_dtype,
            prefetch: lock(&self.prefetcher).clone(),
            keep_activations: !self.activation_checkpointing.recomputes(unit)
                && storage_swap::can_keep_activations(),
            kept: Mutex::default(),
        };
        // A unit of frozen parameters only, on an input that takes no gradient (the
        // embedding of token ids under LoRA), has no backward: it runs plainly.
        if op.layout.numel() == 0 && !input.track_op() {
            return op.forward_plain(input);
        }
        let out = input.apply_op2(shard.as_tensor(), OnTensors(op))?;
        // The unit's output stands for all its parameters: if it misses the loss, so do they.
        if let Some(names) = names {
            self.param_use.hand_out(&out, || names);
        }
        Ok(out)
    }

    /// Runs `run` (the block over this step's gathered parameters) as one unit of the
    /// autograd graph that keeps no activations: its backward runs it again.
    fn recompute_unit(&self, input: &Tensor, run: RecomputeFn) -> candle_core::Result<Tensor> {
        self.recomputed
            .apply(input, run, Some(self.param_use.clone()))
    }
}

impl wick_core::ParamSource for ShardedParams {
    fn get_or_create(&self, request: ParamRequest<'_>) -> candle_core::Result<Tensor> {
        check_dtype(&request)?;
        let (name, shape) = (request.name, request.shape);
        let mut state = self.lock();
        let Some(open) = state.open_unit else {
            candle_core::bail!(
                "parameter '{name}' was requested outside a unit; under zero3 every parameter is \
                 created inside ctx.wrap(name, build) so that it can be gathered per step"
            )
        };
        let unit = &mut state.units[open];
        match unit.requests.iter().find(|r| r.name == name) {
            Some(created) => check_asked_again(&request, &created.shape, created.trainable)?,
            None => unit.requests.push(Request {
                name: name.to_string(),
                shape: shape.clone(),
                init: request.init.clone(),
                trainable: request.trainable,
                quantize: request.quantize,
            }),
        }
        // A placeholder with the full shape (of the stored blocks, for a parameter born
        // quantized) and no memory: the block built at wrap time is discarded, and every
        // step rebuilds it over gathered parameters.
        match request.quantize {
            Some(format) => Tensor::zeros((), DType::U8, request.device)?
                .broadcast_as(format.stored_len(shape.elem_count())),
            None => Tensor::zeros((), DType::F32, request.device)?.broadcast_as(shape),
        }
    }

    fn contains(&self, name: &str) -> bool {
        self.lock()
            .units
            .iter()
            .any(|u| u.requests.iter().any(|r| r.name == name))
    }

    fn begin_unit(&self, name: &str) -> candle_core::Result<usize> {
        let mut state = self.lock();
        if let Some(open) = state.open_unit {
            candle_core::bail!(
                "unit '{name}' wrapped inside unit '{}'; units do not nest",
                state.units[open].name
            )
        }
        if state.wrapped.iter().any(|w| w == name) {
            candle_core::bail!(
                "unit '{name}' wrapped twice; reuse its handle instead (weight tying)"
            )
        }
        state.wrapped.push(name.to_string());
        let own_unit = match &self.auto_wrap {
            Some(prefixes) => prefixes.iter().any(|p| name.starts_with(p.as_str())),
            None => true,
        };
        let unit_name = if own_unit { name } else { ROOT_UNIT };
        let unit = match state.units.iter().position(|u| u.name == unit_name) {
            Some(root) => root,
            None => {
                state.units.push(ShardedUnit {
                    name: unit_name.to_string(),
                    requests: Vec::new(),
                    shards: None,
                    gathered: None,
                    gathered_frozen: None,
                });
                state.units.len() - 1
            }
        };
        state.open_unit = Some(unit);
        Ok(unit)
    }

    fn end_unit(&self, unit: usize) -> candle_core::Result<UnitBlock> {
        let mut state = self.lock();
        state.open_unit = None;
        // The root unit keeps collecting blocks; it is sharded when the context closes.
        if state.units[unit].name == ROOT_UNIT && self.auto_wrap.is_some() {
            return Ok(UnitBlock::Rebuilt);
        }
        drop(state);
        self.shard_unit(unit)?;
        Ok(UnitBlock::Rebuilt)
    }

    /// Mixed precision: the unit computes in its parameters' dtype; what leaves it is f32
    /// again, the dtype of the master parameters and of the rest of the model.
    fn apply_unit(&self, unit: usize, xs: &Tensor, runs: UnitRuns) -> candle_core::Result<Tensor> {
        if !self.precision.is_mixed() {
            return self.run_planned(unit, xs, runs);
        }
        let compute = self.precision.param_dtype();
        let x = match xs.dtype().is_float() && xs.dtype() != compute {
            true => xs.to_dtype(compute)?,
            false => xs.clone(),
        };
        let out = self.run_planned(unit, &x, runs)?;
        match out.dtype() == compute {
            true => out.to_dtype(DType::F32),
            false => Ok(out),
        }
    }

    fn unit_params(&self, unit: usize) -> candle_core::Result<VarBuilder<'static>> {
        let mut state = self.lock();
        let u = state
            .units
            .get_mut(unit)
            .ok_or_else(|| unknown_unit(unit))?;
        let UnitShards {
            layout,
            shard,
            frozen: frozen_parts,
        } = u.shards()?.clone();
        let (param_dtype, reduce_dtype) =
            (self.precision.param_dtype(), self.precision.reduce_dtype());
        let flat = match &u.gathered {
            Some(t) => t.clone(),
            // No trainable parameter: nothing to gather, nothing for backward to reduce.
            None if layout.padded() == 0 => Tensor::zeros(0, param_dtype, &self.device)?,
            None => {
                let op = GatherOp {
                    world: self.world(),
                    padded: layout.padded(),
                    unit,
                    reduction: self.reduction.clone(),
                    param_dtype,
                    reduce_dtype,
                };
                let t = shard.as_tensor().apply_op1(op)?;
                u.gathered = Some(t.clone());
                t
            }
        };
        let frozen = match &u.gathered_frozen {
            Some(flats) => flats.clone(),
            None => {
                let world = self.world();
                let gather = |f: &FrozenPart| f.gather(world.as_ref(), param_dtype);
                let flats = (frozen_parts.iter())
                    .map(gather)
                    .collect::<candle_core::Result<Vec<_>>>()?;
                u.gathered_frozen = Some(flats.clone());
                flats
            }
        };
        let mut parts = vec![GatheredPart {
            layout: PartLayout::Values(layout),
            flat,
            counted: true,
        }];
        parts.extend(
            (frozen_parts.iter())
                .zip(frozen)
                .map(|(f, flat)| f.gathered(flat)),
        );
        let uses = Some(self.param_use.clone());
        let vb = unit_var_builder(
            &u.name,
            HashMap::new(),
            parts,
            param_dtype,
            &self.device,
            uses,
        );
        Ok(vb)
    }
}
