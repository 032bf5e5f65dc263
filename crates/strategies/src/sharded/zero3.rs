//! ZeRO stage 3: parameters, gradients and optimizer state all sharded.
//!
//! Parameters are born sharded inside wrapped units ([`crate::sharded::sharded_params`]). As
//! DeepSpeed's stage 3 does, each unit is gathered just before its forward and released
//! after it, gathered again just before its backward and released after that, with an
//! optional prefetch of the next unit under a bound on the parameters alive at once
//! ([`Zero3::with_prefetch`], [`Zero3::with_max_live_parameters`]); the unit's backward
//! reduce-scatters its gradient straight into the shard's. This is FSDP's `full_shard`
//! (the unit op, [`crate::units::unit_op`]): the two differ only in name. FSDP's
//! `shard_grad_op` is this type too, gathering each unit once per step and keeping it
//! from forward to backward.

use crate::layout::flat_layout::FlatLayout;
use crate::layout::saved_state::{flat_group, kinds_to_restore, read_shard, shard_prefix};
use crate::optim::Optimizer;
use crate::replicated::replicated_state::tensor_bytes;
use crate::sharded::sharded_options::{sharded_builder_methods, ShardedOptions};
use crate::sharded::sharded_params::ShardedParams;
use crate::step::clip::clip_grad_norm;
use crate::step::grad_scaler::GradScaler;
use crate::step::grads::GradAccumulator;
use crate::step::nonfinite::{check_and_clip, first_nonfinite_in};
use crate::step::precision::Precision;
use crate::units::unit_views::FrozenPart;
use candle_core::{DType, Device, Tensor, Var};
use std::sync::Arc;
use wick_core::CollectiveExt;
use wick_core::{
    BackwardReport, Collective, Error, GradSync, GroupRange, OptimizerConfig, RankState, ReduceOp,
    Result, ShardedContext, Sharding, StateBytes, StateReader, StepOptions, StepReport, Strategy,
    StrategySetup, StrategyState, StrategyStep, PARAM_KIND,
};

impl Default for ShardedOptions {
    fn default() -> Self {
        ShardedOptions::new(Zero3::NAME)
    }
}

/// ZeRO stage 3 (and the sharded modes of FSDP, which differ only in how units run).
#[derive(Default)]
pub struct Zero3 {
    options: ShardedOptions,
    world: Option<Arc<dyn Collective>>,
    device: Option<Device>,
    source: Option<Arc<ShardedParams>>,
    layouts: Vec<FlatLayout>,
    shards: Vec<Var>,
    /// The units' frozen parameters (no gradient, no optimizer state, not saved).
    frozen: Vec<FrozenPart>,
    grads: GradAccumulator,
    optimizer: Option<Optimizer>,
    grad_bytes: usize,
    /// What each step of this fit does beside the update (clipping, inf or NaN).
    step_options: StepOptions,
    /// `16-mixed`: the dynamic loss scale (made with the optimizer).
    scaler: Option<GradScaler>,
    /// Hybrid sharding: the ranks of other groups holding the same shard.
    replicas: Option<Arc<dyn Collective>>,
}

impl Zero3 {
    /// The registry name.
    pub const NAME: &'static str = "zero3";

    /// A new, unconfigured instance.
    pub fn new() -> Self {
        Self::default()
    }

    /// An unconfigured instance with `options`.
    pub(crate) fn with_options(options: ShardedOptions) -> Self {
        Zero3 {
            options,
            ..Zero3::default()
        }
    }

    sharded_builder_methods!();

    fn not_ready(&self, message: &str) -> Error {
        not_ready(self.options.name, message)
    }

    fn device(&self) -> Result<Device> {
        self.device
            .clone()
            .ok_or_else(|| self.not_ready("no device connected"))
    }

    fn world(&self) -> Result<&Arc<dyn Collective>> {
        self.world
            .as_ref()
            .ok_or_else(|| self.not_ready("no world connected"))
    }

