//! Collective bandwidth: all-gather and reduce-scatter of 1, 16 and 64 MiB at W = 2 and 4,
//! with ranks as threads (`ThreadWorld`), as processes (`MpiWorld`), and Open MPI's own
//! speed (rsmpi called directly on plain f32 buffers), all from this one binary.
//!
//! `cargo run --release --features mpi --example collective_bandwidth`
//!
//! Started without a launcher it measures the thread engine, then starts itself under
//! `mpirun -np W` for the MPI engines (without the `mpi` feature: threads only). Each
//! measurement is one line:
//! `engine=<mpi|mpi-raw|thread> op=<all_gather|reduce_scatter> world=<W> bytes=<S> gbps=<algbw>`,
//! where S is the full buffer's size and algbw = S / time in 10^9 bytes per second (as
//! nccl-tests counts it); the time of a call is the slowest rank's median over the repeats,
//! `mpi` and `mpi-raw` taking turns call by call.
//! Lines starting with `#` give MpiWorld's speed as a fraction of Open MPI's on plain
//! buffers, and, for all-gather, the same fraction when Open MPI's call runs on the very
//! tensors MpiWorld used (what is left when the buffers' memory is the same).

use candle_core::{DType, Device, Tensor};
use std::time::Instant;
use wick::accelerator::ThreadWorld;
use wick::core::{Collective, CollectiveExt, ReduceOp};

const SIZES: [usize; 3] = [1 << 20, 16 << 20, 64 << 20];
const WORLDS: [usize; 2] = [2, 4];

/// Repeats of a call (after one warm-up): more for small buffers.
fn repeats(bytes: usize) -> usize {
    (64 << 20) / bytes * 4 + 40
}

/// The median seconds per call of each of `calls` on this rank. The calls take turns, each
/// started together by `sync`, so that a slow moment of the machine falls on all of them.
fn seconds_per_call(bytes: usize, sync: &dyn Fn(), calls: &mut [&mut dyn FnMut()]) -> Vec<f64> {
    let mut times = vec![Vec::new(); calls.len()];
    for i in 0..=repeats(bytes) {
        for (call, t) in calls.iter_mut().zip(times.iter_mut()) {
            sync();
            let start = Instant::now();
            call();
            if i > 0 {
                t.push(start.elapsed().as_secs_f64());
            }
        }
    }
    times
        .into_iter()
        .map(|mut t| {
            t.sort_by(f64::total_cmp);
            t[t.len() / 2]
        })
        .collect()
}

fn line(engine: &str, op: &str, world: usize, bytes: usize, seconds: f64) -> f64 {
    let gbps = bytes as f64 / seconds / 1e9;
    println!("engine={engine} op={op} world={world} bytes={bytes} gbps={gbps:.3}");
    gbps
}

/// The buffers of one size: the full buffer and a rank's shard.
fn buffers(bytes: usize, w: usize) -> (Tensor, Tensor) {
    let n = bytes / 4;
    (
        Tensor::ones(n, DType::F32, &Device::Cpu).unwrap(),
        Tensor::ones(n / w, DType::F32, &Device::Cpu).unwrap(),
    )
}

fn gather(c: &dyn Collective, full: &Tensor, shard: &Tensor) {
    c.all_gather_into(shard, full).unwrap()
}

fn reduce_scatter(c: &dyn Collective, full: &Tensor, shard: &Tensor) {
    c.reduce_scatter_into(full, shard, ReduceOp::Sum).unwrap()
}

/// Both collectives through the `Collective` trait; (op, bytes, seconds) on this rank, the
/// slowest rank's time taken by the caller.
fn measure_world(c: &dyn Collective) -> Vec<(&'static str, usize, f64)> {
    let sync = || c.barrier().expect("barrier");
    let mut out = Vec::new();
    for bytes in SIZES {
        let (full, shard) = buffers(bytes, c.world_size());
        let s = seconds_per_call(bytes, &sync, &mut [&mut || gather(c, &full, &shard)]);
        out.push(("all_gather", bytes, s[0]));
        let s = seconds_per_call(
            bytes,
            &sync,
            &mut [&mut || reduce_scatter(c, &full, &shard)],
        );
        out.push(("reduce_scatter", bytes, s[0]));
    }
    out
}

fn thread_engine(w: usize) {
    let per_rank: Vec<Vec<(&str, usize, f64)>> = ThreadWorld::new(w)
        .run(|c| Ok::<_, String>(measure_world(&c)))
        .into_iter()
        .map(|r| r.expect("no rank fails"))
        .collect();
    for (i, &(op, bytes, _)) in per_rank[0].iter().enumerate() {
        let slowest = per_rank.iter().map(|r| r[i].2).fold(0.0, f64::max);
        line("thread", op, w, bytes, slowest);
    }
}

