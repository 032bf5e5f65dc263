//! Ranks as processes (feature `mpi`): `MpiWorld`'s collectives against `ThreadWorld`'s, and
//! every strategy under `mpirun -np W` against the same strategy with W ranks as threads.
//!
//! `cargo test --features mpi --test mpi`. Started without a launcher, this binary starts
//! itself under `mpirun -np 1`, `2` and `4` and fails when any of those runs fails; started
//! by mpirun, it is one rank and runs the checks. A failed check prints what differs and
//! ends the whole job (`MPI_Abort`), so no rank waits for it.

#[allow(dead_code)] // the fixtures other test binaries use too
mod common;

use candle_core::{DType, Device, Tensor};
use common::{adamw, full_parameters, loader, max_diff, Mlp, SoloMlp};
use wick::accelerator::{Accelerator, LaunchEnv, MpiWorld, ThreadWorld};
use wick::core::{Collective, CollectiveExt, ReduceOp, Strategy};
use wick::strategies::{Fsdp, FsdpSharding, Precision};
use wick::trainer::{Attached, Metrics, Trainer};

const STEPS: usize = 10;

/// The argument that makes the ranks train with rank 1 failing at step 3.
const FAIL_RANK: &str = "fail-rank-1";

/// The argument that runs only the dropped calls (scripts/memcheck.sh runs them under
/// valgrind).
const DROPPED_CALLS: &str = "dropped-calls";

fn main() {
    // The failing rank's "rank R of W failed" is logged, as the program prints it.
    wick::TerminalLog::install();
    let failing = std::env::args().any(|a| a == FAIL_RANK);
    let dropped_only = std::env::args().any(|a| a == DROPPED_CALLS);
    match LaunchEnv::detect().expect("a readable launcher environment") {
        None => launch_self(),
        Some(_) if failing => fail_rank_1(),
        Some(_) if dropped_only => {
            let world = MpiWorld::process_world().expect("joining the MPI world");
            dropped_calls(&world);
            if world.rank() == 0 {
                println!("np {}: dropped calls completed", world.world_size());
            }
        }
        Some(_) => run_rank(),
    }
}

fn mpirun(np: usize) -> std::process::Command {
    let mut cmd = std::process::Command::new("mpirun");
    cmd.args(["--allow-run-as-root", "--oversubscribe", "-np"])
        .arg(np.to_string())
        .arg(std::env::current_exe().expect("the test binary's path"));
    cmd
}

/// Runs this binary under `mpirun -np W` for W = 1, 2, 4, then once with a failing rank.
fn launch_self() {
    let mut failed = 0;
    for np in [1, 2, 4] {
        let status = mpirun(np)
            .status()
            .expect("starting mpirun (install Open MPI: openmpi-bin)");
        println!("mpirun -np {np}: {status}");
        if !status.success() {
            failed += 1;
        }
    }
    if !a_failing_rank_ends_the_job() {
        failed += 1;
    }
    println!("{} passed, {failed} failed", 4 - failed);
    if failed > 0 {
        std::process::exit(1);
    }
}

/// Rank 1 returns an error mid-fit: every process must exit non-zero within 30 s, and the
/// error must name rank 1.
fn a_failing_rank_ends_the_job() -> bool {
    let start = std::time::Instant::now();
    let out = mpirun(2).arg(FAIL_RANK).output().expect("starting mpirun");
    let seconds = start.elapsed().as_secs_f64();
    let stderr = String::from_utf8_lossy(&out.stderr);
    let named = stderr.contains("rank 1 of 2 failed") && stderr.contains("injected failure");
    let ok = !out.status.success() && named && seconds < 30.0;
    println!(
        "mpirun -np 2 with rank 1 failing at step 3: {} after {seconds:.1} s, error names rank 1: {named}",
        out.status
    );
    if !ok {
        println!("its stderr:\n{stderr}");
    }
    ok
}

/// A callback that fails on rank 1 after step 3.
#[derive(Clone)]
struct FailOnRank1;

impl wick::core::Callback for FailOnRank1 {
    fn on_train_batch_end(&mut self, state: &wick::core::RunState) -> candle_core::Result<()> {
        if state.rank == 1 && state.global_step == 3 {
            candle_core::bail!("injected failure at step {}", state.global_step);
        }
        Ok(())
    }
}

