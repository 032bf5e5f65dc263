//! Replicated parameters: every rank holds every parameter in full. The state of the
//! [`Replicated`](crate::Replicated) strategies (single, ddp, zero1, zero2).

use crate::layout::flat_layout::FlatLayout;
use crate::layout::init::param_values;
use crate::layout::saved_state::{
    concat_range, flat_group, kinds_to_restore, read_shard, read_whole, shard_prefix,
};
use crate::optim::Optimizer;
use crate::replicated::bucket_reduce::{
    backward_handing_over, reduce_buckets, BucketPlan, BucketReduction,
};
use crate::step::grads::GradAccumulator;
use crate::step::nonfinite::{check_and_clip, first_nonfinite};
use crate::units::param_request::{check_asked_again, check_dtype};
use crate::units::param_use::unreached;
use crate::units::recompute_op::RecomputedGrads;
use candle_core::{Device, Tensor, Var};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use wick_core::{
    lock, ActivationCheckpointing, BackwardReport, Collective, Error, GroupRange, OptimizerConfig,
    ParamRequest, ParamSource, RankState, RecomputeFn, Result, ShardedContext, StateBytes,
    StateReader, StepOptions, UnitPlan, PARAM_KIND,
};

/// Full parameters created on request, identical on every rank (the init is counter-based,
/// so no broadcast is needed).
pub(crate) struct ReplicatedParams {
    seed: u64,
    params: Mutex<Vec<(String, Var)>>,
    /// Parameters that take no gradient: plain tensors, not variables.
    frozen: Mutex<Vec<(String, Tensor)>>,
    /// Units wrapped so far (their indices, in wrap order, pick what recomputes).
    units: AtomicUsize,
    activation_checkpointing: ActivationCheckpointing,
    recomputed: Arc<RecomputedGrads>,
}

impl ReplicatedParams {
    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<(String, Var)>> {
        lock(&self.params)
    }
}

impl ParamSource for ReplicatedParams {
    fn get_or_create(&self, request: ParamRequest<'_>) -> candle_core::Result<Tensor> {
        check_dtype(&request)?;
        let (name, shape) = (request.name, request.shape);
        let mut params = self.lock();
        let mut frozen = lock(&self.frozen);
        let made = params.iter().map(|(n, v)| (n, v.as_tensor(), true));
        let made = made.chain(frozen.iter().map(|(n, t)| (n, t, false)));
        if let Some((_, tensor, was_trainable)) = made.into_iter().find(|(n, ..)| *n == name) {
            check_asked_again(&request, tensor.shape(), was_trainable)?;
            return Ok(tensor.clone());
        }
        let values = param_values(request.init, self.seed, name, shape, 0..shape.elem_count())?;
        let tensor = Tensor::from_vec(values, shape, request.device)?;
        if !request.trainable {
            frozen.push((name.to_string(), tensor.clone()));
            return Ok(tensor);
        }
        let var = Var::from_tensor(&tensor)?;
        params.push((name.to_string(), var.clone()));
        Ok(var.as_tensor().clone())
    }

    fn contains(&self, name: &str) -> bool {
        self.lock().iter().any(|(n, _)| n == name)
            || lock(&self.frozen).iter().any(|(n, _)| n == name)
    }

    fn begin_unit(&self, _name: &str) -> candle_core::Result<usize> {
        Ok(self.units.fetch_add(1, Ordering::Relaxed))
    }

    fn unit_plan(&self, unit: usize) -> UnitPlan {
        UnitPlan::Replicated {
            recompute: self.activation_checkpointing.recomputes(unit),
        }
    }

    fn recompute_unit(
        &self,
        _unit: usize,
        input: &Tensor,
        run: RecomputeFn,
    ) -> candle_core::Result<Tensor> {
        self.recomputed.apply(input, run, None)
    }
}