fn main() {
    #[cfg(feature = "mpi")]
    if wick::accelerator::LaunchEnv::detect()
        .expect("a readable launcher environment")
        .is_some()
    {
        return mpi::engines();
    }
    for w in WORLDS {
        thread_engine(w);
    }
    #[cfg(feature = "mpi")]
    for w in WORLDS {
        let status = std::process::Command::new("mpirun")
            .args([
                "--allow-run-as-root",
                "--oversubscribe",
                "-np",
                &w.to_string(),
            ])
            .arg(std::env::current_exe().expect("this program's path"))
            .status()
            .expect("starting mpirun (Open MPI's openmpi-bin)");
        assert!(status.success(), "mpirun -np {w}: {status}");
    }
    #[cfg(not(feature = "mpi"))]
    println!("# built without the mpi feature: the thread engine only");
}

#[cfg(feature = "mpi")]
mod mpi {
    use super::*;
    use candle_core::{CpuStorage, InplaceOp2, Layout};
    use wick::accelerator::mpi::collective::SystemOperation;
    use wick::accelerator::mpi::topology::SimpleCommunicator;
    use wick::accelerator::mpi::traits::*;
    use wick::accelerator::MpiWorld;

    /// Open MPI's all-gather run straight on two CPU f32 tensors' memory (Candle hands an
    /// in-place op the storages: no copy).
    struct RawGather<'a>(&'a SimpleCommunicator);

    impl InplaceOp2 for RawGather<'_> {
        fn name(&self) -> &'static str {
            "raw-mpi-all-gather"
        }
        fn cpu_fwd(
            &self,
            full: &mut CpuStorage,
            full_l: &Layout,
            shard: &CpuStorage,
            shard_l: &Layout,
        ) -> candle_core::Result<()> {
            let (Some((a, b)), Some((c, d))) =
                (full_l.contiguous_offsets(), shard_l.contiguous_offsets())
            else {
                candle_core::bail!("contiguous buffers only");
            };
            let (CpuStorage::F32(full), CpuStorage::F32(shard)) = (full, shard) else {
                candle_core::bail!("f32 buffers only");
            };
            self.0.all_gather_into(&shard[c..d], &mut full[a..b]);
            Ok(())
        }
    }

    /// The slowest rank's time.
    fn slowest(comm: &SimpleCommunicator, seconds: f64) -> f64 {
        let mut max = 0.0f64;
        comm.all_reduce_into(&seconds, &mut max, SystemOperation::max());
        max
    }

    /// One collective's times on this rank: through `MpiWorld`, Open MPI's own call on plain
    /// buffers, and (all-gather) Open MPI's own call on the very tensors `MpiWorld` used.
    struct Times {
        op: &'static str,
        bytes: usize,
        wick: f64,
        raw: f64,
        raw_on_tensors: Option<f64>,
    }

    /// `MpiWorld` and Open MPI's own calls (rsmpi on plain f32 buffers, no wick code in the
    /// way), taking turns call by call.
    fn measure(world: &MpiWorld, comm: &SimpleCommunicator) -> Vec<Times> {
        let w = comm.size() as usize;
        let sync = || comm.barrier();
        let mut out = Vec::new();
        for bytes in SIZES {
            let (full, shard) = buffers(bytes, w);
            let (mut raw_full, mut raw_shard) = (vec![1f32; bytes / 4], vec![1f32; bytes / 4 / w]);
            let s = seconds_per_call(
                bytes,
                &sync,
                &mut [
                    &mut || gather(world, &full, &shard),
                    &mut || comm.all_gather_into(&raw_shard[..], &mut raw_full[..]),
                    &mut || full.inplace_op2(&shard, &RawGather(comm)).unwrap(),
                ],
            );
            out.push(Times {
                op: "all_gather",
                bytes,
                wick: s[0],
                raw: s[1],
                raw_on_tensors: Some(s[2]),
            });
            let s = seconds_per_call(
                bytes,
                &sync,
                &mut [&mut || reduce_scatter(world, &full, &shard), &mut || {
                    comm.reduce_scatter_block_into(
                        &raw_full[..],
                        &mut raw_shard[..],
                        SystemOperation::sum(),
                    )
                }],
            );
            out.push(Times {
                op: "reduce_scatter",
                bytes,
                wick: s[0],
                raw: s[1],
                raw_on_tensors: None,
            });
        }
        out
    }

    pub(super) fn engines() {
        let world = MpiWorld::process_world().expect("joining the MPI world");
        let comm = SimpleCommunicator::world();
        let w = comm.size() as usize;
        let mut ratios = Vec::new();
        for t in measure(&world, &comm) {
            let (op, bytes) = (t.op, t.bytes);
            let (s, r) = (slowest(&comm, t.wick), slowest(&comm, t.raw));
            let same_memory = t.raw_on_tensors.map(|x| slowest(&comm, x));
            if comm.rank() == 0 {
                let a = line("mpi", op, w, bytes, s);
                let b = line("mpi-raw", op, w, bytes, r);
                let on_tensors = same_memory
                    .map(|x| format!(" (Open MPI's call on the same tensors: {:.2})", x / s))
                    .unwrap_or_default();
                ratios.push(format!(
                    "# mpi/mpi-raw op={op} world={w} bytes={bytes}: {:.2}{on_tensors}",
                    a / b
                ));
            }
        }
        for r in ratios {
            println!("{r}");
        }
    }
}
