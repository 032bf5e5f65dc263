//! Datasets and the distributed split of each global batch over the ranks.

use super::EpochOrder;
use crate::TrainerError;
use candle_core::Device;

/// Samples addressed by index, turned into a module's batches.
pub trait Dataset: Sync {
    /// What one batch looks like (the module's `Batch`).
    type Batch;

    /// The number of samples.
    fn len(&self) -> usize;

    /// Whether there are no samples.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The batch made of the samples `indices`, in that order, on `device`.
    fn batch(&self, indices: &[usize], device: &Device) -> candle_core::Result<Self::Batch>;

    /// Tokens in one sample, for the `tokens_per_s` the trainer logs (default 1: a sample
    /// is a token). A dataset of sequences returns their length.
    fn tokens_per_sample(&self) -> usize {
        1
    }
}

/// A dataset with a global batch size, like a DataLoader with a DistributedSampler.
///
/// Each epoch's order is a permutation seeded by (seed, epoch) (or the identity without
/// shuffle); it is cut into global batches, and each global batch into W equal, disjoint
/// slices: rank r takes slice r. Concatenating the ranks' slices gives the global batch of
/// one device.
///
/// Training drops an incomplete last batch, so that every step sees a whole global batch
/// (PyTorch's `drop_last=True`). Evaluation (validate, test, predict) covers every sample,
/// as Lightning's evaluation loaders do: the short last batch is split over the ranks as
/// evenly as it goes ([`DataLoader::eval_slice`]).
///
/// An epoch's order is computed a sample at a time ([`EpochOrder`]), so it takes no memory
/// of the dataset's size.
pub struct DataLoader<D> {
    dataset: D,
    batch_size: usize,
    shuffle: bool,
}

impl<D: Dataset> DataLoader<D> {
    /// Batches of `global_batch_size` samples, shuffled every epoch.
    pub fn new(dataset: D, global_batch_size: usize) -> Self {
        DataLoader {
            dataset,
            batch_size: global_batch_size,
            shuffle: true,
        }
    }

    /// Keeps the dataset's order (for evaluation).
    pub fn without_shuffle(mut self) -> Self {
        self.shuffle = false;
        self
    }

    /// The dataset.
    pub fn dataset(&self) -> &D {
        &self.dataset
    }

    /// The global batch size.
    pub fn batch_size(&self) -> usize {
        self.batch_size
    }

    /// Global batches per training epoch (an incomplete last batch is dropped).
    pub fn batches_per_epoch(&self) -> usize {
        self.dataset.len() / self.batch_size.max(1)
    }

    /// Global batches of an evaluation pass: every sample, the last batch possibly short.
    pub fn eval_batches(&self) -> usize {
        self.dataset.len().div_ceil(self.batch_size.max(1))
    }

    /// Rank `rank`'s part of evaluation batch `batch` of `order`: its samples, and how many
    /// of them count. A whole batch is [`DataLoader::rank_slice`]. The short last batch is
    /// split in rank order, the first ranks taking one sample more; a rank left without a
    /// sample runs the batch's last one and counts none, so that every rank runs the same
    /// steps, and with them the same collectives.
    pub fn eval_slice(
        &self,
        order: &EpochOrder,
        batch: usize,
        rank: usize,
        world_size: usize,
    ) -> (Vec<usize>, usize) {
        let start = batch * self.batch_size;
        let n = self.batch_size.min(order.len() - start);
        if n == self.batch_size {
            let slice = self.rank_slice(order, batch, rank, world_size);
            let count = slice.len();
            return (slice, count);
        }
        let (base, extra) = (n / world_size, n % world_size);
        let own = base + usize::from(rank < extra);
        match own {
            0 => (order.slice(start + n - 1..start + n), 0),
            _ => {
                let at = start + rank * base + rank.min(extra);
                (order.slice(at..at + own), own)
            }
        }
    }

