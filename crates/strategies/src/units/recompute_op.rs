//! Activation checkpointing of a unit whose parameters stay put for the step (replicated,
//! or gathered once per step): input -> output, keeping nothing in between.
//!
//! Forward runs the unit and keeps only its output: the graph it built is dropped. Backward
//! runs it again with a graph, back-propagates the incoming gradient through it, and passes
//! on the input's gradient. The parameters' gradients cannot leave a custom op (it returns
//! one per argument), so they wait in [`RecomputedGrads`] until the strategy adds them to
//! the loss's gradients after backward. Under zero3 that graph reaches the shards through
//! the gather op, whose backward reduce-scatters as it does without recompute.

use crate::units::op_tensors::{input_var, OnTensors, TensorOp2};
use crate::units::param_use::ParamUse;
use candle_core::backprop::GradStore;
use candle_core::{DType, Device, Result, Tensor, Var};
use std::sync::{Arc, Mutex};
use wick_core::{lock, RecomputeFn};

/// The gradient stores of the recomputed units' backward since the strategy last took them,
/// and the variable that puts every recomputed unit on the loss's graph.
pub(crate) struct RecomputedGrads {
    stores: Mutex<Vec<GradStore>>,
    /// The op's second argument: a unit's input may take no gradient (the batch), and the
    /// op's backward must run all the same, for the parameters'. It gets none itself.
    tracked: Var,
}

impl Default for RecomputedGrads {
    fn default() -> Self {
        RecomputedGrads {
            stores: Mutex::default(),
            tracked: Var::from_tensor(
                &Tensor::zeros(1, DType::F32, &Device::Cpu).expect("one float"),
            )
            .expect("a variable of one float"),
        }
    }
}

impl RecomputedGrads {
    /// Every store left since the last call, in the order backward made them.
    pub(crate) fn take(&self) -> Vec<GradStore> {
        std::mem::take(&mut *lock(&self.stores))
    }

    /// `run` applied to `input` as one recomputed unit of the graph, whatever `input`
    /// tracks; its parameters' gradients come here. `uses`: the record of which
    /// parameters backward reached, if the strategy keeps one.
    pub(crate) fn apply(
        self: &Arc<Self>,
        input: &Tensor,
        run: RecomputeFn,
        uses: Option<Arc<ParamUse>>,
    ) -> Result<Tensor> {
        let tracked = match input.device() {
            Device::Cpu => self.tracked.as_tensor().clone(),
            device => self.tracked.as_tensor().to_device(device)?,
        };
        let op = RecomputeOp {
            run,
            grads: self.clone(),
            uses,
        };
        input.apply_op2(&tracked, OnTensors(op))
    }
}

struct RecomputeOp {
    run: RecomputeFn,
    grads: Arc<RecomputedGrads>,
    /// The first step's record of which parameters backward reached (zero3's), if any.
    uses: Option<Arc<ParamUse>>,
}

impl TensorOp2 for RecomputeOp {
    const NAME: &'static str = "wick-recompute";

    /// The unit's output, its graph dropped. The parameters it hands out here are not
    /// recorded: the ones that count are those of the graph backward builds.
    fn forward(&self, input: &Tensor, _tracked: &Tensor) -> Result<Tensor> {
        match &self.uses {
            Some(uses) => uses.paused(|| (self.run)(input)),
            None => (self.run)(input),
        }
    }

    fn backward(
        &self,
        input: &Tensor,
        _tracked: &Tensor,
        grad_out: &Tensor,
    ) -> Result<(Option<Tensor>, Option<Tensor>)> {
        let (x, x_tensor) = input_var(input)?;
        let out = (self.run)(&x_tensor)?;
        if let Some(uses) = &self.uses {
            uses.reached_by(&out);
        }
        // The variables the unit reached: its parameters (zero3: the shards, through the
        // gather op). Their gradients are all the strategy needs of this backward's store,
        // which also holds one for every operand that takes none (the incoming gradient).
        let vars: Vec<Tensor> = out
            .sorted_nodes()
            .into_iter()
            .filter(|t| t.is_variable())
            .cloned()
            .collect();
        // d(sum(out * g))/d(param) is the vector-Jacobian product backward needs.
        let mut grads = (&out * grad_out.detach())?.sum_all()?.backward()?;
        drop(out);
        let input_grad = match x {
            // A graph cut inside the unit: zeros, which candle needs for a node on its path.
            Some(v) => Some(match grads.remove(v.as_tensor()) {
                Some(g) => g,
                None => input.zeros_like()?,
            }),
            None => None,
        };
        let mut kept = GradStore::default();
        for v in &vars {
            if let Some(g) = grads.remove(v) {
                kept.insert(v, g);
            }
        }
        lock(&self.grads.stores).push(kept);
        Ok((input_grad, None))
    }
}