    /// The step's verdict on the shards' reduced `grads` (see [`check_and_clip`]): their
    /// norm, with `grads` clipped, to step, or `None` to skip. The ranks of the sharding
    /// group hold disjoint parts and decide together.
    fn check_grads(&self, world: &dyn Collective, grads: &mut [Tensor]) -> Result<Option<f64>> {
        let rank = world.rank();
        let mut local = None;
        let mut before = 0;
        for (layout, g) in self.layouts.iter().zip(grads.iter()) {
            let shard = layout.shard(rank);
            if let Some(i) = first_nonfinite_in(layout, shard.start..shard.end, g)? {
                local = Some(before + i);
                break;
            }
            before += layout.entries().len();
        }
        let names = || self.layouts.iter().flat_map(|l| l.entries());
        let name_of = |i: usize| names().nth(i).map(|e| e.name.clone()).unwrap_or_default();
        check_and_clip(grads, local, Some(world), &self.step_options, name_of)
    }

    /// Records the parameters the next forward hands out, for the backward after it to
    /// report those it gives no gradient ([`StepOptions::find_unused_parameters`]).
    fn look_for_unused(&self) {
        if let Some(source) = self
            .source
            .as_ref()
            .filter(|_| self.step_options.find_unused_parameters)
        {
            source.param_use.start();
        }
    }

    fn release_gathered(&self) {
        if let Some(source) = &self.source {
            source.release_gathered();
        }
    }
}

/// The error for a call that comes before the state it needs.
fn not_ready(strategy: &str, message: &str) -> Error {
    Error::NotReady {
        strategy: strategy.into(),
        message: message.into(),
    }
}

impl StrategySetup for Zero3 {
    fn name(&self) -> &str {
        self.options.name
    }

    fn for_new_rank(&self) -> Box<dyn Strategy> {
        Box::new(Zero3::with_options(self.options.clone()))
    }

    fn check_world_size(&self, world_size: usize) -> Result<()> {
        match self.options.group_size {
            Some(g) if g == 0 || !world_size.is_multiple_of(g) => Err(Error::config(
                "group size",
                format!("hybrid_shard needs the {world_size} ranks to split into groups of {g}"),
            )),
            _ => Ok(()),
        }
    }

    fn connect(&mut self, world: Arc<dyn Collective>, device: Device) -> Result<()> {
        // Hybrid sharding: shard inside groups of consecutive ranks, average across groups
        // between the ranks that hold the same shard.
        let world = match self.options.group_size {
            Some(g) => {
                let rank = world.rank();
                let group = world.split(rank / g)?;
                self.replicas = Some(world.split(rank % g)?);
                group
            }
            None => world,
        };
        // A new stage brings a new world; the gather ops of the old one must not be reused.
        if let Some(source) = &self.source {
            source.reconnect(world.clone())?;
        }
        self.world = Some(world);
        self.device = Some(device);
        Ok(())
    }

    fn sharded_context(&mut self, seed: u64) -> Result<ShardedContext> {
        let world = self.world()?.clone();
        let device = self.device()?;
        let source = Arc::new(ShardedParams::new(
            seed,
            world.clone(),
            device.clone(),
            &self.options,
        ));
        self.source = Some(source.clone());
        Ok(ShardedContext::new(source, world, device, self.name()))
    }

    fn finish_sharding(&mut self) -> Result<()> {
        let source = self
            .source
            .as_ref()
            .ok_or_else(|| self.not_ready("no sharding context was opened"))?;
        source.finish()?;
        (self.layouts, self.shards) = source.with_units(|units| {
            units
                .iter()
                .filter_map(|u| Some((u.layout.clone()?, u.shard.clone()?)))
                .filter(|(layout, _)| layout.numel() > 0)
                .unzip()
        });
        self.frozen =
            source.with_units(|units| units.iter().filter_map(|u| u.frozen.clone()).collect());
        Ok(())
    }

    fn is_configured(&self) -> bool {
        !self.shards.is_empty()
    }

