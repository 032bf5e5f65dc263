//! Gradients averaged over the ranks by one collective per bucket, issued while backward
//! runs: an all-reduce under ddp and zero1, a reduce-scatter into the owners' ranges under
//! zero2.
//!
//! Buckets hold parameters in reverse registration order, about `cap` bytes each, as in
//! PyTorch's DDP: the order backward completes them. During the last backward before a
//! step, each parameter's gradient is handed over as soon as backward has run every node
//! that uses it (the vendored candle-core's `backward_with_ready`); when a bucket is full it
//! is flattened and its all-reduce issued, and backward goes on while it is in flight.
//! Buckets are issued strictly in order (a full bucket waits for the ones before it), so
//! every rank issues the same calls in the same order whatever its graph's timing. The step
//! waits for them in that order. With stock candle-core there is no such hook: every bucket
//! is issued once backward returns, as before.
//!
//! A bucket is a run of consecutive parameters, so under zero2 it is one range of the flat
//! layout: each rank receives the part of it that falls in its own range (none, for most
//! ranks, when buckets are small), an uneven reduce-scatter
//! ([`Collective::reduce_scatter_parts_start`]), as DeepSpeed's ZeRO-2 reduces each bucket
//! to the ranks that own it. The layout, and so every checkpoint, stays as it was.
//!
//! Every element is reduced by the same rank-order sum however the buckets fall, so the
//! result is the same bits as one all-reduce (or reduce-scatter) of everything.

use crate::layout::flat_layout::FlatLayout;
use candle_core::backprop::GradStore;
use candle_core::{DType, Device, Tensor, TensorId, Var};
use std::collections::HashMap;
use wick_core::{Collective, CollectiveExt, ReduceOp, Result, Work};

/// PyTorch DDP's default bucket size.
pub(crate) const DEFAULT_BUCKET_CAP_BYTES: usize = 25 << 20;

/// The parameter indices of each bucket of `params`, in all-reduce order: reverse
/// registration order, each bucket up to `cap` bytes (or one larger parameter).
pub(crate) fn buckets(params: &[Var], cap: usize) -> Vec<Vec<usize>> {
    let mut buckets = Vec::new();
    let mut current = Vec::new();
    let mut bytes = 0;
    for (i, p) in params.iter().enumerate().rev() {
        let size = p.elem_count() * p.dtype().size_in_bytes();
        if !current.is_empty() && bytes + size > cap {
            buckets.push(std::mem::take(&mut current));
            bytes = 0;
        }
        current.push(i);
        bytes += size;
    }
    if !current.is_empty() {
        buckets.push(current);
    }
    buckets
}

/// How a step's gradients are reduced: the buckets, and what each rank keeps of them.
#[derive(Clone)]
pub(crate) struct BucketPlan {
    /// Parameter indices, in issue order ([`buckets`]).
    pub(crate) buckets: Vec<Vec<usize>>,
    /// `None`: every rank keeps the whole averaged gradient (all-reduce). A layout and
    /// this rank: each rank keeps its range of it (reduce-scatter).
    pub(crate) shard_of: Option<(FlatLayout, usize)>,
}

impl BucketPlan {
    /// Each bucket all-reduced: every rank keeps every averaged gradient.
    pub(crate) fn whole(buckets: Vec<Vec<usize>>) -> Self {
        BucketPlan {
            buckets,
            shard_of: None,
        }
    }

    /// Each bucket reduce-scattered to the ranks that own its elements in `layout`; this
    /// rank is `rank`.
    pub(crate) fn sharded(buckets: Vec<Vec<usize>>, layout: FlatLayout, rank: usize) -> Self {
        BucketPlan {
            buckets,
            shard_of: Some((layout, rank)),
        }
    }
}

