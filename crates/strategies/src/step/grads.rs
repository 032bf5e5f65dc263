//! Gradients accumulated over micro-batches, one slot per parameter.

use candle_core::{backprop::GradStore, Result, Tensor, Var};

/// Sum of the gradients of every `backward` since the last step, per parameter.
#[derive(Default)]
pub(crate) struct GradAccumulator {
    grads: Vec<Option<Tensor>>,
}

impl GradAccumulator {
    /// Adds the gradients of `store` for `params` (in order), draining the store.
    pub(crate) fn add(&mut self, params: &[Var], mut store: GradStore) -> Result<()> {
        self.grads.resize(params.len(), None);
        for (slot, p) in self.grads.iter_mut().zip(params) {
            if let Some(g) = store.remove(p.as_tensor()) {
                // Candle may return a strided view (a linear weight's gradient is a
                // transpose); optimizers and collectives want contiguous buffers, made here
                // one at a time as the store drains.
                let g = g.contiguous()?;
                *slot = Some(match slot.take() {
                    Some(acc) => (acc + g)?,
                    None => g,
                });
            }
        }
        Ok(())
    }

    /// Whether no gradient was added since the last take.
    pub(crate) fn is_empty(&self) -> bool {
        self.grads.iter().all(Option::is_none)
    }

    /// The accumulated gradients, `None` for a parameter that received none; clears them.
    pub(crate) fn take_partial(&mut self) -> Vec<Option<Tensor>> {
        std::mem::take(&mut self.grads)
    }

    /// The accumulated gradients, zeros for a parameter that received none; clears them.
    pub(crate) fn take(&mut self, params: &[Var]) -> Result<Vec<Tensor>> {
        let grads = std::mem::take(&mut self.grads);
        params
            .iter()
            .enumerate()
            .map(|(i, p)| match grads.get(i).cloned().flatten() {
                Some(g) => Ok(g),
                None => p.zeros_like(),
            })
            .collect()
    }
}
