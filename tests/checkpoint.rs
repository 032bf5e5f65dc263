//! Checkpoints: resume bit-identical at the same world size, reshard to another, consolidate
//! for plain candle, pretrained init by slices, ModelCheckpoint's keeping rules, crash safety.
//! Bad files are in `checkpoint_bad_input`.

use crate::common::{
    adamw, full_parameters, loader, max_diff, quiet_builder, sgd_momentum, Mlp, Regression, DIMS,
};
use candle_core::{DType, Device};
use candle_nn::VarBuilder;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use tempfile::TempDir;
use wick::core::{OptimizerConfig, PretrainedWeights, Strategy, WeightSource};
use wick::strategies::{strategy_by_name, Fsdp, FsdpSharding};
use wick::trainer::checkpoint::{Mode, SavePoint};
use wick::trainer::{consolidate, Attached, Checkpoint, DataLoader, ModelCheckpoint, Trainer};

pub(crate) fn trainer(
    devices: usize,
    strategy: Box<dyn Strategy>,
    steps: usize,
    checkpoint: Option<ModelCheckpoint>,
) -> Trainer {
    let builder = quiet_builder(devices, strategy, steps);
    match checkpoint {
        Some(c) => builder.checkpoint(c),
        None => builder,
    }
    .build()
    .unwrap()
}

pub(crate) fn named(name: &str) -> Box<dyn Strategy> {
    strategy_by_name(name).unwrap()
}

fn step_dir(root: &Path, step: usize) -> PathBuf {
    root.join(format!("step-{step:08}"))
}

/// Trains to `steps` (resuming from `from` if given, saving into `checkpoint` if given) and
/// returns the final parameters.
pub(crate) fn fit(
    data: &DataLoader<Regression>,
    (devices, strategy): (usize, Box<dyn Strategy>),
    optimizer: OptimizerConfig,
    steps: usize,
    from: Option<&Path>,
    checkpoint: Option<ModelCheckpoint>,
) -> Vec<Vec<f32>> {
    let mut model = Attached::new(Mlp::new(optimizer));
    let mut t = trainer(devices, strategy, steps, checkpoint);
    match from {
        Some(from) => t.fit_from(&mut model, data, None, from),
        None => t.fit(&mut model, data, None),
    }
    .unwrap();
    full_parameters(&mut t, &mut model)
}

/// The entries of `dir`, sorted.
pub(crate) fn names_in(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().to_string())
        .collect();
    names.sort();
    names
}

fn every(root: &Path, n: usize) -> Option<ModelCheckpoint> {
    Some(ModelCheckpoint::new(root).every_n_steps(n))
}

/// Every saved state (parameters and optimizer) of a checkpoint, by parameter and kind.
pub(crate) fn saved_state(dir: &Path) -> Vec<(String, Vec<f32>)> {
    use wick::core::StateReader;
    let c = Checkpoint::open(dir).unwrap();
    let kinds: Vec<String> = std::iter::once("param".to_string())
        .chain(c.optimizer_kinds())
        .collect();
    let params: Vec<(String, Vec<usize>)> = c
        .parameters()
        .map(|(n, s)| (n.to_string(), s.to_vec()))
        .collect();
    let mut out = Vec::new();
    for kind in &kinds {
        for (name, shape) in &params {
            let shape = candle_core::Shape::from(shape.clone());
            let n = shape.elem_count();
            let t = c.read(kind, &[(name.clone(), shape)], 0..n).unwrap();
            out.push((format!("{name}.{kind}"), t.to_vec1().unwrap()));
        }
    }
    out
}

#[test]
fn resume_at_the_same_world_size_is_bit_identical() {
    // 8 steps an epoch: resuming at step 6 crosses an epoch boundary.
    let cases = [
        (1, "single", adamw()),
        (2, "ddp", adamw()),
        (2, "zero1", adamw()),
        (2, "zero2", sgd_momentum()),
        (2, "zero3", adamw()),
        (2, "fsdp", adamw()),
    ];
    for (w, name, optimizer) in cases {
        let first = TempDir::new().unwrap();
        let whole = fit(
            &loader(),
            (w, named(name)),
            optimizer.clone(),
            12,
            None,
            every(first.path(), 6),
        );
        let second = TempDir::new().unwrap();
        let resumed = fit(
            &loader(),
            (w, named(name)),
            optimizer,
            12,
            Some(&step_dir(first.path(), 6)),
            Some(ModelCheckpoint::new(second.path())),
        );
        assert_eq!(whole, resumed, "{name} at W={w}: parameters");
        assert_eq!(
            saved_state(&step_dir(first.path(), 12)),
            saved_state(&step_dir(second.path(), 12)),
            "{name} at W={w}: optimizer state at the end"
        );
    }
}

