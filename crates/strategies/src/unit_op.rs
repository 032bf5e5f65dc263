//! The unit op of full sharding: (input, flat shard) -> output for one wrapped unit.
//!
//! Forward gathers the unit, runs it, and gives its gathered parameters back before
//! returning. Backward issues the reduce-scatter of the parameter gradient into the shard
//! and goes on while it is in flight. Between the
//! two, a unit either keeps its activations or recomputes them:
//! - kept (PyTorch FSDP's way, the default): forward runs with a graph over one variable
//!   per parameter, then releases those variables' memory while the graph stays
//!   ([`crate::storage_swap`]); backward gathers again into the same variables and
//!   back-propagates through the kept graph. The unit's forward runs once per step.
//! - recomputed (activation checkpointing, and the fallback on stock candle-core):
//!   forward runs without a graph; backward gathers again and reruns the unit with one.
//!
//! Beyond the shards and the kept activations, a rank holds at most three units at once:
//! in backward, the unit's parameters, its gradients and the previous unit's prefetched
//! gather.

use crate::flat_grad::flatten_consuming;
use crate::flat_layout::FlatLayout;
use crate::gather_op::reduce_to_shard;
use crate::kept_grads::KeptGrads;
use crate::op_tensors::{host_storage, host_tensor, input_var};
use crate::param_use::ParamUse;
use crate::prefetch::{gather, Prefetcher};
use crate::sharded_params::unit_var_builder;
use crate::storage_swap;
use candle_core::{CpuStorage, CustomOp2, DType, Device, Layout, Result, Shape, Tensor, Var};
use candle_nn::VarBuilder;
use std::sync::{Arc, Mutex};
use wick_core::{lock, Collective, UnitFn};

pub(crate) struct UnitOp {
    pub(crate) world: Arc<dyn Collective>,
    pub(crate) name: String,
    pub(crate) unit: usize,
    pub(crate) layout: FlatLayout,
    pub(crate) run: UnitFn,
    pub(crate) sync: Arc<KeptGrads>,
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
    out: Tensor,
}

impl UnitOp {
    /// The unit's full flat buffer: prefetched if a gather of it is in flight, otherwise
    /// gathered now.
    fn gather(&self, shard: &Tensor) -> Result<Tensor> {
        match self.prefetch.as_ref().and_then(|p| p.take(self.unit)) {
            Some(full) => full,
            None => gather(
                self.world.as_ref(),
                shard,
                self.layout.padded(),
                self.param_dtype,
            ),
        }
    }

    /// One variable per parameter, copied out of the gathered buffer (which is dropped at
    /// once): back-propagating into views of one flat variable would make candle build a
    /// full-size padded gradient per parameter.
    fn param_vars(&self, full: &Tensor) -> Result<Vec<(String, Var)>> {
        self.layout
            .entries()
            .iter()
            .map(|e| {
                let view = full
                    .narrow(0, e.offset, e.numel())?
                    .reshape(e.shape.clone())?;
                Ok((e.name.clone(), Var::from_tensor(&view)?))
            })
            .collect()
    }

    /// Gathers the unit again into `params`, the variables its kept graph holds.
    fn refill(&self, params: &[(String, Var)], shard: &Tensor) -> Result<()> {
        let fresh = self.param_vars(&self.gather(shard)?)?;
        for ((_, param), (_, values)) in params.iter().zip(&fresh) {
            storage_swap::refill(param, values)?;
        }
        Ok(())
    }

    /// Runs the unit with a graph over `params` and `input`.
    fn run_graph(&self, params: &[(String, Var)], input: &Tensor) -> Result<Tensor> {
        let tensors = params
            .iter()
            .map(|(n, v)| (n.clone(), v.as_tensor().clone()))
            .collect();
        let vb = VarBuilder::from_tensors(tensors, self.param_dtype, &self.device);
        (self.run)(vb, input)
    }

