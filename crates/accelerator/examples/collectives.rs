//! wick-accelerator alone: four ranks as threads exchanging tensors.
//!
//! `cargo run -p wick-accelerator --example collectives`

use candle_core::{DType, Device, Tensor};
use wick_accelerator::{CollectiveError, CollectiveExt, ReduceOp, ThreadWorld};

fn main() {
    let outcomes = ThreadWorld::new(4).run(|comm| {
        let rank = comm.rank();
        // Uneven shards: rank r holds r + 1 values, all equal to r.
        let shard = Tensor::full(rank as f32, rank + 1, &Device::Cpu).unwrap();
        let full = Tensor::zeros(1 + 2 + 3 + 4, DType::F32, &Device::Cpu).unwrap();
        comm.all_gather_into(&shard, &full)?;
        let mean_rank = comm.all_reduce_scalar(rank as f32, ReduceOp::Mean)?;
        Ok::<_, CollectiveError>((full.to_vec1::<f32>().unwrap(), mean_rank))
    });
    for (rank, outcome) in outcomes.into_iter().enumerate() {
        let (gathered, mean) = outcome.expect("no rank fails here");
        println!("rank {rank}: gathered {gathered:?}, mean rank {mean}");
    }
}