#[test]
fn a_checkpoint_saved_at_4_ranks_continues_at_1_2_and_3() {
    let hybrid = || -> Box<dyn Strategy> { Fsdp::new(FsdpSharding::HybridShard).build() };
    type Make = fn() -> Box<dyn Strategy>;
    let cases: [(&str, Make); 6] = [
        ("zero3", || named("zero3")),
        ("fsdp", || named("fsdp")),
        ("ddp", || named("ddp")),
        ("zero1", || named("zero1")),
        ("zero2", || named("zero2")),
        ("fsdp_hybrid", hybrid),
    ];
    for (name, make) in cases {
        let root = TempDir::new().unwrap();
        fit(
            &loader(),
            (4, make()),
            adamw(),
            6,
            None,
            every(root.path(), 6),
        );
        let saved = step_dir(root.path(), 6);
        let at_4 = fit(&loader(), (4, make()), adamw(), 12, Some(&saved), None);
        for w in [1, 2, 3] {
            // The hybrid checkpoint continues under full sharding at sizes that do not split
            // into groups of 2.
            let strategy = match (name, w % 2) {
                ("fsdp_hybrid", 1) => named("fsdp"),
                _ => make(),
            };
            let at_w = fit(&loader(), (w, strategy), adamw(), 12, Some(&saved), None);
            let d = max_diff(&at_4, &at_w);
            assert!(d < 1e-5, "{name}: saved at 4, continued at {w}: {d}");
        }
    }
}

#[test]
fn a_checkpoint_saved_at_2_ranks_continues_at_8() {
    // Global batches of 24 split over 1, 2, 4 and 8 ranks; 4 steps an epoch.
    let data = DataLoader::new(Regression::new(96), 24);
    for name in ["zero3", "fsdp", "zero2"] {
        let root = TempDir::new().unwrap();
        fit(
            &data,
            (2, named(name)),
            adamw(),
            3,
            None,
            every(root.path(), 3),
        );
        let saved = step_dir(root.path(), 3);
        let at_2 = fit(&data, (2, named(name)), adamw(), 7, Some(&saved), None);
        let at_8 = fit(&data, (8, named(name)), adamw(), 7, Some(&saved), None);
        let d = max_diff(&at_2, &at_8);
        assert!(d < 1e-5, "{name}: saved at 2, continued at 8: {d}");
    }
}

#[test]
fn consolidated_weights_load_into_the_same_model_in_plain_candle() {
    let root = TempDir::new().unwrap();
    let mut model = Attached::new(Mlp::new(adamw()));
    let mut t = trainer(
        3,
        named("zero3"),
        5,
        Some(ModelCheckpoint::new(root.path())),
    );
    t.fit(&mut model, &loader(), None).unwrap();
    let trained = t.full_parameters(&mut model).unwrap();
    let out = root.path().join("model.safetensors");
    let files = consolidate(step_dir(root.path(), 5), &out, true).unwrap();
    assert_eq!(
        files,
        [out.clone(), root.path().join("model.optimizer.safetensors")]
    );

    // No wick code from here: candle-nn layers over the file.
    let vb =
        unsafe { VarBuilder::from_mmaped_safetensors(&[&out], DType::F32, &Device::Cpu) }.unwrap();
    for i in 0..3 {
        let layer = candle_nn::linear(DIMS[i], DIMS[i + 1], vb.pp(format!("l{i}"))).unwrap();
        let find = |n: String| trained.iter().find(|(m, _)| *m == n).unwrap().1.clone();
        let same = |a: &candle_core::Tensor, b: candle_core::Tensor| {
            a.flatten_all().unwrap().to_vec1::<f32>().unwrap()
                == b.flatten_all().unwrap().to_vec1::<f32>().unwrap()
        };
        assert!(
            same(layer.weight(), find(format!("l{i}.weight"))),
            "l{i}.weight"
        );
        assert!(
            same(layer.bias().unwrap(), find(format!("l{i}.bias"))),
            "l{i}.bias"
        );
    }
    let opt = candle_core::safetensors::load(
        root.path().join("model.optimizer.safetensors"),
        &Device::Cpu,
    )
    .unwrap();
    assert_eq!(opt.len(), 12, "exp_avg and exp_avg_sq of 6 parameters");
    assert_eq!(opt["l1.weight.exp_avg_sq"].dims(), [13, 7]);
}

/// Pretrained weights that count the elements each thread (rank) reads.
struct Counting {
    inner: PretrainedWeights,
    read: Mutex<Vec<(std::thread::ThreadId, String, usize)>>,
}

impl WeightSource for Counting {
    fn read(
        &self,
        name: &str,
        shape: &candle_core::Shape,
        range: std::ops::Range<usize>,
    ) -> candle_core::Result<Vec<f32>> {
        self.read.lock().unwrap().push((
            std::thread::current().id(),
            name.to_string(),
            range.len(),
        ));
        self.inner.read(name, shape, range)
    }
}

