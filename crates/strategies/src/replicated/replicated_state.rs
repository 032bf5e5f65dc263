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
use crate::replicated::frozen_param::FrozenParam;
use crate::step::grads::GradAccumulator;
use crate::step::nonfinite::{check_and_clip, step_report};
use crate::units::param_request::{check_asked_again, check_dtype};
use crate::units::param_use::unreached;
use crate::units::recompute_op::RecomputedGrads;
use candle_core::{Device, Tensor, Var};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use wick_core::{
    lock, ActivationCheckpointing, BackwardReport, Collective, CollectiveExt, Error, GroupRange,
    OptimizerConfig, ParamRequest, ParamSource, RankState, Result, StateBytes, StateReader,
    StepOptions, StepReport, UnitRuns, PARAM_KIND,
};

/// Full parameters created on request, identical on every rank (the init is counter-based,
/// so no broadcast is needed).
pub(crate) struct ReplicatedParams {
    seed: u64,
    params: Mutex<Vec<(String, Var)>>,
    /// Parameters that take no gradient: plain tensors (or quantized blocks), not variables.
    frozen: Mutex<Vec<FrozenParam>>,
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
        let made = params
            .iter()
            .map(|(n, v)| (n, v.as_tensor(), v.shape(), true));
        let made = made.chain(frozen.iter().map(|f| (&f.name, &f.tensor, &f.shape, false)));
        if let Some((_, tensor, made_shape, was_trainable)) =
            made.into_iter().find(|(n, ..)| *n == name)
        {
            check_asked_again(&request, made_shape, was_trainable)?;
            return Ok(tensor.clone());
        }
        if !request.trainable {
            let param = FrozenParam::new(&request, self.seed)?;
            let tensor = param.tensor.clone();
            frozen.push(param);
            return Ok(tensor);
        }
        let values = param_values(request.init, self.seed, name, shape, 0..shape.elem_count())?;
        let tensor = Tensor::from_vec(values, shape, request.device)?;
        let var = Var::from_tensor(&tensor)?;
        params.push((name.to_string(), var.clone()));
        Ok(var.as_tensor().clone())
    }

    fn contains(&self, name: &str) -> bool {
        self.lock().iter().any(|(n, _)| n == name)
            || lock(&self.frozen).iter().any(|f| f.name == name)
    }

    fn begin_unit(&self, _name: &str) -> candle_core::Result<usize> {
        Ok(self.units.fetch_add(1, Ordering::Relaxed))
    }

    /// Runs the block over the whole parameters, recomputed in backward where activation
    /// checkpointing picks the unit.
    fn apply_unit(&self, unit: usize, xs: &Tensor, runs: UnitRuns) -> candle_core::Result<Tensor> {
        match self.activation_checkpointing.recomputes(unit) {
            true => self.recomputed.apply(xs, runs.on_params, None),
            false => (runs.on_params)(xs),
        }
    }
}

impl ReplicatedParams {
    /// An empty store whose parameters draw their values from `seed`.
    pub(crate) fn new(seed: u64, activation_checkpointing: ActivationCheckpointing) -> Self {
        ReplicatedParams {
            seed,
            params: Mutex::new(Vec::new()),
            frozen: Mutex::new(Vec::new()),
            units: AtomicUsize::new(0),
            activation_checkpointing,
            recomputed: Arc::default(),
        }
    }
}

/// One rank's replicated model state: parameters, accumulated gradients, optimizer. It
/// exists once `configure_sharded_model` created the parameters.
pub(crate) struct ReplicatedState {
    /// The strategy's registry name, for its errors.
    name: &'static str,
    world: Arc<dyn Collective>,
    device: Device,
    /// All parameters laid out flat over the world: ZeRO 1-2 shard the optimizer state by
    /// it, and checkpoints save rank r's 1/W range of it (no rank writes everything).
    pub(crate) layout: FlatLayout,
    pub(crate) names: Vec<String>,
    pub(crate) params: Vec<Var>,
    /// Parameters without gradient or optimizer state, by name.
    frozen: Vec<FrozenParam>,
    grads: GradAccumulator,
    /// Built for each fit (`configure_optimizer`): per fit, not per rank.
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
}

impl ReplicatedState {
    /// The state of the parameters `source` created over `world`, for the strategy `name`.
    pub(crate) fn new(
        name: &'static str,
        source: &ReplicatedParams,
        world: Arc<dyn Collective>,
        device: Device,
    ) -> Result<Self> {
        let params = std::mem::take(&mut *source.lock());
        if params.is_empty() {
            return Err(Error::NoParameters);
        }
        let (names, params): (Vec<String>, Vec<Var>) = params.into_iter().unzip();
        let shapes = names
            .iter()
            .cloned()
            .zip(params.iter().map(|p| p.shape().clone()));
        let layout = FlatLayout::new(shapes, world.world_size());
        Ok(ReplicatedState {
            name,
            world,
            device,
            layout,
            names,
            params,
            frozen: std::mem::take(&mut *lock(&source.frozen)),
            grads: GradAccumulator::default(),
            optimizer: None,
            grad_bytes: 0,
            options: StepOptions::default(),
            find_unused: false,
            recomputed: source.recomputed.clone(),
            in_flight: None,
            reduced: None,
        })
    }

    pub(crate) fn connect(&mut self, world: Arc<dyn Collective>, device: Device) {
        self.world = world;
        self.device = device;
    }

    pub(crate) fn world(&self) -> &Arc<dyn Collective> {
        &self.world
    }

    /// The optimizer of the fit under way, or the error of a step before any fit built one.
    pub(crate) fn optimizer(&mut self) -> Result<&mut Optimizer> {
        let name = self.name;
        self.optimizer.as_mut().ok_or_else(|| no_optimizer(name))
    }