fn fail_rank_1() {
    let mut trainer = Trainer::builder()
        .strategy("zero3")
        .max_steps(STEPS)
        .no_logger()
        .progress(false)
        .model_summary(false)
        .callback(FailOnRank1)
        .build()
        .unwrap();
    let outcome = trainer.fit(&mut Attached::new(Mlp::new(adamw())), &loader(), None);
    // Not reached under a launcher: the failing rank aborts the job.
    eprintln!("rank returned from a failed fit: {:?}", outcome.map(|_| ()));
    std::process::exit(0);
}

/// Ends the job with a message naming this rank when `ok` is false.
fn check(world: &MpiWorld, ok: bool, what: impl FnOnce() -> String) {
    if !ok {
        eprintln!("rank {}: FAILED: {}", world.rank(), what());
        world.abort(1);
    }
}

fn run_rank() {
    let world = MpiWorld::process_world().expect("joining the MPI world");
    let w = world.world_size();
    collectives(&world);
    dropped_calls(&world);
    launch_checks(&world);
    for (name, strategy) in strategies(w) {
        strategy_matches_threads(&world, &name, &strategy);
    }
    a_module_that_cannot_be_cloned_runs_as_processes(&world);
    if world.rank() == 0 {
        println!("np {w}: collectives, launch checks and every strategy passed");
    }
}

fn tensor(v: Vec<f32>) -> Tensor {
    Tensor::from_vec(v.clone(), v.len(), &Device::Cpu).unwrap()
}

fn values(rank: usize, len: usize) -> Vec<f32> {
    (0..len)
        .map(|i| (rank * 1000 + i) as f32 * 0.37 - 7.0)
        .collect()
}