#[test]
fn pretrained_weights_initialise_every_strategy_and_sharded_ranks_read_only_their_slice() {
    let root = TempDir::new().unwrap();
    fit(
        &loader(),
        (2, named("fsdp")),
        adamw(),
        4,
        None,
        every(root.path(), 4),
    );
    let file = root.path().join("weights.safetensors");
    consolidate(step_dir(root.path(), 4), &file, false).unwrap();
    let expected: Vec<Vec<f32>> = {
        let tensors = candle_core::safetensors::load(&file, &Device::Cpu).unwrap();
        ["l0", "l1", "l2"]
            .iter()
            .flat_map(|l| [format!("{l}.weight"), format!("{l}.bias")])
            .map(|n| tensors[&n].flatten_all().unwrap().to_vec1().unwrap())
            .collect()
    };
    let numel: usize = expected.iter().map(Vec::len).sum();
    for (w, name, sharded) in [
        (1, "single", false),
        (3, "ddp", false),
        (3, "zero3", true),
        (4, "fsdp", true),
    ] {
        let weights = Arc::new(Counting {
            inner: PretrainedWeights::open(&[&file]).unwrap(),
            read: Mutex::default(),
        });
        let mut model = Mlp::new(adamw());
        model.weights = Some(weights.clone());
        let mut model = Attached::new(model);
        let mut t = trainer(w, named(name), 1, None);
        t.validate(&mut model, &loader()).unwrap();
        assert_eq!(
            full_parameters(&mut t, &mut model),
            expected,
            "{name} at W={w}"
        );
        let reads = weights.read.lock().unwrap();
        let total: usize = reads.iter().map(|r| r.2).sum();
        if sharded {
            // Each element is read once, by the rank that keeps it; no rank reads all of l1.
            assert_eq!(total, numel, "{name}");
            let l1_by_rank = |id| -> usize {
                reads
                    .iter()
                    .filter(|r| r.0 == id && r.1 == "l1.weight")
                    .map(|r| r.2)
                    .sum()
            };
            for (id, _, _) in reads.iter() {
                assert!(l1_by_rank(*id) < 91, "{name}: a rank read all of l1.weight");
            }
        } else {
            assert_eq!(
                total,
                w * numel,
                "{name}: every replica reads the whole model"
            );
        }
    }
}

#[test]
fn a_wrong_pretrained_file_is_refused_naming_the_tensor() {
    let root = TempDir::new().unwrap();
    let file = root.path().join("other.safetensors");
    // l0.weight transposed, and no other tensor.
    candle_core::Tensor::zeros((5, 7), DType::F32, &Device::Cpu)
        .unwrap()
        .save_safetensors("l0.weight", &file)
        .unwrap();
    let refused = |strategy: &str, devices: usize| {
        let mut model = Mlp::new(adamw());
        model.weights = Some(Arc::new(PretrainedWeights::open(&[&file]).unwrap()));
        let mut model = Attached::new(model);
        trainer(devices, named(strategy), 1, None)
            .validate(&mut model, &loader())
            .unwrap_err()
            .to_string()
    };
    // Under zero3 both ranks hold part of l0.weight, so whichever fails first names it.
    let err = refused("zero3", 2);
    assert!(
        err.contains("other.safetensors") && err.contains("'l0.weight'") && err.contains("[5, 7]"),
        "{err}"
    );
    std::fs::remove_file(&file).unwrap();
    candle_core::Tensor::zeros((7, 5), DType::F32, &Device::Cpu)
        .unwrap()
        .save_safetensors("l0.weight", &file)
        .unwrap();
    let err = refused("single", 1);
    assert!(
        err.contains("'l0.bias'") && err.contains("other.safetensors"),
        "{err}"
    );
}

#[test]
fn model_checkpoint_keeps_the_last_k_and_the_best_k_and_points_last_at_the_newest() {
    let root = TempDir::new().unwrap();
    let losses = Arc::new(Mutex::new(Vec::new()));
    #[derive(Clone)]
    struct Losses(Arc<Mutex<Vec<f64>>>);
    impl wick::core::Callback for Losses {
        fn on_train_batch_end(&mut self, s: &wick::core::RunState) -> candle_core::Result<()> {
            if s.rank == 0 {
                self.0.lock().unwrap().push(s.metrics["train_loss"]);
            }
            Ok(())
        }
    }
    let mc = ModelCheckpoint::new(root.path())
        .every_n_steps(1)
        .keep_last(2)
        .keep_best(1, "train_loss", Mode::Max);
    let mut t = Trainer::builder()
        .devices(2)
        .strategy("zero2")
        .max_steps(6)
        .no_logger()
        .progress(false)
        .model_summary(false)
        .checkpoint(mc)
        .callback(Losses(losses.clone()))
        .build()
        .unwrap();
    t.fit(&mut Attached::new(Mlp::new(adamw())), &loader(), None)
        .unwrap();
    let losses = losses.lock().unwrap();
    let worst = 1
        + (0..losses.len())
            .max_by(|&a, &b| losses[a].partial_cmp(&losses[b]).unwrap())
            .unwrap();
    let kept = names_in(root.path());
    let mut expected: Vec<String> = [worst, 5, 6]
        .iter()
        .map(|s| format!("step-{s:08}"))
        .chain(["last".to_string()])
        .collect();
    expected.sort();
    expected.dedup();
    assert_eq!(kept, expected);
    assert_eq!(
        std::fs::read_to_string(root.path().join("last")).unwrap(),
        "step-00000006"
    );
}