    /// A fresh optimizer and step options for the fit about to run; nothing of the last
    /// fit's step is left over.
    pub(crate) fn configure_optimizer(&mut self, config: &OptimizerConfig, options: StepOptions) {
        self.optimizer = Some(Optimizer::new(config));
        self.options = options;
        self.find_unused = options.find_unused_parameters;
        self.grads = GradAccumulator::default();
        self.in_flight = None;
        self.reduced = None;
    }

    /// Back-propagates `loss`, adding the gradients to those of earlier micro-batches. With
    /// a `plan` (the last backward before a step, under ddp and zero1-2) each bucket's
    /// reduction is issued while backward runs; [`Self::averaged_grads`] waits for them.
    pub(crate) fn backward(
        &mut self,
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
        let world = self.world.clone();
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
    pub(crate) fn averaged_grads(&mut self, plan: BucketPlan) -> Result<Vec<Tensor>> {
        self.settle_reduced()?;
        let reduced = match (self.reduced.take(), self.grads.is_empty()) {
            (Some(reduced), true) => return Ok(reduced),
            (reduced, _) => reduced,
        };
        let local = self.take_grads()?;
        let averaged = reduce_buckets(self.world.as_ref(), &self.params, plan, local)?;
        Ok(match reduced {
            Some(reduced) => add_all(reduced, averaged)?,
            None => averaged,
        })
    }

    /// The accumulated gradients, cleared for the next step.
    pub(crate) fn take_grads(&mut self) -> Result<Vec<Tensor>> {
        Ok(self.grads.take(&self.params)?)
    }

    /// The step's verdict on the reduced `grads` (see [`check_and_clip`], which clips them
    /// when it says to step): their norm before clipping, or `None` to skip. `locate` says
    /// which parameter this rank's first gradient with inf or NaN is, `shards_over` the world whose
    /// ranks hold the other parts of the gradients (`None` when every rank holds them all).
    pub(crate) fn check(
        &self,
        grads: &mut [Tensor],
        locate: impl FnOnce(&[Tensor], usize) -> Result<Option<usize>>,
        shards_over: Option<&dyn Collective>,
    ) -> Result<Option<f64>> {
        let names = &self.names;
        check_and_clip(grads, locate, shards_over, &self.options, |i| {
            names[i].clone()
        })
    }

    /// Clips (if asked) and steps every full parameter with its reduced gradient, unless
    /// one holds inf or NaN.
    pub(crate) fn apply(&mut self, mut grads: Vec<Tensor>) -> Result<StepReport> {
        // One gradient a parameter: the first with inf or NaN is that parameter.
        let grad_norm = self.check(&mut grads, |_, i| Ok(Some(i)), None)?;
        if grad_norm.is_some() {
            self.grad_bytes = grads.iter().map(tensor_bytes).sum();
            let params = self.params.clone();
            self.optimizer()?.step(&params, &grads)?;
        }
        Ok(step_report(grad_norm))
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
                .chain(self.frozen.iter().map(|f| &f.tensor))
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
        let trainable = trainable.map(|(n, p)| Ok((n.clone(), p.copy()?)));
        let frozen = (self.frozen.iter()).map(|f| Ok((f.name.clone(), f.full()?)));
        trainable.chain(frozen).collect()
    }

    pub(crate) fn num_parameters(&self) -> usize {
        self.params.iter().map(|p| p.elem_count()).sum()
    }

    pub(crate) fn num_frozen_parameters(&self) -> usize {
        self.frozen.iter().map(|f| f.shape.elem_count()).sum()
    }

    /// This rank's range of the `layout`. The optimizer state is per
    /// parameter, or one flat shard of the layout when `flat_optimizer` (ZeRO 1-2).
    pub(crate) fn save_state(&self, flat_optimizer: bool) -> Result<RankState> {
        let layout = &self.layout;
        let range = layout.owned(self.world.rank());
        let params: Vec<Tensor> = self.params.iter().map(|p| p.as_tensor().clone()).collect();
        let mut tensors = vec![(
            PARAM_KIND.to_string(),
            concat_range(layout, &params, range.clone())?,
        )];
        let optimizer = self.optimizer.as_ref();
        for (kind, per_param) in optimizer.map(Optimizer::state).unwrap_or_default() {
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
            optimizer_step: optimizer.map_or(0, Optimizer::step_count),
            loss_scale: None,
        })
    }

    /// Reads back what [`ReplicatedState::save_state`] saved (at any world size).
    pub(crate) fn load_state(
        &mut self,
        reader: &dyn StateReader,
        flat_optimizer: bool,
    ) -> Result<()> {
        let kinds = kinds_to_restore(reader, self.optimizer()?.state_kinds())?;
        let (layout, rank, device) = (&self.layout, self.world.rank(), &self.device);
        let group = flat_group("all".into(), layout);
        for (var, value) in self
            .params
            .iter()
            .zip(read_whole(reader, PARAM_KIND, &group, device)?)
        {
            var.set(&value)?;
        }
        let state = kinds
            .iter()
            .map(|kind| match flat_optimizer {
                true => Ok(vec![read_shard(
                    reader,
                    kind,
                    (layout, &group),
                    rank,
                    device,
                )?]),
                false => read_whole(reader, kind, &group, device),
            })
            .collect::<candle_core::Result<Vec<_>>>()?;
        self.optimizer()?
            .set_state(reader.optimizer_step(), state)?;
        Ok(())
    }
}

/// The error of an optimizer step, or a checkpoint load, before `configure_optimizer`.
pub(crate) fn no_optimizer(strategy: &str) -> Error {
    Error::StepOrder {
        strategy: strategy.into(),
        message:
            "no optimizer: configure_optimizer comes before an optimizer step or a checkpoint load"
                .into(),
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