/// The same calls on an `MpiWorld` and on a `ThreadWorld` of the same size: the outputs
/// must have the same bits (both sum in rank order), for uneven and empty shards and 16-bit
/// types.
fn collectives(world: &MpiWorld) {
    let (rank, w) = (world.rank(), world.world_size());
    let shard_len = |r: usize| r + 3;
    let total: usize = (0..w).map(shard_len).sum();
    let calls = |c: &dyn Collective, dtype: DType| -> Vec<Vec<f32>> {
        let r = c.rank();
        let f = |v: Vec<f32>| tensor(v).to_dtype(dtype).unwrap();
        let back = |t: &Tensor| t.to_dtype(DType::F32).unwrap().to_vec1::<f32>().unwrap();
        // First call on a new world (nothing allocated yet): a one-element all-reduce,
        // where some ranks reduce an empty chunk.
        let fresh = c.split(0).unwrap();
        let mut out = vec![vec![fresh
            .all_reduce_scalar(r as f32 + 0.25, ReduceOp::Sum)
            .unwrap()]];
        // Rank 0 holds an empty shard.
        let empty_first = |r: usize| if r == 0 { 0 } else { r };
        let total0: usize = (0..w).map(empty_first).sum();
        let full0 = Tensor::zeros(total0, dtype, &Device::Cpu).unwrap();
        c.all_gather_into(&f(values(r, empty_first(r))), &full0)
            .unwrap();
        let shard0 = Tensor::zeros(empty_first(r), dtype, &Device::Cpu).unwrap();
        c.reduce_scatter_into(&f(values(r, total0)), &shard0, ReduceOp::Sum)
            .unwrap();
        let nothing = f(Vec::new());
        c.all_reduce_in_place(&nothing, ReduceOp::Sum).unwrap();
        c.broadcast_in_place(&nothing, 0).unwrap();
        out.extend([back(&full0), back(&shard0), back(&nothing)]);
        let full = Tensor::zeros(total, dtype, &Device::Cpu).unwrap();
        c.all_gather_into(&f(values(r, shard_len(r))), &full)
            .unwrap();
        let started = Tensor::zeros(total, dtype, &Device::Cpu).unwrap();
        c.all_gather_start(&f(values(r, shard_len(r))), &started)
            .unwrap()
            .wait()
            .unwrap();
        out.extend([back(&full), back(&started)]);
        for op in [ReduceOp::Sum, ReduceOp::Mean] {
            let shard = Tensor::zeros(shard_len(r), dtype, &Device::Cpu).unwrap();
            c.reduce_scatter_into(&f(values(r, total)), &shard, op)
                .unwrap();
            let all = f(values(r, 11));
            c.all_reduce_in_place(&all, op).unwrap();
            out.extend([back(&shard), back(&all)]);
            // The same, started ahead: both in flight at once (their inputs dropped by the
            // caller), a blocking call between, and an empty shard on rank 0.
            let started = Tensor::zeros(shard_len(r), dtype, &Device::Cpu).unwrap();
            let scatter = c.reduce_scatter_start(&f(values(r, total)), &started, op);
            let all_started = f(values(r, 11));
            let reduce = c.all_reduce_start(&all_started, op);
            let started0 = Tensor::zeros(empty_first(r), dtype, &Device::Cpu).unwrap();
            let scatter0 = c.reduce_scatter_start(&f(values(r, total0)), &started0, op);
            c.barrier().unwrap();
            for work in [scatter, reduce, scatter0] {
                work.unwrap().wait().unwrap();
            }
            out.extend([back(&started), back(&all_started), back(&started0)]);
        }
        let b = f(values(r, 6));
        c.broadcast_in_place(&b, w - 1).unwrap();
        out.push(back(&b));
        // A sub-world of the even and of the odd ranks.
        let sub = c.split(r % 2).unwrap();
        let s = f(values(r, 5));
        sub.all_reduce_in_place(&s, ReduceOp::Sum).unwrap();
        out.push(back(&s));
        out.push(vec![c
            .all_reduce_scalar(r as f32 + 0.5, ReduceOp::Mean)
            .unwrap()]);
        c.barrier().unwrap();
        out
    };
    for dtype in [DType::F32, DType::BF16, DType::F16] {
        let mpi = calls(world, dtype);
        let threads = ThreadWorld::new(w)
            .run(|c| Ok::<_, String>(calls(&c, dtype)))
            .swap_remove(rank)
            .unwrap();
        check(world, mpi == threads, || {
            format!("{dtype:?} collectives differ from ThreadWorld:\nmpi     {mpi:?}\nthreads {threads:?}")
        });
    }
    // Bytes (a quantized base's blocks) are gathered, blocking and started, over uneven
    // shards, and broadcast; a reduction of bytes is refused on every rank alike.
    let bytes = |r: usize| -> Vec<u8> { (0..shard_len(r)).map(|i| (r * 50 + i) as u8).collect() };
    let want: Vec<u8> = (0..w).flat_map(bytes).collect();
    let mine = Tensor::new(bytes(rank), &Device::Cpu).unwrap();
    let full = Tensor::zeros(total, DType::U8, &Device::Cpu).unwrap();
    world.all_gather_into(&mine, &full).unwrap();
    let started = Tensor::zeros(total, DType::U8, &Device::Cpu).unwrap();
    world
        .all_gather_start(&mine, &started)
        .unwrap()
        .wait()
        .unwrap();
    let root = Tensor::new(vec![rank as u8; 5], &Device::Cpu).unwrap();
    world.broadcast_in_place(&root, w - 1).unwrap();
    let got = [&full, &started].map(|t| t.to_vec1::<u8>().unwrap());
    check(world, got == [want.clone(), want], || {
        format!("u8 gathers: {got:?}")
    });
    check(
        world,
        root.to_vec1::<u8>().unwrap() == vec![(w - 1) as u8; 5],
        || "u8 broadcast".into(),
    );
    let refused = world.all_reduce_in_place(&mine, ReduceOp::Sum);
    check(world, refused.is_err(), || {
        "a reduction of bytes ran".into()
    });
    let refused = world.all_reduce_start(&full, ReduceOp::Sum);
    check(world, refused.is_err(), || {
        "a started reduction of bytes ran".into()
    });
    world.barrier().unwrap();
    // Ranks that disagree get the same clear error, and the world stays usable.
    let t = tensor(values(rank, 4 + rank % 2));
    let e = world.all_reduce_in_place(&t, ReduceOp::Sum);
    check(world, w == 1 || e.is_err(), || {
        "unequal all_reduce lengths were accepted".into()
    });
    if let Err(e) = e {
        check(world, e.to_string().contains("different lengths"), || {
            e.to_string()
        });
    }
    let e = if rank == 0 {
        world.barrier()
    } else {
        world.broadcast_in_place(&tensor(vec![1.0]), 0)
    };
    check(world, w == 1 || e.is_err(), || {
        "a barrier met a broadcast".into()
    });
    world.barrier().unwrap();
}