/// One rank's replicated model state: parameters, accumulated gradients, optimizer.
#[derive(Default)]
pub(crate) struct ReplicatedState {
    pub(crate) world: Option<Arc<dyn Collective>>,
    device: Option<Device>,
    source: Option<Arc<ReplicatedParams>>,
    /// Set when the parameters exist (see [`ReplicatedState::layout`]).
    layout: Option<FlatLayout>,
    pub(crate) names: Vec<String>,
    pub(crate) params: Vec<Var>,
    /// Parameters without gradient or optimizer state, by name.
    frozen: Vec<(String, Tensor)>,
    grads: GradAccumulator,
    optimizer: Option<Optimizer>,
    /// Bytes of the reduced gradients the last step used (set by the strategy).
    pub(crate) grad_bytes: usize,
    /// What each step of this fit does beside the update (clipping, inf or NaN).
    options: StepOptions,
    /// Look for parameters without gradient in the next backward.
    find_unused: bool,
    /// The parameter gradients of recomputed units' backward, added after the loss's.
    recomputed: Arc<RecomputedGrads>,
    /// The bucket reductions the last backward issued (ddp, zero1-2), until the step waits.
    in_flight: Option<BucketReduction>,
    /// Gradients already averaged by a reducing backward no step followed.
    reduced: Option<Vec<Tensor>>,
    /// Whether the last step was skipped for them.
    pub(crate) skipped: bool,
    /// The last step's gradient norm before clipping, where clipping computed it.
    pub(crate) grad_norm: Option<f64>,
}

impl ReplicatedState {
    pub(crate) fn connect(&mut self, world: Arc<dyn Collective>, device: Device) {
        self.world = Some(world);
        self.device = Some(device);
    }

    fn not_ready(strategy: &str, message: &str) -> Error {
        Error::NotReady {
            strategy: strategy.to_string(),
            message: message.to_string(),
        }
    }

    fn device(&self, strategy: &str) -> Result<Device> {
        self.device
            .clone()
            .ok_or_else(|| Self::not_ready(strategy, "no device connected"))
    }

    pub(crate) fn world(&self, strategy: &str) -> Result<&Arc<dyn Collective>> {
        self.world
            .as_ref()
            .ok_or_else(|| Self::not_ready(strategy, "no world connected"))
    }

    pub(crate) fn sharded_context(
        &mut self,
        strategy: &str,
        seed: u64,
        activation_checkpointing: ActivationCheckpointing,
    ) -> Result<ShardedContext> {
        let world = self.world(strategy)?.clone();
        let device = self.device(strategy)?;
        let source = Arc::new(ReplicatedParams {
            seed,
            params: Mutex::new(Vec::new()),
            frozen: Mutex::new(Vec::new()),
            units: AtomicUsize::new(0),
            activation_checkpointing,
            recomputed: self.recomputed.clone(),
        });
        self.source = Some(source.clone());
        Ok(ShardedContext::new(source, world, device, strategy))
    }

    pub(crate) fn finish_sharding(&mut self, strategy: &str) -> Result<()> {
        let source = self
            .source
            .take()
            .ok_or_else(|| Self::not_ready(strategy, "no sharding context was opened"))?;
        let params = std::mem::take(&mut *source.lock());
        (self.names, self.params) = params.into_iter().unzip();
        self.frozen = std::mem::take(&mut *lock(&source.frozen));
        let world_size = self.world(strategy)?.world_size();
        self.layout = Some(FlatLayout::new(self.parameter_shapes(), world_size));
        Ok(())
    }

    /// All parameters laid out flat over the world: ZeRO 1-2 shard the optimizer state by
    /// it, and checkpoints save rank r's 1/W range of it (no rank writes everything).
    pub(crate) fn layout(&self, strategy: &str) -> Result<&FlatLayout> {
        self.layout
            .as_ref()
            .ok_or_else(|| Self::not_ready(strategy, "step before configure_sharded_model"))
    }

    pub(crate) fn is_configured(&self) -> bool {
        !self.params.is_empty()
    }

    pub(crate) fn configure_optimizer(
        &mut self,
        config: &OptimizerConfig,
        options: StepOptions,
    ) -> Result<()> {
        if self.params.is_empty() {
            return Err(Error::NoParameters);
        }
        self.optimizer = Some(Optimizer::new(config));
        self.options = options;
        self.find_unused = options.find_unused_parameters;
        self.grads = GradAccumulator::default();
        self.in_flight = None;
        self.reduced = None;
        Ok(())
    }

