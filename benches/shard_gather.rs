//! All-gather and reduce-scatter on `ThreadWorld` against a one-thread memcpy of the same
//! bytes, measured in one run. Throughput is the full gathered size S per call.
//!
//! `cargo bench --bench shard_gather`

// criterion's macros emit undocumented public items.
#![allow(missing_docs)]

use candle_core::{DType, Device, Tensor};
use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use std::sync::mpsc::{channel, Receiver, Sender};
use std::sync::Mutex;
use std::time::{Duration, Instant};
use wick::accelerator::ThreadWorld;
use wick::core::{CollectiveExt, ReduceOp};

const MIB: usize = 1 << 20;

#[derive(Clone, Copy)]
enum Op {
    AllGather,
    ReduceScatter,
}

/// W rank threads that stay up for a whole benchmark and run `n` calls on request; rank 0
/// times the calls between two barriers, so thread start-up and buffer allocation are not timed.
struct Ranks {
    requests: Vec<Sender<u64>>,
    elapsed: Receiver<Duration>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Ranks {
    fn start(op: Op, world: usize, full_bytes: usize) -> Self {
        let (senders, receivers): (Vec<_>, Vec<_>) = (0..world).map(|_| channel::<u64>()).unzip();
        let (done_tx, done_rx) = channel();
        let done_tx = Mutex::new(done_tx);
        let thread = std::thread::spawn(move || {
            let full_len = full_bytes / 4;
            let shard_len = full_len / world;
            // Each rank takes its own request channel.
            ThreadWorld::new(world).run_each(receivers, |comm, requests| {
                // Buffers are filled once so their pages exist before timing.
                let shard = Tensor::ones(shard_len, DType::F32, &Device::Cpu).unwrap();
                let full = Tensor::ones(shard_len * world, DType::F32, &Device::Cpu).unwrap();
                while let Ok(n) = requests.recv() {
                    comm.barrier()?;
                    let start = Instant::now();
                    for _ in 0..n {
                        match op {
                            Op::AllGather => comm.all_gather_into(&shard, &full)?,
                            Op::ReduceScatter => {
                                comm.reduce_scatter_into(&full, &shard, ReduceOp::Sum)?
                            }
                        }
                    }
                    comm.barrier()?;
                    if comm.rank() == 0 {
                        done_tx.lock().unwrap().send(start.elapsed()).unwrap();
                    }
                }
                Ok::<_, wick::core::CollectiveError>(())
            });
        });
        Ranks {
            requests: senders,
            elapsed: done_rx,
            thread: Some(thread),
        }
    }

    fn time(&self, n: u64) -> Duration {
        for r in &self.requests {
            r.send(n).unwrap();
        }
        self.elapsed.recv().unwrap()
    }
}

impl Drop for Ranks {
    fn drop(&mut self) {
        self.requests.clear();
        if let Some(t) = self.thread.take() {
            t.join().unwrap();
        }
    }
}

fn collectives(c: &mut Criterion) {
    for (op, name) in [
        (Op::AllGather, "all_gather"),
        (Op::ReduceScatter, "reduce_scatter"),
    ] {
        let mut group = c.benchmark_group(name);
        group
            .sample_size(10)
            .warm_up_time(Duration::from_millis(500))
            .measurement_time(Duration::from_secs(2));
        for world in [2, 4] {
            for mib in [1, 16, 64] {
                let bytes = mib * MIB;
                let ranks = Ranks::start(op, world, bytes);
                group.throughput(Throughput::Bytes(bytes as u64));
                group.bench_function(
                    BenchmarkId::new(format!("w{world}"), format!("{mib}MiB")),
                    |b| b.iter_custom(|n| ranks.time(n)),
                );
            }
        }
        group.finish();
    }

    let mut group = c.benchmark_group("memcpy");
    group
        .sample_size(10)
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(2));
    let bytes = 64 * MIB;
    let src = vec![1f32; bytes / 4];
    let mut dst = vec![0f32; bytes / 4];
    group.throughput(Throughput::Bytes(bytes as u64));
    group.bench_function("64MiB", |b| {
        b.iter(|| {
            dst.copy_from_slice(std::hint::black_box(&src));
            std::hint::black_box(&mut dst);
        })
    });
    group.finish();
}

criterion_group!(benches, collectives);
criterion_main!(benches);
