//! The unit op of full sharding: (input, flat shard) -> output for one wrapped unit.
//!
//! Forward gathers the unit, runs it, and gives its gathered parameters back before
//! returning. Backward issues the reduce-scatter of the parameter gradient into the shard
//! and goes on while it is in flight. Between the
//! two, a unit either keeps its activations or recomputes them:
//! - kept (PyTorch FSDP's way, the default): forward runs with a graph over one variable
//!   per parameter, then releases those variables' memory while the graph stays
//!   ([`crate::units::storage_swap`]); backward gathers again into the same variables and
//!   back-propagates through the kept graph. The unit's forward runs once per step.
//! - recomputed (activation checkpointing, and the fallback on stock candle-core):
//!   forward runs without a graph; backward gathers again and reruns the unit with one.
//!
//! Beyond the shards and the kept activations, a rank holds at most three units at once:
//! in backward, the unit's parameters, its gradients and the previous unit's prefetched
//! gather.

use crate::layout::flat_grad::flatten_consuming;
use crate::layout::flat_layout::{FlatEntry, FlatLayout};
use crate::units::backward_reduction::BackwardReduction;
use crate::units::gather_op::reduce_to_shard;
use crate::units::op_tensors::{input_var, TensorOp2};
use crate::units::param_use::ParamUse;
use crate::units::prefetch::{gather, Prefetcher};
use crate::units::storage_swap;
use crate::units::unit_views::{unit_var_builder, FrozenPart, GatheredPart, PartLayout};
use candle_core::{DType, Device, Result, Tensor, Var};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use wick_core::{lock, Collective, UnitFn};

pub(crate) struct UnitOp {
    pub(crate) world: Arc<dyn Collective>,
    pub(crate) name: String,
    pub(crate) unit: usize,
    /// The trainable parameters' layout (the shard is the op's second input).
    pub(crate) layout: FlatLayout,
    /// The frozen parameters (values, stored blocks), gathered with the others but never
    /// given a gradient.
    pub(crate) frozen: Vec<FrozenPart>,
    pub(crate) run: UnitFn,
    pub(crate) reduction: Arc<BackwardReduction>,
    /// Where a parameter this unit's backward gives no gradient is reported.
    pub(crate) uses: Arc<ParamUse>,
    pub(crate) device: Device,
    pub(crate) param_dtype: DType,
    pub(crate) reduce_dtype: DType,
    pub(crate) prefetch: Option<Arc<Prefetcher>>,
    /// Keep the forward's activations for backward (when a backward may follow) rather
    /// than recompute them.
    pub(crate) keep_activations: bool,
    /// The forward's graph, kept for backward with its parameters' memory released.
    pub(crate) kept: Mutex<Option<KeptGraph>>,
}

/// A unit's forward graph kept for its backward.
pub(crate) struct KeptGraph {
    /// The input as the graph's variable (`None`: an integer input, which takes no gradient).
    input: Option<Var>,
    /// One variable per parameter, empty until backward refills them.
    params: Vec<(String, Var)>,
    /// The frozen parts' unpacked buffers (their views are in the graph), empty likewise.
    frozen: Vec<Tensor>,
    out: Tensor,
}

/// A unit's gathered buffers: the trainable part's and the frozen parts' (unpacked).
struct Gathered {
    trainable: Tensor,
    frozen: Vec<Tensor>,
}

impl UnitOp {
    /// The unit's full flat buffers: prefetched if a gather of them is in flight, otherwise
    /// gathered now.
    fn gather(&self, shard: &Tensor) -> Result<Gathered> {
        let (world, dtype) = (self.world.as_ref(), self.param_dtype);
        let mut parts = match self.prefetch.as_ref().and_then(|p| p.take(self.unit)) {
            Some(parts) => parts?.into_iter(),
            None => {
                let mut parts = vec![gather(world, shard, self.layout.padded(), dtype)?];
                for f in &self.frozen {
                    parts.push(gather(world, &f.shard, f.layout.padded(), dtype)?);
                }
                parts.into_iter()
            }
        };
        let trainable = parts
            .next()
            .ok_or_else(|| candle_core::Error::Msg("wick-unit: no gathered buffer".into()))?;
        let frozen = (self.frozen.iter().zip(parts))
            .map(|(f, full)| f.layout.unpack(full))
            .collect::<Result<_>>()?;
        Ok(Gathered { trainable, frozen })
    }