    fn configure_optimizer(
        &mut self,
        config: &OptimizerConfig,
        options: StepOptions,
    ) -> Result<()> {
        if self.shards.is_empty() {
            return Err(Error::NoParameters);
        }
        self.optimizer = Some(Optimizer::new(config));
        self.grads = GradAccumulator::default();
        let f16 = self.options.precision == Precision::F16Mixed;
        self.scaler = f16.then(GradScaler::default);
        self.step_options = options;
        self.look_for_unused();
        Ok(())
    }
}

impl StrategyStep for Zero3 {
    fn backward(&mut self, loss: &Tensor, sync: GradSync) -> Result<BackwardReport> {
        if let Some(source) = &self.source {
            source.reduction.set(sync);
        }
        let store = match &self.scaler {
            Some(scaler) => scaler.scale(loss)?.backward(),
            None => loss.backward(),
        };
        let uses = self.source.as_ref().map(|s| &s.param_use);
        let unused = uses.filter(|uses| uses.is_looking()).map(|uses| {
            let all = self
                .layouts
                .iter()
                .flat_map(|l| l.entries().iter().map(|e| e.name.as_str()));
            uses.finish(loss, all)
        });
        // Free the gathered parameters whether or not backward succeeded.
        self.release_gathered();
        // Every reduce-scatter backward issued is waited for, in issue order, whether or
        // not backward succeeded.
        let source = self.source.as_ref();
        let reduced = source.map(|s| s.reduction.wait_for_all());
        self.grads.add(&self.shards, store?)?;
        for store in source.into_iter().flat_map(|s| s.recomputed.take()) {
            self.grads.add(&self.shards, store)?;
        }
        if let Some(reduced) = reduced {
            self.grads.add(&self.shards, reduced?)?;
        }
        Ok(BackwardReport {
            unused_parameters: unused,
        })
    }

    fn free_gathered(&mut self) {
        self.release_gathered();
        // A forward without backward (validation) is not the one to judge the parameters by.
        if self
            .source
            .as_ref()
            .is_some_and(|s| s.param_use.is_looking())
        {
            self.look_for_unused();
        }
    }

    fn optimizer_step(&mut self, lr: f64) -> Result<StepReport> {
        // Gradients arrive already reduce-scattered by the gather op's backward.
        let kept = self.source.as_ref().map_or(0, |s| s.reduction.kept_bytes());
        if kept > 0 {
            return Err(self.not_ready(&format!("optimizer_step with {kept} bytes of unreduced gradients: the last backward before a step must run with GradSync::Reduce")));
        }
        let mut grads = self.grads.take(&self.shards)?;
        if let Some(replicas) = &self.replicas {
            // Each group reduced its own micro-batches; average the shards across groups.
            for g in grads.iter_mut() {
                *g = g.contiguous()?.copy()?;
                replicas.all_reduce_in_place(g, ReduceOp::Mean)?;
            }
        }
        let world = self.world()?.clone();
        // Inf or NaN on some rank: the scaler's to skip under 16-mixed, otherwise as
        // `on_nonfinite` says; every rank skips alike. The norm comes with the verdict.
        let grad_norm = match &mut self.scaler {
            Some(scaler) => {
                let mut worlds: Vec<&dyn Collective> = vec![world.as_ref()];
                worlds.extend(self.replicas.as_deref());
                match scaler.unscale(&mut grads, &worlds)? {
                    true => {
                        let max_norm = self.step_options.clip_grad_norm;
                        Some(clip_grad_norm(&mut grads, max_norm, Some(world.as_ref()))?)
                    }
                    false => None,
                }
            }
            None => self.check_grads(world.as_ref(), &mut grads)?,
        };
        let report = StepReport {
            skipped: grad_norm.is_none(),
            grad_norm,
            loss_scale: self.scaler.as_ref().map(GradScaler::state),
        };
        if report.skipped {
            self.release_gathered();
            return Ok(report);
        }
        self.grad_bytes = grads.iter().map(tensor_bytes).sum();
        let optimizer = self.optimizer.as_mut().ok_or_else(|| {
            not_ready(
                self.options.name,
                "optimizer_step before configure_optimizer",
            )
        })?;
        optimizer.set_lr(lr);
        optimizer.step(&self.shards, &grads)?;
        self.release_gathered();
        Ok(report)
    }
}

