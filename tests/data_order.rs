//! Exact resume at any world size: a run stopped mid-epoch at W = 2 and resumed at W = 4,
//! then at W = 3, trains on exactly the global batches of the uninterrupted run, in order,
//! across epoch boundaries; with gradient accumulation; and over a packed token file. Each
//! rank records the rows of every micro-batch it trains on; a global batch is the ranks'
//! rows in rank order.

use candle_core::{DType, Device, Tensor};
use std::collections::BTreeMap;
use std::path::Path;
use std::sync::{Arc, Mutex};
use tempfile::TempDir;
use wick::core::{OptimizerConfig, ShardedContext, TokenBatch, TrainModule, Wrapped};
use wick::strategies::strategy_by_name;
use wick::trainer::{
    write_token_file, Attached, DataLoader, Dataset, ModelCheckpoint, Packing, Split, TokenDataset,
    TokenSplit, Trainer,
};

/// Every micro-batch each rank trained on, in order: rank -> micro-batches -> rows.
type Seen = Arc<Mutex<BTreeMap<usize, Vec<Vec<Vec<u32>>>>>>;

/// A module that records the rows of each batch it trains on; its loss moves one
/// parameter, so that the strategies have something to step. That parameter's gradient is a
/// broadcast view of one scalar (stride 0, what `sum_all`'s backward gives), which ddp,
/// zero1 and zero2 once handed to their collectives as it was: an error.
#[derive(Clone)]
struct Recorder {
    seen: Seen,
    rank: usize,
    weight: Option<Wrapped<Tensor>>,
}

impl TrainModule for Recorder {
    type Batch = TokenBatch;

    fn configure_sharded_model(&mut self, ctx: &ShardedContext) -> candle_core::Result<()> {
        self.rank = ctx.rank();
        self.weight = Some(ctx.wrap("w", |vb| {
            vb.get_with_hints(4, "weight", candle_nn::Init::Const(0.5))
        })?);
        Ok(())
    }

    fn configure_optimizers(&self) -> OptimizerConfig {
        OptimizerConfig::adamw(1e-3)
    }

    fn training_step(&mut self, batch: &TokenBatch, _: usize) -> candle_core::Result<Tensor> {
        let rows: Vec<Vec<u32>> = batch.ids.to_vec2()?;
        // Released before the unit's collectives, which wait for the other ranks.
        (self.seen.lock().unwrap().entry(self.rank).or_default()).push(rows);
        let x = batch.ids.to_dtype(DType::F32)?;
        let weight = self.weight.as_ref().expect("configured");
        weight.apply(&x, |w, x| x.mean_all()?.broadcast_mul(&w.sum_all()?))
    }
}

/// Samples that are their own index: a row of one id.
struct Indices(usize);

impl Dataset for Indices {
    type Batch = TokenBatch;

    fn len(&self) -> usize {
        self.0
    }

    fn batch(&self, idx: &[usize], dev: &Device) -> candle_core::Result<TokenBatch> {
        let ids: Vec<u32> = idx.iter().map(|&i| i as u32).collect();
        let ids = Tensor::from_vec(ids, (idx.len(), 1), dev)?;
        Ok(TokenBatch::new(ids.clone(), ids))
    }
}

/// Trains from `from` (or afresh) to `steps` on `devices` ranks under `strategy`, accumulating
/// `accumulate` global batches a step, saving every `save_every` steps into `save`; the
/// global micro-batches it trained on, in order.
fn run<D: Dataset<Batch = TokenBatch>>(
    data: &DataLoader<D>,
    (strategy, devices, accumulate): (&str, usize, usize),
    steps: usize,
    from: Option<&Path>,
    save: (&Path, usize),
) -> Vec<Vec<Vec<u32>>> {
    let seen = Seen::default();
    let mut t = Trainer::builder()
        .devices(devices)
        .strategy(strategy_by_name(strategy).unwrap())
        .max_steps(steps)
        .accumulate_grad_batches(accumulate)
        .checkpoint(ModelCheckpoint::new(save.0).every_n_steps(save.1))
        .no_logger()
        .progress(false)
        .model_summary(false)
        .build()
        .unwrap();
    let mut m = Attached::new(Recorder {
        seen: seen.clone(),
        rank: 0,
        weight: None,
    });
    match from {
        Some(from) => t.fit_from(&mut m, data, None, from),
        None => t.fit(&mut m, data, None),
    }
    .unwrap();
    let seen = seen.lock().unwrap();
    let calls = seen[&0].len();
    assert!(seen.values().all(|r| r.len() == calls), "ranks ran alike");
    (0..calls)
        .map(|i| seen.values().flat_map(|r| r[i].clone()).collect())
        .collect()
}