#[test]
fn a_save_interrupted_anywhere_leaves_the_previous_checkpoint_loadable_and_last() {
    let reference = fit(
        &loader(),
        (2, named("zero3")),
        adamw(),
        4,
        None,
        every(TempDir::new().unwrap().path(), 4),
    );
    // Blocking saves, and saves written in the background while steps 5 and 6 train: a
    // crash of the background write comes out at a later step or at the end of fit.
    let points = [
        SavePoint::RankFile { rank: 1 },
        SavePoint::Manifest,
        SavePoint::Commit,
    ];
    for (point, async_save) in points.into_iter().flat_map(|p| [(p, false), (p, true)]) {
        let root = TempDir::new().unwrap();
        let seen = Arc::new(AtomicUsize::new(0));
        let fault = {
            let seen = seen.clone();
            Arc::new(move |p: SavePoint| {
                // The second save (step 4) dies at `point`.
                if p == point && seen.fetch_add(1, Ordering::SeqCst) == 1 {
                    return Err(format!("killed at {p:?}"));
                }
                Ok(())
            })
        };
        let mc = ModelCheckpoint::new(root.path())
            .every_n_steps(2)
            .async_save(async_save)
            .with_fault_injection(fault);
        let err = trainer(2, named("zero3"), 6, Some(mc))
            .fit(&mut Attached::new(Mlp::new(adamw())), &loader(), None)
            .unwrap_err()
            .to_string();
        // The error names the file the save was writing.
        let file = match point {
            SavePoint::RankFile { rank } => format!("rank-{rank}.safetensors"),
            SavePoint::Manifest => "manifest.json".into(),
            SavePoint::Commit => "step-00000004".into(),
        };
        assert!(
            err.contains("killed at") && err.contains(&file),
            "{point:?} async {async_save}: {err}"
        );
        assert_eq!(
            std::fs::read_to_string(root.path().join("last")).unwrap(),
            "step-00000002",
            "{point:?}"
        );
        assert!(
            !step_dir(root.path(), 4).exists(),
            "{point:?}: a half checkpoint"
        );
        // The previous one loads, and training from it reaches the uninterrupted result.
        let resumed = fit(
            &loader(),
            (2, named("zero3")),
            adamw(),
            4,
            Some(&root.path().join("last")),
            None,
        );
        assert_eq!(resumed, reference, "{point:?}");
    }
}

#[test]
fn a_new_run_never_saves_into_another_runs_root() {
    let tmp = TempDir::new().unwrap();
    let root = tmp.path().join("ck");
    let run = |steps, from: Option<PathBuf>| {
        let mc = ModelCheckpoint::new(&root).every_n_steps(2).keep_last(2);
        let mut t = trainer(2, named("ddp"), steps, Some(mc));
        let mut model = Attached::new(Mlp::new(adamw()));
        match from {
            Some(from) => t.fit_from(&mut model, &loader(), None, from),
            None => t.fit(&mut model, &loader(), None),
        }
        .unwrap();
        t.checkpoint_dir().unwrap().to_path_buf()
    };
    assert_eq!(run(6, None), root);
    // A second run of 4 steps: a root of its own, the first run's left whole.
    let second = run(4, None);
    assert_eq!(second, tmp.path().join("ck-v1"));
    assert_eq!(names_in(&root), ["last", "step-00000004", "step-00000006"]);
    assert_eq!(
        std::fs::read_to_string(root.join("last")).unwrap(),
        "step-00000006"
    );
    assert_eq!(
        names_in(&second),
        ["last", "step-00000002", "step-00000004"]
    );
    // Resuming either run keeps saving in its own root.
    assert_eq!(run(8, Some(second.join("last"))), second);
    assert_eq!(
        names_in(&second),
        ["last", "step-00000006", "step-00000008"]
    );
    assert_eq!(run(8, Some(root.clone())), root);
    assert_eq!(names_in(&root), ["last", "step-00000006", "step-00000008"]);
    assert_eq!(names_in(tmp.path()), ["ck", "ck-v1"]);
}
