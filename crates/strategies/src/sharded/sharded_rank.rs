//! [`ShardedRank`]: one rank of [`Sharded`](crate::Sharded) (zero3, fsdp) once its shards
//! exist: its units' flat shards, its sharding groups, its gradients and optimizer state.

use crate::layout::flat_layout::FlatLayout;
use crate::layout::saved_state::{flat_group, kinds_to_restore, read_shard, shard_prefix};
use crate::optim::Optimizer;
use crate::replicated::replicated_state::{no_optimizer, tensor_bytes};
use crate::sharded::sharded_options::ShardedOptions;
use crate::sharded::sharded_params::ShardedParams;
use crate::sharded::sharding_groups::ShardingGroups;
use crate::step::clip::clip_grad_norm;
use crate::step::grad_scaler::GradScaler;
use crate::step::grads::GradAccumulator;
use crate::step::nonfinite::{check_and_clip, first_nonfinite_in};
use crate::step::precision::Precision;
use crate::units::unit_views::FrozenPart;
use candle_core::{DType, Device, Tensor, Var};
use std::sync::Arc;
use wick_core::{
    BackwardReport, Collective, CollectiveExt, Error, GradSync, GroupRange, OptimizerConfig,
    RankState, RankStrategy, ReduceOp, Result, Sharding, StateBytes, StateReader, StepOptions,
    StepReport, StrategyState, StrategyStep, PARAM_KIND,
};

/// One rank of zero3 (or of FSDP's sharded modes).
pub(crate) struct ShardedRank {
    options: ShardedOptions,
    /// The world this rank shards over (its group, under hybrid sharding).
    world: Arc<dyn Collective>,
    /// Hybrid sharding: the ranks of other groups holding the same shard.
    replicas: Option<Arc<dyn Collective>>,
    device: Device,
    source: Arc<ShardedParams>,
    layouts: Vec<FlatLayout>,
    shards: Vec<Var>,
    /// The units' frozen parameters (no gradient, no optimizer state, not saved).
    frozen: Vec<FrozenPart>,
    grads: GradAccumulator,
    /// Built for each fit (`configure_optimizer`): per fit, not per rank.
    optimizer: Option<Optimizer>,
    grad_bytes: usize,
    /// What each step of this fit does beside the update (clipping, inf or NaN).
    step_options: StepOptions,
    /// `16-mixed`: the dynamic loss scale (made with the optimizer).
    scaler: Option<GradScaler>,
}

impl ShardedRank {
    /// The rank whose units `source` finished creating, sharded over `groups`.
    pub(crate) fn new(
        options: ShardedOptions,
        source: Arc<ShardedParams>,
        groups: ShardingGroups,
    ) -> Result<Self> {
        let (layouts, shards): (Vec<FlatLayout>, Vec<Var>) = source.with_units(|units| {
            units
                .iter()
                .filter_map(|u| {
                    u.shards
                        .as_ref()
                        .map(|s| (s.layout.clone(), s.shard.clone()))
                })
                .filter(|(layout, _)| layout.numel() > 0)
                .unzip()
        });
        if shards.is_empty() {
            return Err(Error::NoParameters);
        }
        let frozen = source.with_units(|units| {
            (units.iter().flat_map(|u| &u.shards))
                .flat_map(|s| s.frozen.clone())
                .collect()
        });
        let device = shards[0].device().clone();
        Ok(ShardedRank {
            options,
            world: groups.shard,
            replicas: groups.replicas,
            device,
            source,
            layouts,
            shards,
            frozen,
            grads: GradAccumulator::default(),
            optimizer: None,
            grad_bytes: 0,
            step_options: StepOptions::default(),
            scaler: None,
        })
    }

    /// The optimizer of the fit under way, or the error of a step before any fit built one.
    fn optimizer(&mut self) -> Result<&mut Optimizer> {
        let name = self.options.name;
        self.optimizer.as_mut().ok_or_else(|| no_optimizer(name))
    }

    /// The step's verdict on the shards' reduced `grads` (see [`check_and_clip`]): their
    /// norm, with `grads` clipped, to step, or `None` to skip. The ranks of the sharding
    /// group hold disjoint parts and decide together.
    fn check_grads(&self, world: &dyn Collective, grads: &mut [Tensor]) -> Result<Option<f64>> {
        let rank = world.rank();
        // `grads[i]` is the shard of `layouts[i]`'s flat buffer, whose parameters come
        // after those of the layouts before it.
        let locate = |grads: &[Tensor], i: usize| {
            let (layout, shard) = (&self.layouts[i], self.layouts[i].shard(rank));
            let before: usize = self.layouts[..i].iter().map(|l| l.entries().len()).sum();
            let within = first_nonfinite_in(layout, shard.start..shard.end, &grads[i])?;
            Ok(within.map(|j| before + j))
        };
        let names = || self.layouts.iter().flat_map(|l| l.entries());
        let name_of = |i: usize| names().nth(i).map(|e| e.name.clone()).unwrap_or_default();
        check_and_clip(grads, locate, Some(world), &self.step_options, name_of)
    }