    /// Back-propagates `loss`, adding the gradients to those of earlier micro-batches. With
    /// a `plan` (the last backward before a step, under ddp and zero1-2) each bucket's
    /// reduction is issued while backward runs; [`Self::averaged_grads`] waits for them.
    pub(crate) fn backward(
        &mut self,
        strategy: &str,
        loss: &Tensor,
        plan: Option<BucketPlan>,
    ) -> Result<BackwardReport> {
        let mut unused = std::mem::take(&mut self.find_unused).then(|| {
            let handed = self.params.iter().zip(&self.names);
            unreached(
                loss,
                handed.map(|(p, n)| (Some(p.id()), std::slice::from_ref(n))),
            )
        });
        self.settle_reduced()?;
        let Some(plan) = plan else {
            let store = loss.backward()?;
            self.grads.add(&self.params, store)?;
            let recomputed = self.recomputed.take();
            self.keep_reached(&recomputed, &mut unused);
            for store in recomputed {
                self.grads.add(&self.params, store)?;
            }
            return Ok(BackwardReport {
                unused_parameters: unused,
            });
        };
        let world = self.world(strategy)?.clone();
        let mut reduction = BucketReduction::new(&self.params, plan, self.grads.take_partial());
        let store = backward_handing_over(loss, &mut |var, grad| {
            reduction.ready(world.as_ref(), var, grad)
        });
        let recomputed = self.recomputed.take();
        self.keep_reached(&recomputed, &mut unused);
        let issued = match store {
            Ok(store) => {
                let stores = [store].into_iter().chain(recomputed);
                reduction.issue_rest(world.as_ref(), stores)
            }
            Err(e) => Err(reduction.failure(e)),
        };
        if let Err(e) = issued {
            // Nothing is left writing into a buffer once this returns.
            let _ = reduction.wait();
            return Err(e);
        }
        self.in_flight = Some(reduction);
        Ok(BackwardReport {
            unused_parameters: unused,
        })
    }

    /// A recomputed unit's parameters are in its own graph, not the loss's: those its
    /// backward reached are not unused.
    fn keep_reached(
        &self,
        recomputed: &[candle_core::backprop::GradStore],
        unused: &mut Option<Vec<String>>,
    ) {
        let Some(unused) = unused else { return };
        for store in recomputed {
            unused.retain(|name| {
                !self
                    .names
                    .iter()
                    .zip(&self.params)
                    .any(|(n, p)| n == name && store.get(p).is_some())
            });
        }
    }

    /// Waits for the bucket reductions in flight, keeping their averaged gradients.
    fn settle_reduced(&mut self) -> Result<()> {
        if let Some(reduction) = self.in_flight.take() {
            let grads = reduction.wait()?;
            self.reduced = Some(match self.reduced.take() {
                Some(earlier) => add_all(earlier, grads)?,
                None => grads,
            });
        }
        Ok(())
    }

    /// The gradients averaged over the ranks, in `plan`'s form (each parameter's, or this
    /// rank's shard of them): what backward reduced as it ran, plus the reduction by `plan`
    /// of what is still local. `plan` must be the one backward reduced with, if any.
    pub(crate) fn averaged_grads(
        &mut self,
        strategy: &str,
        plan: BucketPlan,
    ) -> Result<Vec<Tensor>> {
        self.settle_reduced()?;
        let reduced = match (self.reduced.take(), self.grads.is_empty()) {
            (Some(reduced), true) => return Ok(reduced),
            (reduced, _) => reduced,
        };
        let local = self.take_grads()?;
        let world = self.world(strategy)?;
        let averaged = reduce_buckets(world.as_ref(), &self.params, plan, local)?;
        Ok(match reduced {
            Some(reduced) => add_all(reduced, averaged)?,
            None => averaged,
        })
    }

    /// The accumulated gradients, cleared for the next step.
    pub(crate) fn take_grads(&mut self) -> Result<Vec<Tensor>> {
        Ok(self.grads.take(&self.params)?)
    }

    /// The optimizer built by `configure_optimizer`.
    pub(crate) fn optimizer(&mut self, strategy: &str) -> Result<&mut Optimizer> {
        self.optimizer
            .as_mut()
            .ok_or_else(|| Self::not_ready(strategy, "optimizer_step before configure_optimizer"))
    }

    /// Whether to step with the reduced `grads` (see [`check_and_clip`], which clips them
    /// when it says yes): `local` is this rank's first parameter with an inf or NaN
    /// gradient, `shards_over` the world whose ranks hold the other parts of the gradients
    /// (`None` when every rank holds them all). Records a skip, or the norm.
    pub(crate) fn check(
        &mut self,
        grads: &mut [Tensor],
        local: Option<usize>,
        shards_over: Option<&dyn Collective>,
    ) -> Result<bool> {
        let names = &self.names;
        self.grad_norm = check_and_clip(grads, local, shards_over, &self.options, |i| {
            names[i].clone()
        })?;
        self.skipped = self.grad_norm.is_none();
        Ok(!self.skipped)
    }

