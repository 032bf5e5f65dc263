//! [`ReplicatedRank`]: one rank of a [`Replicated`](crate::Replicated) strategy once its
//! parameters exist: the state it holds and the step its [`GradReduce`] takes.

use crate::replicated::grad_reduce::GradReduce;
use crate::replicated::replicated_state::ReplicatedState;
use candle_core::{Device, Shape, Tensor};
use std::sync::Arc;
use wick_core::{
    BackwardReport, Collective, GradSync, OptimizerConfig, RankState, RankStrategy, Result,
    Sharding, StateBytes, StateReader, StepOptions, StepReport, StrategyState, StrategyStep,
};

/// One rank of a replicated strategy: every parameter in full, reduced with `R`.
pub(crate) struct ReplicatedRank<R> {
    name: &'static str,
    reduce: R,
    state: ReplicatedState,
}

impl<R> ReplicatedRank<R> {
    pub(crate) fn new(name: &'static str, reduce: R, state: ReplicatedState) -> Self {
        ReplicatedRank {
            name,
            reduce,
            state,
        }
    }
}

impl<R: GradReduce> RankStrategy for ReplicatedRank<R> {
    fn name(&self) -> &str {
        self.name
    }

    fn connect(&mut self, world: Arc<dyn Collective>, device: Device) -> Result<()> {
        self.state.connect(world, device);
        Ok(())
    }

    fn configure_optimizer(&mut self, config: &OptimizerConfig, options: StepOptions) {
        self.state.configure_optimizer(config, options);
    }
}

impl<R: GradReduce> StrategyStep for ReplicatedRank<R> {
    fn backward(&mut self, loss: &Tensor, sync: GradSync) -> Result<BackwardReport> {
        let plan = match sync {
            GradSync::Reduce => self.reduce.overlapped(&self.state),
            GradSync::Accumulate => None,
        };
        self.state.backward(loss, plan)
    }

    fn optimizer_step(&mut self, lr: f64) -> Result<StepReport> {
        self.state.optimizer()?.set_lr(lr);
        self.reduce.step(&mut self.state)
    }
}

impl<R: GradReduce> StrategyState for ReplicatedRank<R> {
    fn full_parameters(&self) -> Result<Vec<(String, Tensor)>> {
        self.state.full_parameters()
    }

    fn num_parameters(&self) -> usize {
        self.state.num_parameters()
    }

    fn num_frozen_parameters(&self) -> usize {
        self.state.num_frozen_parameters()
    }

    fn state_bytes(&self) -> StateBytes {
        self.state.state_bytes()
    }

    fn sharding(&self) -> Sharding {
        self.reduce.sharding()
    }

    fn parameter_shapes(&self) -> Vec<(String, Shape)> {
        self.state.parameter_shapes()
    }

    fn save_state(&self) -> Result<RankState> {
        self.state.save_state(self.sharding().optimizer)
    }

    fn load_state(&mut self, reader: &dyn StateReader) -> Result<()> {
        let flat_optimizer = self.sharding().optimizer;
        self.state.load_state(reader, flat_optimizer)
    }
}