/// The flat range of a bucket under `layout` (its parameters are consecutive) and, for
/// each rank, how many of its elements that rank owns.
fn bucket_parts(layout: &FlatLayout, bucket: &[usize]) -> (std::ops::Range<usize>, Vec<usize>) {
    let (first, last) = (bucket.iter().min(), bucket.iter().max());
    let entries = layout.entries();
    let range = match (first, last) {
        (Some(&f), Some(&l)) => entries[f].offset..entries[l].range().end,
        _ => 0..0,
    };
    let parts = (0..layout.world_size())
        .map(|r| {
            let s = layout.shard(r);
            range
                .end
                .min(s.end)
                .saturating_sub(range.start.max(s.start))
        })
        .collect();
    (range, parts)
}

/// One backward's bucket reductions: the gradients handed over so far, and the buckets
/// issued.
pub(crate) struct BucketReduction {
    buckets: Vec<Vec<usize>>,
    shard_of: Option<(FlatLayout, usize)>,
    index: HashMap<TensorId, usize>,
    /// Each parameter's gradient (with what earlier micro-batches accumulated), once handed.
    grads: Vec<Option<Tensor>>,
    /// The parameters whose gradients are the earlier micro-batches' only, so far.
    pending: Vec<bool>,
    /// Zeros for a parameter no backward reached (as the blocking step uses).
    params: Vec<Var>,
    /// The issued buckets' results (the flat bucket, or this rank's part of it) and calls,
    /// in issue order.
    issued: Vec<(Tensor, Work)>,
    /// What failed inside backward's hook, kept with its type (a peer's failure stays one)
    /// where candle's error would carry its message only.
    failed: Option<wick_core::Error>,
}

impl BucketReduction {
    /// A reduction of `params`' gradients by `plan`, on top of `accumulated` (the earlier
    /// micro-batches' local sums, `None` where there are none).
    pub(crate) fn new(params: &[Var], plan: BucketPlan, accumulated: Vec<Option<Tensor>>) -> Self {
        let mut grads = accumulated;
        grads.resize(params.len(), None);
        BucketReduction {
            buckets: plan.buckets,
            shard_of: plan.shard_of,
            index: params
                .iter()
                .enumerate()
                .map(|(i, p)| (p.id(), i))
                .collect(),
            grads,
            pending: vec![true; params.len()],
            params: params.to_vec(),
            issued: Vec::new(),
            failed: None,
        }
    }

    /// Takes `var`'s complete gradient of this backward, and issues every bucket now full:
    /// backward's hook. A failure is kept for [`Self::failure`].
    pub(crate) fn ready(
        &mut self,
        world: &dyn Collective,
        var: &Tensor,
        grad: Tensor,
    ) -> candle_core::Result<()> {
        self.issue_full(world, var, grad).map_err(|e| {
            let message = e.to_string();
            self.failed = Some(e);
            candle_core::Error::Msg(message)
        })
    }

    /// The error of a backward whose hook failed: the hook's own, typed, if it failed there.
    pub(crate) fn failure(&mut self, backward: candle_core::Error) -> wick_core::Error {
        self.failed.take().unwrap_or(backward.into())
    }

    fn issue_full(&mut self, world: &dyn Collective, var: &Tensor, grad: Tensor) -> Result<()> {
        self.add(var, grad)?;
        while let Some(bucket) = self.buckets.get(self.issued.len()) {
            if bucket.iter().any(|&i| self.pending[i]) {
                break;
            }
            self.issue_next(world)?;
        }
        Ok(())
    }

    /// Adds a gradient that reached `var` outside the hook (after backward: a recomputed
    /// unit's, or all of them without the hook).
    fn add(&mut self, var: &Tensor, grad: Tensor) -> Result<()> {
        let Some(&i) = self.index.get(&var.id()) else {
            return Ok(());
        };
        self.pending[i] = false;
        self.grads[i] = Some(match self.grads[i].take() {
            Some(acc) => (acc + grad.contiguous()?)?,
            None => grad,
        });
        Ok(())
    }