/// Started calls dropped without `wait`, with their tensors: each completes before its
/// buffers go (a dropped all-gather's output is whole), and the world stays usable. Under
/// valgrind (`scripts/memcheck.sh`) a buffer freed under MPI would be an invalid write.
fn dropped_calls(world: &MpiWorld) {
    let (rank, w) = (world.rank(), world.world_size());
    let len = 1 << 15;
    let full = Tensor::zeros(len * w, DType::F32, &Device::Cpu).unwrap();
    drop(
        world
            .all_gather_start(&tensor(values(rank, len)), &full)
            .unwrap(),
    );
    let want: Vec<f32> = (0..w).flat_map(|r| values(r, len)).collect();
    check(world, full.to_vec1::<f32>().unwrap() == want, || {
        "a dropped all-gather had not completed".into()
    });
    for _ in 0..4 {
        let full = tensor(values(rank, len * w));
        let shard = Tensor::zeros(len, DType::F32, &Device::Cpu).unwrap();
        let started = world.reduce_scatter_start(&full, &shard, ReduceOp::Sum);
        drop((full, shard));
        drop(started.unwrap());
        let t = tensor(values(rank, len));
        let started = world.all_reduce_start(&t, ReduceOp::Sum);
        drop(t);
        drop(started.unwrap());
    }
    let sum = world.all_reduce_scalar(1.0, ReduceOp::Sum).unwrap();
    check(world, sum == w as f32, || {
        format!("after dropped calls: {sum}")
    });
}

/// The trainer under a launcher: `devices` must agree with the launcher's count, and
/// `Accelerator::cpu` still gives threads.
fn launch_checks(world: &MpiWorld) {
    let w = world.world_size();
    let e = Trainer::builder().devices(w + 1).build().err();
    let message = e.map(|e| e.to_string()).unwrap_or_default();
    check(
        world,
        message.contains(&format!("{} asked", w + 1)) && message.contains(&format!("started {w}")),
        || format!("--devices {} under mpirun -np {w}: {message:?}", w + 1),
    );
    let t = Trainer::builder().build().unwrap();
    check(
        world,
        t.world_size() == w && t.is_global_zero() == (world.rank() == 0),
        || format!("default devices: {}", t.world_size()),
    );
    let t = Trainer::builder()
        .accelerator(Accelerator::cpu(3).unwrap())
        .build()
        .unwrap();
    check(world, t.world_size() == 3 && t.is_global_zero(), || {
        "Accelerator::cpu(3)".into()
    });
    // A per-rank budget gives a launcher's process a pool of its own, too.
    let threads = Accelerator::from_env(None)
        .unwrap()
        .with_thread_budget(wick::accelerator::ThreadBudget::PerRank(1))
        .launch(|_| Ok::<_, wick::core::Error>(rayon::current_num_threads()));
    let threads: Vec<usize> = threads.into_iter().filter_map(Result::ok).collect();
    check(world, threads == [1], || {
        format!("--threads-per-rank 1 under mpirun: {threads:?} threads")
    });
}

type MakeStrategy = Box<dyn Fn() -> Box<dyn Strategy>>;

fn fsdp(sharding: &str, group: usize, precision: &str, prefetch: bool) -> MakeStrategy {
    let (sharding, precision) = (sharding.to_string(), precision.to_string());
    Box::new(move || {
        let sharding = sharding.parse::<FsdpSharding>().unwrap();
        let mut fsdp = Fsdp::new(sharding)
            .with_precision(precision.parse::<Precision>().unwrap())
            .unwrap()
            .with_prefetch(prefetch);
        if sharding == FsdpSharding::HybridShard {
            fsdp = fsdp.with_group_size(group).unwrap();
        }
        fsdp.build()
    })
}

/// The strategies to check at world size `w`.
fn strategies(w: usize) -> Vec<(String, MakeStrategy)> {
    let named = |name: &'static str| -> (String, MakeStrategy) {
        (
            name.into(),
            Box::new(move || wick::strategies::strategy_by_name(name).unwrap()),
        )
    };
    if w == 1 {
        return vec![named("single")];
    }
    let mut list = vec![
        named("ddp"),
        named("zero1"),
        named("zero2"),
        (
            // Buckets of one parameter: uneven reduce-scatters in flight during backward.
            "zero2 small buckets".into(),
            Box::new(|| Box::new(wick::strategies::Zero::stage2().with_bucket_cap_bytes(1))),
        ),
        named("zero3"),
        ("fsdp full_shard".into(), fsdp("full_shard", 1, "32", false)),
        (
            "fsdp full_shard prefetch".into(),
            fsdp("full_shard", 1, "32", true),
        ),
        (
            "fsdp shard_grad_op".into(),
            fsdp("shard_grad_op", 1, "32", false),
        ),
        (
            "fsdp full_shard bf16-mixed".into(),
            fsdp("full_shard", 1, "bf16-mixed", true),
        ),
    ];
    if w == 4 {
        list.push((
            "fsdp hybrid_shard 2x2".into(),
            fsdp("hybrid_shard", 2, "32", true),
        ));
    }
    list
}