    /// One variable per parameter, copied out of the gathered buffer (which is dropped at
    /// once): back-propagating into views of one flat variable would make candle build a
    /// full-size padded gradient per parameter.
    fn param_vars(&self, full: &Tensor) -> Result<Vec<(String, Var)>> {
        let var = |e: &FlatEntry| Ok((e.name.clone(), Var::from_tensor(&e.view(full)?)?));
        self.layout.entries().iter().map(var).collect()
    }

    /// The graph backward runs through: the kept one, its parameters gathered again; or
    /// the unit rerun with a graph. The previous unit starts gathering only then, so at
    /// most two units' parameters are alive at any time.
    fn graph_for_backward(&self, input: &Tensor, shard: &Tensor) -> Result<KeptGraph> {
        let kept = lock(&self.kept).take();
        if let Some(kept) = kept {
            self.refill(&kept, shard)?;
            self.prefetch(self.unit.checked_sub(1))?;
            return Ok(kept);
        }
        let gathered = self.gather(shard)?;
        let params = self.param_vars(&gathered.trainable)?;
        let frozen = gathered.frozen;
        self.prefetch(self.unit.checked_sub(1))?;
        let (x, x_tensor) = input_var(input)?;
        let out = self.run_graph(&params, &frozen, &x_tensor)?;
        Ok(KeptGraph {
            input: x,
            params,
            frozen,
            out,
        })
    }

    /// Gathers the unit again into `kept`'s variables and frozen buffer.
    fn refill(&self, kept: &KeptGraph, shard: &Tensor) -> Result<()> {
        let gathered = self.gather(shard)?;
        let fresh = self.param_vars(&gathered.trainable)?;
        for ((_, param), (_, values)) in kept.params.iter().zip(&fresh) {
            storage_swap::refill(param, values)?;
        }
        for (frozen, values) in kept.frozen.iter().zip(&gathered.frozen) {
            storage_swap::refill(frozen, values)?;
        }
        Ok(())
    }

    /// Runs the unit with a graph over `params` (and the frozen buffers' views) and `input`.
    fn run_graph(
        &self,
        params: &[(String, Var)],
        frozen: &[Tensor],
        input: &Tensor,
    ) -> Result<Tensor> {
        let given = params
            .iter()
            .map(|(n, v)| (n.clone(), v.as_tensor().clone()))
            .collect();
        let vb = unit_var_builder(
            &self.name,
            given,
            self.frozen_parts(frozen),
            self.param_dtype,
            &self.device,
            None,
        );
        (self.run)(vb, input)
    }

    /// The frozen parts over their unpacked buffers `flats`.
    fn frozen_parts(&self, flats: &[Tensor]) -> Vec<GatheredPart> {
        (self.frozen.iter().zip(flats))
            .map(|(part, flat)| part.gathered(flat.clone()))
            .collect()
    }

    /// The unit run without a graph over its gathered parameters (the op's forward when no
    /// backward will follow, or with no op at all when none can).
    pub(crate) fn forward_plain(&self, input: &Tensor) -> Result<Tensor> {
        // Only called for a unit without trainable parameters: its shard is empty.
        let shard = Tensor::zeros(0, DType::F32, &self.device)?;
        let gathered = self.gather(&shard)?;
        self.prefetch(Some(self.unit + 1))?;
        self.run_plain(gathered, input)
    }

