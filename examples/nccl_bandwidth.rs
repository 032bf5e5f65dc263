//! NCCL bandwidth through `NcclWorld`: all-gather and reduce-scatter of 64 MiB and 1 GiB
//! (f32), at every world size from 1 to the number of GPUs, one rank per GPU.
//!
//! `cargo build --release --features cuda,nccl --example nccl_bandwidth` (scripts/gpu-check.sh
//! runs it on a GPU machine).
//!
//! One line per measurement:
//! `engine=nccl op=<all_gather|reduce_scatter> world=<W> bytes=<S> algbw_gbps=<a> busbw_gbps=<b>`,
//! S the full buffer, algbw = S / time and busbw = algbw * (W - 1) / W in 10^9 bytes per
//! second, as nccl-tests counts them; the time is rank 0's median over 20 calls, each
//! started together and ended when the GPU finished it. At W = 1 NCCL only copies on the
//! device, so busbw is 0 and algbw is that copy's speed.

use candle_core::{DType, Tensor};
use std::time::Instant;
use wick::accelerator::{cuda_device_count, Accelerator};
use wick::core::{CollectiveExt, ReduceOp};

const SIZES: [usize; 2] = [64 << 20, 1 << 30];
const REPEATS: usize = 20;

fn main() -> anyhow::Result<()> {
    let gpus = cuda_device_count()?;
    for world in 1..=gpus {
        let outcomes = Accelerator::cuda(world)?.launch(|env| {
            let w = env.world.as_ref();
            for bytes in SIZES {
                let full = Tensor::zeros(bytes / 4, DType::F32, &env.device)?;
                let shard = Tensor::ones(bytes / 4 / world, DType::F32, &env.device)?;
                for op in ["all_gather", "reduce_scatter"] {
                    let call = || match op {
                        "all_gather" => w.all_gather_into(&shard, &full),
                        _ => w.reduce_scatter_into(&full, &shard, ReduceOp::Sum),
                    };
                    let mut times = Vec::new();
                    for i in 0..=REPEATS {
                        w.barrier()?;
                        let start = Instant::now();
                        call()?;
                        env.device.synchronize()?;
                        if i > 0 {
                            times.push(start.elapsed().as_secs_f64());
                        }
                    }
                    times.sort_by(f64::total_cmp);
                    let algbw = bytes as f64 / times[REPEATS / 2] / 1e9;
                    let busbw = algbw * (world - 1) as f64 / world as f64;
                    if env.rank == 0 {
                        println!(
                            "engine=nccl op={op} world={world} bytes={bytes} \
                             algbw_gbps={algbw:.1} busbw_gbps={busbw:.1}"
                        );
                    }
                }
            }
            Ok::<_, wick::core::Error>(())
        });
        for outcome in outcomes {
            outcome.map_err(|e| anyhow::anyhow!("{e}"))?;
        }
    }
    Ok(())
}