/// A module that is not `Clone` trains under a launcher (no replica is made) and ends where
/// the cloneable MLP ends with threads.
fn a_module_that_cannot_be_cloned_runs_as_processes(world: &MpiWorld) {
    let w = world.world_size();
    let quiet = |b: wick::trainer::TrainerBuilder| {
        b.strategy("zero3")
            .max_steps(STEPS)
            .seed(42)
            .no_logger()
            .progress(false)
            .model_summary(false)
            .build()
            .unwrap()
    };
    let mut procs = quiet(Trainer::builder());
    let mut solo = Attached::new(SoloMlp::new(adamw()));
    procs.fit(&mut solo, &loader(), None).unwrap();
    let mut threads = quiet(Trainer::builder().accelerator(Accelerator::cpu(w).unwrap()));
    let mut mlp = Attached::new(Mlp::new(adamw()));
    threads.fit(&mut mlp, &loader(), None).unwrap();
    let diff = max_diff(
        &full_parameters(&mut procs, &mut solo),
        &full_parameters(&mut threads, &mut mlp),
    );
    check(world, diff <= 1e-6, || {
        format!("a module without Clone at np {w}: {diff} from threads")
    });
}

/// What one run ends with: parameters, fit/validate/test metrics, predictions.
struct Outcome {
    params: Vec<Vec<f32>>,
    metrics: Vec<Metrics>,
    predictions: Vec<Vec<f32>>,
}

fn run(accelerator: Option<Accelerator>, strategy: &MakeStrategy) -> Outcome {
    let mut builder = Trainer::builder()
        .strategy(strategy())
        .max_steps(STEPS)
        .seed(42)
        .no_logger()
        .progress(false)
        .model_summary(false);
    if let Some(a) = accelerator {
        builder = builder.accelerator(a);
    }
    let mut trainer = builder.build().unwrap();
    let mut model = Attached::new(Mlp::new(adamw()));
    let data = loader();
    let fit = trainer.fit(&mut model, &data, Some(&data)).unwrap();
    let val = trainer.validate(&mut model, &data).unwrap();
    let test = trainer.test(&mut model, &data).unwrap();
    let predictions = trainer
        .predict(&mut model, &data)
        .unwrap()
        .iter()
        .map(|p| p.to_vec1::<f32>().unwrap())
        .collect();
    Outcome {
        params: full_parameters(&mut trainer, &mut model),
        metrics: vec![fit, val, test],
        predictions,
    }
}

fn strategy_matches_threads(world: &MpiWorld, name: &str, strategy: &MakeStrategy) {
    let w = world.world_size();
    let mpi = run(None, strategy);
    let threads = run(Some(Accelerator::cpu(w).unwrap()), strategy);
    let diff = max_diff(&mpi.params, &threads.params);
    check(world, diff <= 1e-6, || {
        format!("{name} at np {w}: parameters differ from threads by {diff}")
    });
    for (m, t) in mpi.metrics.iter().zip(&threads.metrics) {
        let same = m.keys().eq(t.keys()) && m.iter().all(|(k, v)| (v - t[k]).abs() <= 1e-6);
        check(world, same && !m.is_empty(), || {
            format!("{name} at np {w}: metrics {m:?}, threads {t:?}")
        });
    }
    // Predictions are gathered to rank 0; the other processes get none.
    let want = if world.rank() == 0 {
        threads.predictions.len()
    } else {
        0
    };
    check(world, mpi.predictions.len() == want, || {
        format!(
            "{name}: {} prediction batches on rank {}",
            mpi.predictions.len(),
            world.rank()
        )
    });
    if world.rank() == 0 {
        let pdiff = max_diff(&mpi.predictions, &threads.predictions);
        check(world, pdiff <= 1e-6, || {
            format!("{name}: predictions differ by {pdiff}")
        });
        println!(
            "np {w}: {name} matches threads (max |diff|: parameters {diff:e}, predictions {pdiff:e})"
        );
    }
}
