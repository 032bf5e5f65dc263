//! The small all-reduces of a training step, counted on a counting world: the strategy's
//! verdict on its reduced gradients (inf or NaN, and their norm) is one all-reduce where
//! the ranks hold disjoint parts and none where each holds them all, the step's loss is
//! one, and the ranks' stop vote (a callback's request, a preemption) is one.

use crate::common::{Mlp, Regression};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use wick::accelerator::{Accelerator, WorldLayer};
use wick::core::{
    Call, Callback, Collective, CollectiveError, OptimizerConfig, RunState, Strategy, Work,
};
use wick::strategies::{strategy_by_name, Fsdp, FsdpSharding};
use wick::trainer::{Attached, DataLoader, Trainer};
use wick_core::{CollectiveExt, Position};

const RANKS: usize = 4;
const STEPS: usize = 4;

/// A rank's world that counts its all-reduces of at most 3 elements (split worlds' too).
struct SmallAllReduces {
    inner: Arc<dyn Collective>,
    count: Arc<AtomicUsize>,
}

impl SmallAllReduces {
    fn note(&self, call: &Call<'_>) {
        if let Call::AllReduce { tensor, .. } = call {
            if tensor.elem_count() <= 3 {
                self.count.fetch_add(1, Ordering::SeqCst);
            }
        }
    }
}

impl Collective for SmallAllReduces {
    fn position(&self) -> Position {
        self.inner.position()
    }
    fn start(&self, call: Call<'_>) -> Result<Work, CollectiveError> {
        self.note(&call);
        self.inner.start(call)
    }
    fn run(&self, call: Call<'_>) -> Result<(), CollectiveError> {
        self.note(&call);
        self.inner.run(call)
    }
    fn split(&self, color: usize) -> Result<Arc<dyn Collective>, CollectiveError> {
        Ok(Arc::new(SmallAllReduces {
            inner: self.inner.split(color)?,
            count: self.count.clone(),
        }))
    }
}

/// Reads each rank's count at the end of every step: (rank, count).
#[derive(Clone)]
struct Reader {
    counts: Arc<Vec<Arc<AtomicUsize>>>,
    seen: Arc<Mutex<Vec<(usize, usize)>>>,
}

impl Callback for Reader {
    fn on_train_batch_end(&mut self, state: &RunState) -> candle_core::Result<()> {
        let count = self.counts[state.rank].load(Ordering::SeqCst);
        self.seen.lock().unwrap().push((state.rank, count));
        Ok(())
    }
}

/// The small all-reduces of each step after the first, on every rank, fitting the MLP
/// under `strategy` with a callback (so that the ranks vote after each step).
fn per_step(strategy: Box<dyn Strategy>) -> Vec<usize> {
    let counts: Arc<Vec<Arc<AtomicUsize>>> = Arc::new((0..RANKS).map(|_| Arc::default()).collect());
    let layer = {
        let counts = counts.clone();
        WorldLayer::new(move |inner| {
            let count = counts[inner.rank()].clone();
            Arc::new(SmallAllReduces { inner, count }) as Arc<dyn Collective>
        })
    };
    let reader = Reader {
        counts,
        seen: Arc::default(),
    };
    let mut trainer = Trainer::builder()
        .accelerator(Accelerator::cpu(RANKS).unwrap().with_world_layer(layer))
        .strategy(strategy)
        .max_steps(STEPS)
        .seed(7)
        .no_logger()
        .progress(false)
        .model_summary(false)
        .callback(reader.clone())
        .build()
        .unwrap();
    let mut module = Attached::new(Mlp::new(OptimizerConfig::sgd(0.1)));
    let data = DataLoader::new(Regression::new(64), 16);
    trainer.fit(&mut module, &data, None).unwrap();
    let seen = reader.seen.lock().unwrap();
    (0..RANKS)
        .flat_map(|r| {
            let at: Vec<usize> = seen
                .iter()
                .filter(|(rank, _)| *rank == r)
                .map(|(_, c)| *c)
                .collect();
            assert_eq!(at.len(), STEPS, "rank {r} ended every step");
            at.windows(2).map(|w| w[1] - w[0]).collect::<Vec<_>>()
        })
        .collect()
}

#[test]
fn a_step_makes_one_small_all_reduce_for_the_loss_one_for_the_vote_and_one_for_sharded_gradients() {
    // Every rank holds the whole reduced gradients: the loss and the vote.
    for name in ["ddp", "zero1"] {
        let counts = per_step(strategy_by_name(name).unwrap());
        assert!(counts.iter().all(|&c| c == 2), "{name}: {counts:?}");
    }
    // Disjoint gradient shards: their inf-or-NaN check and their norm share one more.
    let hybrid = || {
        Fsdp::new(FsdpSharding::HybridShard)
            .with_group_size(2)
            .unwrap()
            .build()
    };
    let sharded: [(&str, Box<dyn Strategy>); 4] = [
        ("zero2", strategy_by_name("zero2").unwrap()),
        ("zero3", strategy_by_name("zero3").unwrap()),
        ("fsdp", strategy_by_name("fsdp").unwrap()),
        ("hybrid_shard", hybrid()),
    ];
    for (name, strategy) in sharded {
        let counts = per_step(strategy);
        assert!(counts.iter().all(|&c| c == 3), "{name}: {counts:?}");
    }
}