    /// Issues the next bucket's reduction (mean) over its gradients flattened into one
    /// buffer: an all-reduce in place, or a reduce-scatter of its flat range.
    fn issue_next(&mut self, world: &dyn Collective) -> Result<()> {
        let mut bucket = self.buckets[self.issued.len()].clone();
        if self.shard_of.is_some() {
            // Registration order: the bucket's range of the flat layout.
            bucket.sort_unstable();
        }
        let parts = bucket
            .iter()
            // A gradient may be a view (a broadcast of `sum_all`'s scalar gradient has
            // stride 0 and fewer elements than it shows): the collectives take it whole.
            .map(|&i| match self.grads[i].take() {
                Some(g) => g.contiguous()?.flatten_all(),
                None => self.params[i].zeros_like()?.flatten_all(),
            })
            .collect::<candle_core::Result<Vec<_>>>()?;
        let issued = match &self.shard_of {
            None => {
                // A fresh buffer even for one gradient (where `cat` would hand back the
                // same storage): candle gives both operands of an add one shared
                // gradient, and the all-reduce works in place.
                let flat = match parts.as_slice() {
                    [one] => one.copy()?,
                    _ => Tensor::cat(&parts, 0)?,
                };
                let work = world.all_reduce_start(&flat, ReduceOp::Mean)?;
                (flat, work)
            }
            Some((layout, _)) => {
                // Read, not written: the flat buffer may share a gradient's storage.
                let flat = Tensor::cat(&parts, 0)?;
                let (_, owned) = bucket_parts(layout, &bucket);
                let mine = Tensor::zeros(owned[world.rank()], DType::F32, flat.device())?;
                let work =
                    world.reduce_scatter_parts_start(&flat, &mine, &owned, ReduceOp::Mean)?;
                (mine, work)
            }
        };
        self.issued.push(issued);
        Ok(())
    }

    /// Adds what backward left in `store` and in the recomputed units' stores, then issues
    /// every bucket not yet issued.
    pub(crate) fn issue_rest(
        &mut self,
        world: &dyn Collective,
        stores: impl IntoIterator<Item = GradStore>,
    ) -> Result<()> {
        for mut store in stores {
            for p in self.params.clone() {
                if let Some(g) = store.remove(p.as_tensor()) {
                    self.add(p.as_tensor(), g)?;
                }
            }
        }
        while self.issued.len() < self.buckets.len() {
            self.issue_next(world)?;
        }
        Ok(())
    }

    /// Waits for every bucket, in issue order, and returns the averaged gradients: each
    /// parameter's, or, when the plan shards them, this rank's range of the flat layout
    /// alone (one tensor). Waits for all of them even after one failed.
    pub(crate) fn wait(self) -> Result<Vec<Tensor>> {
        let mut first_error = None;
        let mut results = Vec::with_capacity(self.issued.len());
        for (result, work) in self.issued {
            match work.wait() {
                Ok(()) => results.push(result),
                Err(e) => {
                    first_error.get_or_insert(e);
                }
            }
        }
        if let Some(e) = first_error {
            return Err(e.into());
        }
        if let (Some((layout, rank)), Some(p)) = (&self.shard_of, self.params.first()) {
            let shard = assemble_shard(layout, *rank, &self.buckets, results, p.device())?;
            return Ok(vec![shard]);
        }
        let mut grads: Vec<Option<Tensor>> = vec![None; self.params.len()];
        for (bucket, flat) in self.buckets.iter().zip(results) {
            let mut offset = 0;
            for &i in bucket {
                let p = &self.params[i];
                let n = p.elem_count();
                grads[i] = Some(flat.narrow(0, offset, n)?.reshape(p.shape())?);
                offset += n;
            }
        }
        let grads = grads.into_iter().zip(&self.params).map(|(g, p)| match g {
            Some(g) => Ok(g),
            None => p.zeros_like(),
        });
        Ok(grads.collect::<candle_core::Result<_>>()?)
    }
}