    /// Runs the unit over `gathered` views: neither they nor the input are variables, so no
    /// graph is recorded.
    fn run_plain(&self, gathered: Gathered, input: &Tensor) -> Result<Tensor> {
        let mut parts = vec![GatheredPart {
            layout: PartLayout::Values(self.layout.clone()),
            flat: gathered.trainable,
            counted: false,
        }];
        parts.extend(self.frozen_parts(&gathered.frozen));
        let vb = unit_var_builder(
            &self.name,
            HashMap::new(),
            parts,
            self.param_dtype,
            &self.device,
            None,
        );
        (self.run)(vb, input)
    }

    /// Starts gathering `next`, the unit this pass visits after this one.
    fn prefetch(&self, next: Option<usize>) -> Result<()> {
        match (&self.prefetch, next) {
            (Some(p), Some(next)) => p.request(next, self.unit),
            _ => Ok(()),
        }
    }
}

impl TensorOp2 for UnitOp {
    const NAME: &'static str = "wick-unit";

    /// The unit's output for `input`. Its gathered parameters are given back before this
    /// returns (before the next unit runs); its graph is kept for backward when it keeps
    /// activations and a backward may follow.
    fn forward(&self, input: &Tensor, shard: &Tensor) -> Result<Tensor> {
        if self.keep_activations && wick_core::grad_enabled() {
            let gathered = self.gather(shard)?;
            let params = self.param_vars(&gathered.trainable)?;
            let frozen = gathered.frozen;
            drop(gathered.trainable);
            self.prefetch(Some(self.unit + 1))?;
            let (x, x_tensor) = input_var(input)?;
            let out = self.run_graph(&params, &frozen, &x_tensor)?;
            let released = params.iter().map(|(_, p)| p.as_tensor()).chain(&frozen);
            for tensor in released {
                // Held by the kept graph (the unit's output is a copy in the op's own
                // storage), which `bwd` refills before it runs backward through it; a
                // clone the unit's closure kept reads an error until then.
                storage_swap::release(tensor)?;
            }
            *lock(&self.kept) = Some(KeptGraph {
                input: x,
                params,
                frozen,
                out: out.clone(),
            });
            return Ok(out);
        }
        let gathered = self.gather(shard)?;
        self.prefetch(Some(self.unit + 1))?;
        self.run_plain(gathered, input)
    }

    fn backward(
        &self,
        input: &Tensor,
        shard: &Tensor,
        grad_out: &Tensor,
    ) -> Result<(Option<Tensor>, Option<Tensor>)> {
        let KeptGraph {
            input: x,
            params,
            frozen,
            out,
        } = self.graph_for_backward(input, shard)?;
        // d(sum(out * g))/d(param) is the vector-Jacobian product backward needs.
        let mut grads = (&out * grad_out.detach())?.sum_all()?.backward()?;
        drop(out);
        let input_grad = match x {
            // The unit cut the graph inside (a layer without backward): the input gets zeros,
            // which candle needs for a node on its path, and is reported as cut.
            Some(v) => Some(match grads.remove(v.as_tensor()) {
                Some(g) => g,
                None => {
                    self.uses.cut(input);
                    input.zeros_like()?
                }
            }),
            None => None,
        };
        let parts: Vec<Option<Tensor>> = params
            .iter()
            .map(|(name, v)| {
                let grad = grads.remove(v.as_tensor());
                if grad.is_none() {
                    self.uses.missed(name);
                }
                grad
            })
            .collect();
        // The parameters go before the flat gradient is allocated, so a rank holds three
        // units at most: gradients, flat buffer and the prefetched previous unit.
        drop(grads);
        drop(params);
        drop(frozen);
        if self.layout.numel() == 0 {
            // Frozen parameters only: the input's gradient is all this unit gives.
            return Ok((input_grad, None));
        }
        let flat_grad = flatten_consuming(parts, &self.layout, self.param_dtype, &self.device)?;
        // In flight while backward goes on to the units before this one; the shard's
        // gradient reaches the strategy through `reduction`, not this op's return value.
        reduce_to_shard(
            self.world.as_ref(),
            &self.reduction,
            self.unit,
            &flat_grad,
            self.reduce_dtype,
            shard,
        )?;
        Ok((input_grad, None))
    }
}
