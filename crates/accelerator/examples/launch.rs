//! wick-accelerator alone, launched either way: as 4 ranks that are threads of this
//! process, or, built with the `mpi` feature and started by mpirun, as one rank per process.
//!
//! ```sh
//! cargo run -p wick-accelerator --example launch
//! cargo build -p wick-accelerator --features mpi --example launch
//! mpirun -np 4 target/debug/examples/launch
//! ```

use candle_core::{DType, Device, Tensor};
use wick_accelerator::{Accelerator, CollectiveExt, Error, LaunchEnv, ReduceOp};

fn main() -> Result<(), Error> {
    let accelerator = match LaunchEnv::detect()? {
        // One rank per process; devices default to the launcher's count.
        Some(_) => Accelerator::from_env(None)?,
        None => Accelerator::cpu(4)?,
    };
    let w = accelerator.world_size();
    let outcomes = accelerator.launch(|env| {
        // Rank r holds r + 1 values, all equal to r: uneven shards are fine.
        let shard = Tensor::full(env.rank as f32, env.rank + 1, &Device::Cpu).unwrap();
        let full = Tensor::zeros(w * (w + 1) / 2, DType::F32, &Device::Cpu).unwrap();
        env.world.all_gather_into(&shard, &full)?;
        let mean_rank = env
            .world
            .all_reduce_scalar(env.rank as f32, ReduceOp::Mean)?;
        Ok::<_, Error>((env.rank, full.to_vec1::<f32>().unwrap(), mean_rank))
    });
    for outcome in outcomes {
        let (rank, gathered, mean) = outcome.expect("no rank fails here");
        println!("rank {rank} of {w}: gathered {gathered:?}, mean rank {mean}");
    }
    Ok(())
}