    /// Clips (if asked) and steps every full parameter with its reduced gradient, unless
    /// one holds inf or NaN.
    pub(crate) fn apply(&mut self, strategy: &str, mut grads: Vec<Tensor>) -> Result<()> {
        let local = first_nonfinite(&grads)?;
        if !self.check(&mut grads, local, None)? {
            return Ok(());
        }
        self.grad_bytes = grads.iter().map(tensor_bytes).sum();
        let params = self.params.clone();
        self.optimizer(strategy)?.step(&params, &grads)?;
        Ok(())
    }

    pub(crate) fn parameter_shapes(&self) -> Vec<(String, candle_core::Shape)> {
        self.names
            .iter()
            .cloned()
            .zip(self.params.iter().map(|p| p.shape().clone()))
            .collect()
    }

    pub(crate) fn state_bytes(&self) -> StateBytes {
        StateBytes {
            params: self
                .params
                .iter()
                .map(|p| p.as_tensor())
                .chain(self.frozen.iter().map(|(_, t)| t))
                .map(tensor_bytes)
                .sum(),
            grads: self.grad_bytes,
            optimizer: self.optimizer.as_ref().map_or(0, Optimizer::state_bytes),
        }
    }

    pub(crate) fn full_parameters(&self) -> Result<Vec<(String, Tensor)>> {
        let trainable = self
            .names
            .iter()
            .zip(self.params.iter().map(Var::as_tensor));
        let frozen = self.frozen.iter().map(|(n, t)| (n, t));
        trainable
            .chain(frozen)
            .map(|(n, p)| Ok((n.clone(), p.copy()?)))
            .collect()
    }

    pub(crate) fn num_parameters(&self) -> usize {
        self.params.iter().map(|p| p.elem_count()).sum()
    }

    pub(crate) fn num_frozen_parameters(&self) -> usize {
        self.frozen.iter().map(|(_, t)| t.elem_count()).sum()
    }

    /// This rank's range of the [`layout`](Self::layout). The optimizer state is per
    /// parameter, or one flat shard of the layout when `flat_optimizer` (ZeRO 1-2).
    pub(crate) fn save_state(&self, strategy: &str, flat_optimizer: bool) -> Result<RankState> {
        let layout = self.layout(strategy)?;
        let range = layout.owned(self.world(strategy)?.rank());
        let params: Vec<Tensor> = self.params.iter().map(|p| p.as_tensor().clone()).collect();
        let mut tensors = vec![(
            PARAM_KIND.to_string(),
            concat_range(layout, &params, range.clone())?,
        )];
        let (step, state) = self
            .optimizer
            .as_ref()
            .map_or((0, Vec::new()), |o| (o.step_count(), o.state()));
        for (kind, per_param) in state {
            let t = match flat_optimizer {
                true => shard_prefix(&per_param[0], range.len())?,
                false => concat_range(layout, &per_param, range.clone())?,
            };
            tensors.push((kind.to_string(), t));
        }
        Ok(RankState {
            groups: vec![GroupRange {
                group: flat_group("all".into(), layout),
                range,
                tensors,
            }],
            optimizer_step: step,
            loss_scale: None,
        })
    }

    /// Reads back what [`ReplicatedState::save_state`] saved (at any world size).
    pub(crate) fn load_state(
        &mut self,
        strategy: &str,
        reader: &dyn StateReader,
        flat_optimizer: bool,
    ) -> Result<()> {
        let layout = self.layout(strategy)?.clone();
        let rank = self.world(strategy)?.rank();
        let layout = &layout;
        let group = flat_group("all".into(), layout);
        let device = self.device(strategy)?;
        for (var, value) in self
            .params
            .iter()
            .zip(read_whole(reader, PARAM_KIND, &group, &device)?)
        {
            var.set(&value)?;
        }
        let optimizer = self.optimizer(strategy)?;
        let state = kinds_to_restore(reader, optimizer.state_kinds())?
            .iter()
            .map(|kind| match flat_optimizer {
                true => Ok(vec![read_shard(
                    reader,
                    kind,
                    (layout, &group),
                    rank,
                    &device,
                )?]),
                false => read_whole(reader, kind, &group, &device),
            })
            .collect::<candle_core::Result<Vec<_>>>()?;
        optimizer.set_state(reader.optimizer_step(), state)?;
        Ok(())
    }
}

/// `a[i] + b[i]` for every i.
fn add_all(a: Vec<Tensor>, b: Vec<Tensor>) -> candle_core::Result<Vec<Tensor>> {
    a.into_iter().zip(b).map(|(a, b)| a + b).collect()
}

/// Bytes behind a tensor's elements.
pub(crate) fn tensor_bytes(t: &Tensor) -> usize {
    t.elem_count() * t.dtype().size_in_bytes()
}