    /// Checks that the batches can be split over `world_size` ranks and that there is data.
    /// (Training also needs one whole global batch; the trainer checks that.)
    pub fn check(&self, world_size: usize) -> Result<(), TrainerError> {
        if self.batch_size == 0 {
            return Err(TrainerError::config(
                "batch size",
                "must be at least 1, got 0",
            ));
        }
        if !self.batch_size.is_multiple_of(world_size) {
            return Err(TrainerError::config(
                "batch size",
                format!(
                    "global batch size {} does not divide by {world_size} ranks; use a multiple of {world_size}",
                    self.batch_size
                ),
            ));
        }
        if self.dataset.is_empty() {
            return Err(TrainerError::config("dataset", "has no samples"));
        }
        Ok(())
    }

    /// The sample order of `epoch`: the same on every rank, computed from (seed, epoch).
    pub fn epoch_order(&self, seed: u64, epoch: usize) -> EpochOrder {
        let len = self.dataset.len();
        if self.shuffle {
            EpochOrder::shuffled(
                len,
                seed ^ (epoch as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15),
            )
        } else {
            EpochOrder::in_order(len)
        }
    }

    /// Rank `rank`'s slice of global batch `batch` of `order`.
    pub fn rank_slice(
        &self,
        order: &EpochOrder,
        batch: usize,
        rank: usize,
        world_size: usize,
    ) -> Vec<usize> {
        let per_rank = self.batch_size / world_size;
        let start = batch * self.batch_size + rank * per_rank;
        order.slice(start..start + per_rank)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Range(usize);
    impl Dataset for Range {
        type Batch = Vec<usize>;
        fn len(&self) -> usize {
            self.0
        }
        fn batch(&self, indices: &[usize], _: &Device) -> candle_core::Result<Vec<usize>> {
            Ok(indices.to_vec())
        }
    }

    #[test]
    fn rank_slices_partition_each_global_batch() {
        let loader = DataLoader::new(Range(50), 12);
        let order = loader.epoch_order(7, 3);
        for b in 0..loader.batches_per_epoch() {
            let joined: Vec<usize> = (0..4)
                .flat_map(|r| loader.rank_slice(&order, b, r, 4))
                .collect();
            assert_eq!(joined, order.slice(b * 12..(b + 1) * 12));
        }
    }

    #[test]
    fn evaluation_covers_every_sample_once_at_any_world_size() {
        for (len, batch, world) in [(50, 12, 4), (50, 12, 3), (13, 4, 4), (2, 8, 4), (24, 12, 2)] {
            let loader = DataLoader::new(Range(len), batch).without_shuffle();
            let order = loader.epoch_order(0, 0);
            let mut counted = Vec::new();
            for b in 0..loader.eval_batches() {
                for r in 0..world {
                    let (idx, count) = loader.eval_slice(&order, b, r, world);
                    assert!(!idx.is_empty(), "every rank runs every batch");
                    assert!(count == idx.len() || count == 0);
                    counted.extend_from_slice(&idx[..count]);
                }
            }
            assert_eq!(
                counted,
                (0..len).collect::<Vec<_>>(),
                "{len} {batch} {world}"
            );
        }
    }

    #[test]
    fn shuffle_depends_on_seed_and_epoch_only() {
        let loader = DataLoader::new(Range(100), 10);
        assert_eq!(loader.epoch_order(1, 0), loader.epoch_order(1, 0));
        assert_ne!(loader.epoch_order(1, 0), loader.epoch_order(1, 1));
        assert_ne!(loader.epoch_order(1, 0), loader.epoch_order(2, 0));
        let mut sorted = loader.epoch_order(1, 0).slice(0..100);
        sorted.sort();
        assert_eq!(sorted, (0..100).collect::<Vec<_>>());
    }

    #[test]
    fn bad_batch_sizes_are_explained() {
        let e = DataLoader::new(Range(100), 10)
            .check(4)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("global batch size 10 does not divide by 4 ranks"),
            "{e}"
        );
        let e = DataLoader::new(Range(0), 4)
            .check(2)
            .unwrap_err()
            .to_string();
        assert!(e.contains("no samples"), "{e}");
        assert!(
            DataLoader::new(Range(3), 4).check(2).is_ok(),
            "evaluation covers it"
        );
    }
}
