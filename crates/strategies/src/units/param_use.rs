//! Which parameters a backward reached, for the report of parameters that receive no
//! gradient (a graph cut, such as candle-nn's `LayerNorm`, whose fused op has no backward;
//! or a layer the loss never uses).
//!
//! A tensor handed to the model reached the loss's backward exactly when it is a node of
//! the loss's graph on a path to a variable (`Tensor::sorted_nodes`). Full sharding adds
//! what each unit's own backward finds: its graph is not the loss's.

use candle_core::{Tensor, TensorId};
use std::collections::HashSet;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;
use wick_core::lock;

/// The parameters' tensors handed out while looking, and those a unit found unreached.
#[derive(Default)]
pub(crate) struct ParamUse {
    looking: AtomicBool,
    /// Each tensor handed to the model, with the parameters it carries.
    handed: Mutex<Vec<(TensorId, Vec<String>)>>,
    /// Parameters a unit's own backward gave no gradient.
    missed: Mutex<Vec<String>>,
    /// Tensors a unit's backward could not pass a gradient to (its input, cut inside it).
    cut: Mutex<Vec<TensorId>>,
    /// Tensors in the graph of a recomputed unit's backward (not the loss's graph).
    reached: Mutex<HashSet<TensorId>>,
}

impl ParamUse {
    /// Starts recording (for the next forward and backward).
    pub(crate) fn start(&self) {
        lock(&self.handed).clear();
        lock(&self.missed).clear();
        lock(&self.cut).clear();
        lock(&self.reached).clear();
        self.looking.store(true, Ordering::SeqCst);
    }

    /// Runs `f` without recording what it hands out (a recomputed unit's forward, whose
    /// graph is dropped: the one its backward builds is the one that counts).
    pub(crate) fn paused<T>(&self, f: impl FnOnce() -> T) -> T {
        let was = self.looking.swap(false, Ordering::SeqCst);
        let out = f();
        self.looking.store(was, Ordering::SeqCst);
        out
    }

    /// Records every tensor of `graph` (a recomputed unit's, built in backward) as reached.
    pub(crate) fn reached_by(&self, graph: &Tensor) {
        if self.is_looking() {
            lock(&self.reached).extend(graph.sorted_nodes().iter().map(|t| t.id()));
        }
    }

    pub(crate) fn is_looking(&self) -> bool {
        self.looking.load(Ordering::SeqCst)
    }

    /// Records `tensor`, carrying the parameters `names` gives, as handed to the model. Not
    /// under [`wick_core::no_grad`]: such a forward builds no graph (preference tuning's
    /// reference pass beside the trained one), so what it hands out reaches no backward,
    /// and a parameter the trained forward used is not unused for it.
    pub(crate) fn hand_out(&self, tensor: &Tensor, names: impl FnOnce() -> Vec<String>) {
        if self.is_looking() && wick_core::grad_enabled() {
            lock(&self.handed).push((tensor.id(), names()));
        }
    }

    /// Records that a unit's backward gave `name` no gradient.
    pub(crate) fn missed(&self, name: &str) {
        if self.is_looking() {
            lock(&self.missed).push(name.to_string());
        }
    }

    /// Records that a unit's backward found no gradient for its input `tensor`: whatever
    /// made that tensor got none either.
    pub(crate) fn cut(&self, tensor: &Tensor) {
        if self.is_looking() {
            lock(&self.cut).push(tensor.id());
        }
    }

    /// Stops recording and returns the parameters of `all` that `loss`'s backward did not
    /// reach: those handed out but not in its graph, those a unit's backward missed, and
    /// those never handed out at all (a unit the forward never applied).
    pub(crate) fn take_unused<'a>(
        &self,
        loss: &Tensor,
        all: impl IntoIterator<Item = &'a str>,
    ) -> Vec<String> {
        self.looking.store(false, Ordering::SeqCst);
        let handed = std::mem::take(&mut *lock(&self.handed));
        let cut = std::mem::take(&mut *lock(&self.cut));
        let reached = std::mem::take(&mut *lock(&self.reached));
        // A cut tensor is in the graph, but its gradient was zeros made up by the unit.
        let handed = handed.iter().map(|(id, n)| match cut.contains(id) {
            true => (None, n.as_slice()),
            false => (Some(*id), n.as_slice()),
        });
        let handed: Vec<_> = handed.collect();
        // A tensor a recomputed unit's backward reached is in that unit's graph, not the
        // loss's.
        let mut names = unreached(
            loss,
            handed
                .iter()
                .filter(|(id, _)| !id.is_some_and(|id| reached.contains(&id)))
                .copied(),
        );
        names.append(&mut lock(&self.missed));
        let seen: HashSet<&str> = handed
            .iter()
            .flat_map(|(_, n)| n.iter().map(String::as_str))
            .collect();
        names.extend(
            all.into_iter()
                .filter(|n| !seen.contains(n))
                .map(str::to_string),
        );
        names
    }
}

/// The names whose tensors are not in `loss`'s graph (or are `None`: known unreached), in
/// the order given, each once.
pub(crate) fn unreached<'a>(
    loss: &Tensor,
    handed: impl IntoIterator<Item = (Option<TensorId>, &'a [String])>,
) -> Vec<String> {
    let reached: HashSet<TensorId> = loss.sorted_nodes().iter().map(|t| t.id()).collect();
    let mut seen = HashSet::new();
    handed
        .into_iter()
        .filter(|(id, _)| !id.is_some_and(|id| reached.contains(&id)))
        .flat_map(|(_, names)| names.iter())
        .filter(|n| seen.insert(n.as_str()))
        .cloned()
        .collect()
}