/// The micro-batches of the uninterrupted run at W = 2 against those of a run stopped at
/// `cuts[0]` (W = 2), resumed to `cuts[1]` at W = 4, then to `steps` at W = 3.
fn resumed_sees_the_same<D: Dataset<Batch = TokenBatch>>(
    data: &DataLoader<D>,
    (strategy, accumulate): (&str, usize),
    cuts: [usize; 2],
    steps: usize,
) -> usize {
    let dir = TempDir::new().unwrap();
    let at = |w| (strategy, w, accumulate);
    let whole = run(data, at(2), steps, None, (&dir.path().join("whole"), steps));
    let ck = |step: usize| dir.path().join(format!("parts/step-{step:08}"));
    let parts = dir.path().join("parts");
    let mut pieces = run(data, at(2), cuts[0], None, (&parts, cuts[0]));
    pieces.extend(run(
        data,
        at(4),
        cuts[1],
        Some(&ck(cuts[0])),
        (&parts, cuts[1]),
    ));
    pieces.extend(run(data, at(3), steps, Some(&ck(cuts[1])), (&parts, steps)));
    assert_eq!(whole.len(), steps * accumulate);
    assert_eq!(pieces, whole, "the resumed runs saw other batches");
    whole.len()
}

#[test]
fn a_run_resumed_at_4_then_3_ranks_sees_the_uninterrupted_global_batches() {
    // 50 samples in shuffled global batches of 12: 4 batches an epoch (2 samples dropped),
    // epochs 0, 1 and 2 in 10 steps; stops mid-epoch at steps 3 and 7, each resumed run
    // crossing an epoch boundary.
    let data = DataLoader::new(Indices(50), 12);
    let mut n = 0;
    for strategy in ["ddp", "zero2", "zero3", "fsdp"] {
        n = resumed_sees_the_same(&data, (strategy, 1), [3, 7], 10);
    }
    // The order is shuffled and differs by epoch: the check could fail.
    let seen = run(
        &data,
        ("single", 1, 1),
        8,
        None,
        (TempDir::new().unwrap().path(), 8),
    );
    assert_ne!(seen[0], seen[4], "epochs 0 and 1 start alike");
    assert_ne!(seen[0].concat(), (0..12).collect::<Vec<u32>>());
    println!("{n} global batches, in order, across two resumes at W = 4 and 3, every strategy");
}

#[test]
fn with_gradient_accumulation_a_resumed_run_sees_the_same_micro_batches() {
    // Two global batches a step: 2 steps an epoch; stops at steps 1 and 3, mid-epoch.
    let data = DataLoader::new(Indices(50), 12);
    for strategy in ["ddp", "zero2"] {
        resumed_sees_the_same(&data, (strategy, 2), [1, 3], 6);
    }
}

#[test]
fn over_packed_windows_a_resumed_run_sees_the_same_windows() {
    // 150 documents of 2 to 14 tokens, each token its document's number, packed whole into
    // windows of 16: each window's rows name its documents.
    let dir = TempDir::new().unwrap();
    let path = dir.path().join("docs.safetensors");
    let (mut ids, mut starts) = (Vec::new(), Vec::new());
    for d in 0..150u32 {
        starts.push(ids.len() as u64);
        ids.extend(std::iter::repeat_n(d, 2 + (d as usize * 7) % 13));
    }
    let counted = vec![true; ids.len()];
    let split = TokenSplit {
        ids: &ids,
        counted: Some(&counted),
        starts: Some(&starts),
    };
    write_token_file(&path, split, split, "abc", 1000).unwrap();
    let windows = TokenDataset::open(&path, Split::Train, 16).unwrap();
    assert_eq!(windows.packing(), Packing::Documents);
    let per_epoch = windows.len() / 12;
    assert!(per_epoch >= 3, "{} windows", windows.len());
    let data = DataLoader::new(windows, 12);
    let cuts = [per_epoch - 1, per_epoch + 2];
    let n = resumed_sees_the_same(&data, ("fsdp", 1), cuts, 2 * per_epoch + 1);
    println!("{n} packed global batches, in order, across two resumes at W = 4 and 3");
}