    /// The unit's output for `input`. Its gathered parameters are given back before this
    /// returns (before the next unit runs); its graph is kept for backward when it keeps
    /// activations and a backward may follow.
    fn forward(&self, input: &Tensor, shard: &Tensor) -> Result<Tensor> {
        if self.keep_activations && wick_core::grad_enabled() {
            let params = self.param_vars(&self.gather(shard)?)?;
            self.prefetch(Some(self.unit + 1));
            let (x, x_tensor) = input_var(input)?;
            let out = self.run_graph(&params, &x_tensor)?;
            for (_, param) in &params {
                // SAFETY: the released variables are held only by the kept graph (the
                // unit's output is a copy in the op's own storage), which nothing reads
                // until `bwd` refills them before it runs backward through it; a graph
                // dropped unused is never read.
                unsafe { storage_swap::release(param)? };
            }
            *lock(&self.kept) = Some(KeptGraph {
                input: x,
                params,
                out: out.clone(),
            });
            return Ok(out);
        }
        let full = self.gather(shard)?;
        self.prefetch(Some(self.unit + 1));
        // Neither the input nor the gathered buffer is a variable: no graph is recorded.
        (self.run)(
            unit_var_builder(&self.name, &self.layout, full, &self.device, None),
            input,
        )
    }

    /// Starts gathering `next`, the unit this pass visits after this one.
    fn prefetch(&self, next: Option<usize>) {
        if let (Some(p), Some(next)) = (&self.prefetch, next) {
            p.request(next, self.unit);
        }
    }
}

impl CustomOp2 for UnitOp {
    fn name(&self) -> &'static str {
        "wick-unit"
    }

    fn cpu_fwd(
        &self,
        s1: &CpuStorage,
        l1: &Layout,
        s2: &CpuStorage,
        l2: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        host_storage(&self.forward(&host_tensor(s1, l1)?, &host_tensor(s2, l2)?)?)
    }

    #[cfg(feature = "cuda")]
    fn cuda_fwd(
        &self,
        s1: &candle_core::cuda_backend::CudaStorage,
        l1: &Layout,
        s2: &candle_core::cuda_backend::CudaStorage,
        l2: &Layout,
    ) -> Result<(candle_core::cuda_backend::CudaStorage, Shape)> {
        use crate::device_storage::{storage_of, tensor_of};
        let out = self.forward(&tensor_of(s1, l1)?, &tensor_of(s2, l2)?)?;
        Ok((storage_of(&out)?, out.shape().clone()))
    }

    fn bwd(
        &self,
        input: &Tensor,
        shard: &Tensor,
        _res: &Tensor,
        grad_out: &Tensor,
    ) -> Result<(Option<Tensor>, Option<Tensor>)> {
        // The kept graph, its parameters gathered again; or the unit rerun with a graph.
        // The previous unit starts gathering only then, so at most two units' parameters
        // are alive at any time.
        let kept = lock(&self.kept).take();
        let KeptGraph {
            input: x,
            params,
            out,
        } = match kept {
            Some(kept) => {
                self.refill(&kept.params, shard)?;
                self.prefetch(self.unit.checked_sub(1));
                kept
            }
            None => {
                let params = self.param_vars(&self.gather(shard)?)?;
                self.prefetch(self.unit.checked_sub(1));
                let (x, x_tensor) = input_var(input)?;
                let out = self.run_graph(&params, &x_tensor)?;
                KeptGraph {
                    input: x,
                    params,
                    out,
                }
            }
        };
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
        let flat_grad = flatten_consuming(parts, &self.layout, self.param_dtype, &self.device)?;
        // In flight while backward goes on to the units before this one; the shard's
        // gradient reaches the strategy through `sync`, not this op's return value.
        reduce_to_shard(
            self.world.as_ref(),
            &self.sync,
            self.unit,
            &flat_grad,
            self.reduce_dtype,
            shard,
        )?;
        Ok((input_grad, None))
    }
}