impl StrategyState for Zero3 {
    fn full_parameters(&self) -> Result<Vec<(String, Tensor)>> {
        let world = self.world()?;
        let mut out = Vec::new();
        let trainable = self
            .layouts
            .iter()
            .zip(self.shards.iter().map(Var::as_tensor));
        let frozen = self.frozen.iter().map(|f| (&f.layout, &f.shard));
        for (layout, shard) in trainable.chain(frozen) {
            let full = Tensor::zeros(layout.padded(), DType::F32, shard.device())?;
            world.all_gather_into(shard, &full)?;
            out.extend(layout.views(&full)?);
        }
        Ok(out)
    }

    fn num_parameters(&self) -> usize {
        self.layouts.iter().map(FlatLayout::numel).sum()
    }

    fn num_frozen_parameters(&self) -> usize {
        self.frozen.iter().map(|f| f.layout.numel()).sum()
    }

    fn sharding(&self) -> Sharding {
        Sharding {
            params: true,
            grads: true,
            optimizer: true,
        }
    }

    fn parameter_shapes(&self) -> Vec<(String, candle_core::Shape)> {
        self.layouts
            .iter()
            .flat_map(|l| {
                l.entries()
                    .iter()
                    .map(|e| (e.name.clone(), e.shape.clone()))
            })
            .collect()
    }

    fn save_state(&self) -> Result<RankState> {
        let world = self.world()?;
        // Under hybrid sharding the other groups hold copies: only the first group saves.
        let saves = !matches!(&self.replicas, Some(r) if r.rank() != 0);
        let optimizer = self.optimizer.as_ref();
        let state = optimizer.map(Optimizer::state).unwrap_or_default();
        let mut groups = Vec::new();
        for (i, (layout, shard)) in self.layouts.iter().zip(&self.shards).enumerate() {
            let range = match saves {
                true => layout.owned(world.rank()),
                false => 0..0,
            };
            let mut tensors = vec![(
                PARAM_KIND.to_string(),
                shard_prefix(shard.as_tensor(), range.len())?,
            )];
            for (kind, per_unit) in &state {
                tensors.push((kind.to_string(), shard_prefix(&per_unit[i], range.len())?));
            }
            groups.push(GroupRange {
                group: flat_group(format!("unit{i}"), layout),
                range,
                tensors,
            });
        }
        Ok(RankState {
            groups,
            optimizer_step: optimizer.map_or(0, Optimizer::step_count),
            loss_scale: self.scaler.as_ref().map(GradScaler::state),
        })
    }

    fn load_state(&mut self, reader: &dyn StateReader) -> Result<()> {
        let rank = self.world()?.rank();
        let device = self.device()?;
        let optimizer = self
            .optimizer
            .as_mut()
            .ok_or_else(|| not_ready(self.options.name, "load_state before configure_optimizer"))?;
        let kinds = kinds_to_restore(reader, optimizer.state_kinds())?;
        let mut state = vec![Vec::new(); kinds.len()];
        for (i, layout) in self.layouts.iter().enumerate() {
            let group = flat_group(format!("unit{i}"), layout);
            let read = |kind: &str| read_shard(reader, kind, (layout, &group), rank, &device);
            self.shards[i].set(&read(PARAM_KIND)?)?;
            for (k, kind) in kinds.iter().enumerate() {
                state[k].push(read(kind)?);
            }
        }
        optimizer.set_state(reader.optimizer_step(), state)?;
        if let (Some(scaler), Some(saved)) = (&mut self.scaler, reader.loss_scale()) {
            scaler.restore(saved);
        }
        Ok(())
    }

    fn state_bytes(&self) -> StateBytes {
        StateBytes {
            params: self
                .shards
                .iter()
                .map(Var::as_tensor)
                .chain(self.frozen.iter().map(|f| &f.shard))
                .map(tensor_bytes)
                .sum(),
            grads: self.grad_bytes,
            optimizer: self.optimizer.as_ref().map_or(0, Optimizer::state_bytes),
        }
    }
}