    /// Records the parameters the next forward hands out, for the backward after it to
    /// report those it gives no gradient ([`StepOptions::find_unused_parameters`]).
    fn look_for_unused(&self) {
        if self.step_options.find_unused_parameters {
            self.source.param_use.start();
        }
    }
}

impl RankStrategy for ShardedRank {
    fn name(&self) -> &str {
        self.options.name
    }

    fn connect(&mut self, world: Arc<dyn Collective>, device: Device) -> Result<()> {
        let groups = ShardingGroups::split(world, self.options.group_size)?;
        // A new stage brings a new world; the gather ops of the old one must not be reused.
        self.source.reconnect(groups.shard.clone())?;
        self.world = groups.shard;
        self.replicas = groups.replicas;
        self.device = device;
        Ok(())
    }

    fn configure_optimizer(&mut self, config: &OptimizerConfig, options: StepOptions) {
        self.optimizer = Some(Optimizer::new(config));
        self.grads = GradAccumulator::default();
        let f16 = self.options.precision == Precision::F16Mixed;
        self.scaler = f16.then(GradScaler::default);
        self.step_options = options;
        self.look_for_unused();
    }
}

impl StrategyStep for ShardedRank {
    fn backward(&mut self, loss: &Tensor, sync: GradSync) -> Result<BackwardReport> {
        self.source.reduction.set(sync);
        let store = match &self.scaler {
            Some(scaler) => scaler.scale(loss)?.backward(),
            None => loss.backward(),
        };
        let uses = &self.source.param_use;
        let unused = uses.is_looking().then(|| {
            let all = self
                .layouts
                .iter()
                .flat_map(|l| l.entries().iter().map(|e| e.name.as_str()));
            uses.take_unused(loss, all)
        });
        // Free the gathered parameters whether or not backward succeeded.
        self.source.release_gathered();
        // Every reduce-scatter backward issued is waited for, in issue order, whether or
        // not backward succeeded.
        let reduced = self.source.reduction.wait_for_all();
        self.grads.add(&self.shards, store?)?;
        for store in self.source.recomputed.take() {
            self.grads.add(&self.shards, store)?;
        }
        self.grads.add(&self.shards, reduced?)?;
        Ok(BackwardReport {
            unused_parameters: unused,
        })
    }

    fn free_gathered(&mut self) {
        self.source.release_gathered();
        // A forward without backward (validation) is not the one to judge the parameters by.
        if self.source.param_use.is_looking() {
            self.look_for_unused();
        }
    }

    fn optimizer_step(&mut self, lr: f64) -> Result<StepReport> {
        // Before any collective, so that every rank fails here alike.
        self.optimizer()?;
        // Gradients arrive already reduce-scattered by the gather op's backward.
        let kept = self.source.reduction.kept_bytes();
        if kept > 0 {
            return Err(Error::StepOrder {
                strategy: self.options.name.into(),
                message: format!("optimizer_step with {kept} bytes of unreduced gradients: the last backward before a step must run with GradSync::Reduce"),
            });
        }
        let mut grads = self.grads.take(&self.shards)?;
        if let Some(replicas) = &self.replicas {
            // Each group reduced its own micro-batches; average the shards across groups.
            for g in grads.iter_mut() {
                *g = g.contiguous()?.copy()?;
                replicas.all_reduce_in_place(g, ReduceOp::Mean)?;
            }
        }
        let world = self.world.clone();
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
            self.source.release_gathered();
            return Ok(report);
        }
        self.grad_bytes = grads.iter().map(tensor_bytes).sum();
        let name = self.options.name;
        let optimizer = self.optimizer.as_mut().ok_or_else(|| no_optimizer(name))?;
        optimizer.set_lr(lr);
        optimizer.step(&self.shards, &grads)?;
        self.source.release_gathered();
        Ok(report)
    }
}

impl StrategyState for ShardedRank {
    fn full_parameters(&self) -> Result<Vec<(String, Tensor)>> {
        let world = &self.world;
        let mut out = Vec::new();
        let trainable = self
            .layouts
            .iter()
            .zip(self.shards.iter().map(Var::as_tensor));
        for (layout, shard) in trainable {
            let full = Tensor::zeros(layout.padded(), DType::F32, shard.device())?;
            world.all_gather_into(shard, &full)?;
            out.extend(layout.views(&full)?);
        }
        for frozen in &self.frozen {
            let flat = frozen.gather(world.as_ref(), DType::F32)?;
            out.extend(frozen.layout.values(&flat)?);
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
        let world = &self.world;
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
        let kinds = kinds_to_restore(reader, self.optimizer()?.state_kinds())?;
        let (rank, device) = (self.world.rank(), &self.device);
        let mut state = vec![Vec::new(); kinds.len()];
        for (i, layout) in self.layouts.iter().enumerate() {
            let group = flat_group(format!("unit{i}"), layout);
            let read = |kind: &str| read_shard(reader, kind, (layout, &group), rank, device);
            self.shards[i].set(&read(PARAM_KIND)?)?;
            for (k, kind) in kinds.iter().enumerate() {
                state[k].push(read(kind)?);
            }
        }
        self.optimizer()?
            .set_state(reader.optimizer_step(), state)?;
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