/// Rank `rank`'s range of the flat layout, from its part of each bucket (`parts`, in
/// bucket order); zeros where no bucket reaches (the padding).
fn assemble_shard(
    layout: &FlatLayout,
    rank: usize,
    buckets: &[Vec<usize>],
    parts: Vec<Tensor>,
    device: &Device,
) -> Result<Tensor> {
    let own = layout.shard(rank);
    let shard = Tensor::zeros(own.len(), DType::F32, device)?;
    for (bucket, part) in buckets.iter().zip(parts) {
        if part.elem_count() > 0 {
            let (range, _) = bucket_parts(layout, bucket);
            shard.slice_set(&part, 0, range.start.max(own.start) - own.start)?;
        }
    }
    Ok(shard)
}

/// `loss.backward()`, handing each variable's gradient to `ready` as soon as it is complete
/// where the candle-core this builds against can (see the module's doc); otherwise every
/// gradient stays in the returned store.
pub(crate) fn backward_handing_over(
    loss: &Tensor,
    ready: &mut dyn FnMut(&Tensor, Tensor) -> candle_core::Result<()>,
) -> candle_core::Result<GradStore> {
    #[cfg(candle_backward_with_ready)]
    return loss.backward_with_ready(ready);
    #[cfg(not(candle_backward_with_ready))]
    {
        let _ = ready;
        loss.backward()
    }
}

/// Every bucket's reduction by `plan` at once, blocking: for gradients no backward reduced.
pub(crate) fn reduce_buckets(
    world: &dyn Collective,
    params: &[Var],
    plan: BucketPlan,
    grads: Vec<Tensor>,
) -> Result<Vec<Tensor>> {
    let mut reduction = BucketReduction::new(params, plan, grads.into_iter().map(Some).collect());
    reduction.issue_rest(world, [])?;
    reduction.wait()
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::Device;

    /// y = relu(x·w1)·w2 + b, loss = sum(y²): each variable's gradient is handed over once,
    /// equal to plain backward's, the last layer's before the first's.
    #[test]
    fn gradients_are_handed_over_complete_and_last_layer_first() -> candle_core::Result<()> {
        let dev = Device::Cpu;
        let var = |seed: f32, shape: (usize, usize)| {
            let n = shape.0 * shape.1;
            let v: Vec<f32> = (0..n).map(|i| ((i as f32 + seed) * 0.37).sin()).collect();
            Var::from_tensor(&Tensor::from_vec(v, shape, &dev)?)
        };
        let (w1, w2, b) = (var(1.0, (3, 4))?, var(2.0, (4, 2))?, var(3.0, (1, 2))?);
        let x = Tensor::from_vec((0..6).map(|i| i as f32 - 2.5).collect(), (2, 3), &dev)?;
        let loss = || -> candle_core::Result<Tensor> {
            let h = x.matmul(w1.as_tensor())?.relu()?;
            // b is used twice: its gradient is complete only after both uses.
            let y = h.matmul(w2.as_tensor())?.broadcast_add(b.as_tensor())?;
            y.sqr()?.sum_all()? + b.as_tensor().sum_all()?
        };
        let plain = loss()?.backward()?;
        let mut handed = Vec::new();
        let rest = backward_handing_over(&loss()?, &mut |var, grad| {
            handed.push((var.id(), grad));
            Ok(())
        })?;
        let ids = |vars: &[&Var]| vars.iter().map(|v| v.id()).collect::<Vec<_>>();
        let order: Vec<TensorId> = handed.iter().map(|(id, _)| *id).collect();
        if cfg!(candle_backward_with_ready) {
            assert_eq!(order, ids(&[&b, &w2, &w1]));
            for (v, (_, g)) in [&b, &w2, &w1].iter().zip(&handed) {
                let diff = (plain.get(v).unwrap() - g)?.abs()?.max_all()?;
                assert_eq!(diff.to_scalar::<f32>()?, 0.0);
                assert!(rest.get(v).is_none(), "handed over, not kept");
            }
        } else {
            assert!(order.is_empty());
            assert!(rest.get(&w1).is_some());
        }
        Ok(())
    }
}
