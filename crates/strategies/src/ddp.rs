//! `Ddp`: replicated parameters, gradients averaged over the ranks by bucketed all-reduce.
//!
//! Gradients are copied into flat buckets of about `bucket_cap_bytes`, filled in reverse
//! registration order (the order backward produces them, as in PyTorch's DDP), and each
//! bucket is one all-reduce. Every rank then applies the same update to the same
//! parameters, so replicas stay identical without a broadcast.

use crate::replicated::Replicated;
use candle_core::Tensor;
use wick_core::{ReduceOp, Result, ShardedContext, Sharding, Strategy};

/// PyTorch DDP's default bucket size.
const DEFAULT_BUCKET_CAP_BYTES: usize = 25 << 20;

/// Distributed data parallel.
pub struct Ddp {
    bucket_cap_bytes: usize,
    buckets: Vec<Vec<usize>>,
    state: Replicated,
}

impl Default for Ddp {
    fn default() -> Self {
        Ddp::new()
    }
}

impl Ddp {
    /// The registry name.
    pub const NAME: &'static str = "ddp";

    /// DDP with 25 MiB buckets.
    pub fn new() -> Self {
        Ddp {
            bucket_cap_bytes: DEFAULT_BUCKET_CAP_BYTES,
            buckets: Vec::new(),
            state: Replicated::default(),
        }
    }

    /// Sets the bucket size in bytes (a parameter larger than it gets a bucket of its own).
    pub fn with_bucket_cap_bytes(mut self, bytes: usize) -> Self {
        self.bucket_cap_bytes = bytes.max(1);
        self
    }

    /// The parameter indices of each bucket, in all-reduce order.
    pub fn buckets(&self) -> &[Vec<usize>] {
        &self.buckets
    }

    fn build_buckets(&mut self) {
        self.buckets.clear();
        let mut current = Vec::new();
        let mut bytes = 0;
        for (i, p) in self.state.params.iter().enumerate().rev() {
            let size = p.elem_count() * p.dtype().size_in_bytes();
            if !current.is_empty() && bytes + size > self.bucket_cap_bytes {
                self.buckets.push(std::mem::take(&mut current));
                bytes = 0;
            }
            current.push(i);
            bytes += size;
        }
        if !current.is_empty() {
            self.buckets.push(current);
        }
    }

    fn all_reduce_grads(&self, grads: &mut [Tensor]) -> Result<()> {
        let world = self.state.world(Self::NAME)?;
        for bucket in &self.buckets {
            let parts = bucket
                .iter()
                .map(|&i| grads[i].flatten_all())
                .collect::<candle_core::Result<Vec<_>>>()?;
            // A fresh buffer even for one gradient (where `cat` would hand back the same
            // storage): candle gives both operands of an add one shared gradient, and the
            // all-reduce below works in place.
            let flat = match parts.as_slice() {
                [one] => one.copy()?,
                _ => Tensor::cat(&parts, 0)?,
            };
            world.all_reduce_in_place(&flat, ReduceOp::Mean)?;
            let mut offset = 0;
            for &i in bucket {
                let n = grads[i].elem_count();
                grads[i] = flat.narrow(0, offset, n)?.reshape(grads[i].shape())?;
                offset += n;
            }
        }
        Ok(())
    }
}

impl Strategy for Ddp {
    crate::replicated::replicated_state_methods!();

    fn name(&self) -> &str {
        Self::NAME
    }

    fn for_new_rank(&self) -> Box<dyn Strategy> {
        Box::new(Ddp::new().with_bucket_cap_bytes(self.bucket_cap_bytes))
    }

    fn sharded_context(&mut self, seed: u64) -> Result<ShardedContext> {
        self.state.sharded_context(Self::NAME, seed)
    }

    fn finish_sharding(&mut self) -> Result<()> {
        self.state.finish_sharding(Self::NAME)?;
        self.build_buckets();
        Ok(())
    }

    fn optimizer_step(&mut self) -> Result<()> {
        let mut grads = self.state.take_grads()?;
        self.all_reduce_grads(&mut grads)?;
        self.state.apply(Self::NAME, grads)
    }

    fn save_state(&self) -> Result<wick_core::RankState> {
        self.state.save_replicated(Self::NAME)
    }

    fn load_state(&mut self, reader: &dyn wick_core::StateReader) -> Result<()> {
        self.state.load_replicated(Self::NAME, reader)
    }

    fn sharding(&self) -> Sharding {
        Sharding::default()
    }
}
