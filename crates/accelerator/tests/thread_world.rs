//! ThreadWorld collectives against values computed by hand, for W = 1..5 and uneven lengths.

use candle_core::{Device, Tensor};
use std::time::{Duration, Instant};
use wick_accelerator::{RankError, ThreadWorld};
use wick_core::{
    reduce_scatter_padded, Call, Collective, CollectiveError, CollectiveExt, Position, ReduceOp,
    Work,
};

/// Rank r's shard length: uneven on purpose (r + 3 elements).
fn shard_len(r: usize) -> usize {
    r + 3
}

fn values(rank: usize, len: usize) -> Vec<f32> {
    (0..len)
        .map(|i| (rank * 1000 + i) as f32 * 0.5 - 7.0)
        .collect()
}

fn tensor(v: Vec<f32>) -> Tensor {
    Tensor::from_vec(v.clone(), v.len(), &Device::Cpu).unwrap()
}

fn ok<T>(outcomes: Vec<Result<T, RankError<CollectiveError>>>) -> Vec<T> {
    outcomes.into_iter().map(|o| o.unwrap()).collect()
}

#[test]
fn all_gather_concatenates_uneven_shards_in_rank_order() {
    for w in 1..=5 {
        let total: usize = (0..w).map(shard_len).sum();
        let expected: Vec<f32> = (0..w).flat_map(|r| values(r, shard_len(r))).collect();
        let got = ok(ThreadWorld::new(w).run(|c| {
            let shard = tensor(values(c.rank(), shard_len(c.rank())));
            let full = Tensor::zeros(total, candle_core::DType::F32, &Device::Cpu).unwrap();
            // Twice on the same buffers: the second call must not depend on the first.
            c.all_gather_into(&shard, &full)?;
            c.all_gather_into(&shard, &full)?;
            Ok(full.to_vec1::<f32>().unwrap())
        }));
        for g in got {
            assert_eq!(g, expected, "w={w}");
        }
    }
}

#[test]
fn reduce_scatter_sums_and_means_each_ranks_range() {
    for w in 1..=5 {
        let total: usize = (0..w).map(shard_len).sum();
        for op in [ReduceOp::Sum, ReduceOp::Mean] {
            let got = ok(ThreadWorld::new(w).run(|c| {
                let full = tensor(values(c.rank(), total));
                let shard =
                    Tensor::zeros(shard_len(c.rank()), candle_core::DType::F32, &Device::Cpu)
                        .unwrap();
                c.reduce_scatter_into(&full, &shard, op)?;
                Ok(shard.to_vec1::<f32>().unwrap())
            }));
            let mut offset = 0;
            for (r, g) in got.iter().enumerate() {
                let want: Vec<f32> = (0..shard_len(r))
                    .map(|i| {
                        let sum: f32 = (0..w).map(|s| values(s, total)[offset + i]).sum();
                        if op == ReduceOp::Mean {
                            sum * (1.0 / w as f32)
                        } else {
                            sum
                        }
                    })
                    .collect();
                assert_eq!(g, &want, "w={w} rank={r} op={op:?}");
                offset += shard_len(r);
            }
        }
    }
}

/// A world that takes equal chunks only, as NCCL does: its uneven reduce-scatter is
/// `reduce_scatter_padded`, which pads every part to the longest.
struct EqualChunksOnly(Box<dyn Collective>);

impl Collective for EqualChunksOnly {
    fn position(&self) -> Position {
        self.0.position()
    }
    fn start(&self, call: Call<'_>) -> Result<Work, CollectiveError> {
        match call {
            Call::ReduceScatterParts {
                full,
                shard,
                parts,
                op,
            } => reduce_scatter_padded(self, full, shard, parts, op),
            Call::ReduceScatter { full, shard, .. } => {
                assert_eq!(full.elem_count(), shard.elem_count() * self.world_size());
                self.0.start(call)
            }
            other => self.0.start(other),
        }
    }
}

#[test]
fn uneven_parts_reduce_to_the_same_bits_padded_or_not() {
    for w in 1..=4 {
        // Rank 0 owns no element, rank 1 the most.
        let parts: Vec<usize> = (0..w).map(|r| [0, 7, 2, 3][r]).collect();
        let total: usize = parts.iter().sum();
        for op in [ReduceOp::Sum, ReduceOp::Mean] {
            let run = |padded: bool| {
                ok(ThreadWorld::new(w).run(|c| {
                    let c: Box<dyn Collective> = match padded {
                        true => Box::new(EqualChunksOnly(Box::new(c))),
                        false => Box::new(c),
                    };
                    let full = tensor(values(c.rank(), total));
                    let mine = parts[c.rank()];
                    let shard = Tensor::zeros(mine, candle_core::DType::F32, &Device::Cpu).unwrap();
                    let work = c.reduce_scatter_parts_start(&full, &shard, &parts, op)?;
                    drop(full);
                    work.wait()?;
                    Ok(shard.to_vec1::<f32>().unwrap())
                }))
            };
            let (direct, padded) = (run(false), run(true));
            assert_eq!(direct, padded, "w={w} {op:?}");
            let mut offset = 0;
            for (r, got) in direct.iter().enumerate() {
                let expected: Vec<f32> = (offset..offset + parts[r])
                    .map(|i| {
                        let sum: f32 = (0..w).map(|s| values(s, total)[i]).sum();
                        match op {
                            ReduceOp::Sum => sum,
                            ReduceOp::Mean => sum * (1.0 / w as f32),
                        }
                    })
                    .collect();
                assert_eq!(got, &expected, "w={w} rank {r} {op:?}");
                offset += parts[r];
            }
        }
    }
}

#[test]
fn parts_that_do_not_fit_the_world_are_an_error() {
    let got = ThreadWorld::new(2).run(|c| {
        let c = EqualChunksOnly(Box::new(c));
        let full = tensor(values(0, 5));
        let shard = Tensor::zeros(2, candle_core::DType::F32, &Device::Cpu).unwrap();
        let err = c
            .reduce_scatter_parts_start(&full, &shard, &[2, 2], ReduceOp::Sum)
            .err()
            .expect("parts add up to 4, not 5");
        Ok::<_, CollectiveError>(err.to_string())
    });
    for g in ok(got) {
        assert!(g.contains("parts [2, 2]"), "{g}");
    }
}

#[test]
fn all_reduce_gives_every_rank_the_same_sum() {
    for w in 1..=5 {
        // 2 elements (fewer than ranks), 1031 (prime), 5000 (several reduction blocks).
        for len in [2, 1031, 5000] {
            let got = ok(ThreadWorld::new(w).run(|c| {
                let t = tensor(values(c.rank(), len));
                c.all_reduce_in_place(&t, ReduceOp::Sum)?;
                Ok(t.to_vec1::<f32>().unwrap())
            }));
            let want: Vec<f32> = (0..len)
                .map(|i| (0..w).map(|s| values(s, len)[i]).sum())
                .collect();
            for g in &got {
                assert_eq!(g, &want, "w={w} len={len}");
            }
        }
    }
}

#[test]
fn broadcast_copies_the_roots_values() {
    for w in 1..=5 {
        let root = w - 1;
        let got = ok(ThreadWorld::new(w).run(|c| {
            let t = tensor(values(c.rank(), 17));
            c.broadcast_in_place(&t, root)?;
            c.barrier()?;
            Ok(t.to_vec1::<f32>().unwrap())
        }));
        for g in got {
            assert_eq!(g, values(root, 17));
        }
    }
}

#[test]
fn scalar_all_reduce_means() {
    let got = ok(ThreadWorld::new(4).run(|c| c.all_reduce_scalar(c.rank() as f32, ReduceOp::Mean)));
    assert_eq!(got, vec![1.5; 4]);
}

#[test]
fn mismatched_lengths_are_an_error_on_every_rank() {
    let outcomes = ThreadWorld::new(3).run(|c| {
        let t = tensor(values(c.rank(), 4 + c.rank()));
        c.all_reduce_in_place(&t, ReduceOp::Sum)
    });
    for o in outcomes {
        let e = o.unwrap_err().to_string();
        assert!(e.contains("different lengths"), "{e}");
    }
}

#[test]
fn mismatched_calls_are_an_error_not_a_hang() {
    let outcomes = ThreadWorld::new(2).run(|c| {
        let t = tensor(values(c.rank(), 4));
        if c.rank() == 0 {
            c.barrier()
        } else {
            c.all_reduce_in_place(&t, ReduceOp::Sum)
        }
    });
    for o in outcomes {
        assert!(o.unwrap_err().to_string().contains("different collective"));
    }
}

fn assert_failure_reaches_everyone(panic: bool) {
    let start = Instant::now();
    let outcomes = ThreadWorld::new(4).run(|c| {
        let t = tensor(values(c.rank(), 8));
        for step in 0..100 {
            if c.rank() == 2 && step == 3 {
                if panic {
                    panic!("boom at step {step}");
                }
                return Err(CollectiveError::Mismatch {
                    rank: 2,
                    op: "test",
                    message: "boom".into(),
                });
            }
            c.all_reduce_in_place(&t, ReduceOp::Mean)?;
        }
        Ok(())
    });
    // Far below the world's timeout (600 s), so a pass shows that the failure, not the
    // timeout, ended the wait; generous, so that a loaded machine passes too.
    assert!(
        start.elapsed() < Duration::from_secs(120),
        "took {:?}",
        start.elapsed()
    );
    for (r, o) in outcomes.into_iter().enumerate() {
        let e = o.unwrap_err().to_string();
        if r == 2 {
            assert!(e.contains("boom"), "{e}");
        } else {
            assert!(
                e.contains("rank 2 failed") && e.contains("boom"),
                "rank {r}: {e}"
            );
        }
    }
}

#[test]
fn a_rank_that_errors_fails_the_others_quickly() {
    assert_failure_reaches_everyone(false);
}

#[test]
fn a_rank_that_panics_fails_the_others_quickly() {
    assert_failure_reaches_everyone(true);
}

#[test]
fn a_rank_that_leaves_early_fails_its_waiting_peers() {
    let outcomes = ThreadWorld::new(2).run(|c| {
        if c.rank() == 1 {
            c.barrier()?;
        }
        Ok::<_, CollectiveError>(())
    });
    assert!(outcomes[0].is_ok());
    assert!(outcomes[1]
        .as_ref()
        .unwrap_err()
        .to_string()
        .contains("rank 0 left"));
}

#[test]
fn a_slow_peer_times_out_instead_of_hanging() {
    let world = ThreadWorld::with_timeout(2, Duration::from_millis(200));
    // Rank 0 stays (outside any collective) until rank 1's barrier has returned, however
    // late rank 1 starts: the barrier can end only by the timeout, never by rank 0 leaving.
    let (answered, answer) = std::sync::mpsc::channel::<()>();
    let answer = std::sync::Mutex::new(answer);
    let outcomes = world.run(|c| {
        if c.rank() == 0 {
            let waited = answer
                .lock()
                .unwrap()
                .recv_timeout(Duration::from_secs(300));
            assert!(waited.is_ok(), "rank 1's barrier never returned");
            return Ok(());
        }
        let outcome = c.barrier();
        answered.send(()).unwrap();
        outcome
    });
    let e = outcomes[1].as_ref().unwrap_err().to_string();
    assert!(e.contains("timed out"), "{e}");
}

#[test]
fn wrong_dtype_is_refused_with_the_rank() {
    let outcomes = ThreadWorld::new(1).run(|c| {
        let t = Tensor::zeros(4, candle_core::DType::F64, &Device::Cpu).unwrap();
        c.all_reduce_in_place(&t, ReduceOp::Sum)
    });
    let e = outcomes[0].as_ref().unwrap_err().to_string();
    assert!(e.contains("rank 0") && e.contains("f32"), "{e}");
}

#[test]
fn bytes_are_gathered_and_broadcast_but_never_reduced() {
    let w = 3;
    let total: usize = (0..w).map(shard_len).sum();
    let bytes = |r: usize| -> Vec<u8> { (0..shard_len(r)).map(|i| (r * 100 + i) as u8).collect() };
    let expected: Vec<u8> = (0..w).flat_map(bytes).collect();
    let got = ok(ThreadWorld::new(w).run(|c| {
        let shard = Tensor::new(bytes(c.rank()), &Device::Cpu).unwrap();
        let full = Tensor::zeros(total, candle_core::DType::U8, &Device::Cpu).unwrap();
        c.all_gather_into(&shard, &full)?;
        let root = Tensor::new(vec![c.rank() as u8; 5], &Device::Cpu).unwrap();
        c.broadcast_in_place(&root, 1)?;
        let refused = c.all_reduce_in_place(&shard, ReduceOp::Sum).unwrap_err();
        Ok((
            full.to_vec1::<u8>().unwrap(),
            root.to_vec1::<u8>().unwrap(),
            refused.to_string(),
        ))
    }));
    for (full, root, refused) in got {
        assert_eq!(full, expected);
        assert_eq!(root, vec![1; 5]);
        assert!(
            refused.contains("reductions take f32, bf16 or f16"),
            "{refused}"
        );
    }
}

#[test]
fn split_makes_independent_sub_worlds() {
    let got = ok(ThreadWorld::new(4).run(|c| {
        let group = c.split(c.rank() / 2)?;
        let across = c.split(c.rank() % 2)?;
        let in_group = group.all_reduce_scalar(c.rank() as f32, ReduceOp::Sum)?;
        let in_across = across.all_reduce_scalar(c.rank() as f32, ReduceOp::Sum)?;
        Ok((group.rank(), group.world_size(), in_group, in_across))
    }));
    assert_eq!(
        got,
        vec![
            (0, 2, 1.0, 2.0),
            (1, 2, 1.0, 4.0),
            (0, 2, 5.0, 2.0),
            (1, 2, 5.0, 4.0)
        ]
    );
}

/// Rank 3's own error in the split-world tests.
fn boom() -> CollectiveError {
    CollectiveError::Mismatch {
        rank: 3,
        op: "test",
        message: "boom".into(),
    }
}

#[test]
fn a_failure_reaches_ranks_waiting_in_a_sub_world() {
    let start = Instant::now();
    let outcomes = ThreadWorld::new(4).run(|c| {
        let group = c.split(c.rank() / 2)?;
        if c.rank() == 3 {
            return Err(boom());
        }
        // Rank 2 waits in its group for rank 3, which never comes.
        group.barrier()?;
        c.barrier()
    });
    assert!(start.elapsed() < Duration::from_secs(120), "as above");
    let e = outcomes[2].as_ref().unwrap_err().to_string();
    assert!(e.contains("rank 3 failed") && e.contains("boom"), "{e}");
}

#[test]
fn half_precision_collectives_gather_and_reduce_in_f32() {
    for dtype in [candle_core::DType::BF16, candle_core::DType::F16] {
        let got = ok(ThreadWorld::new(3).run(|c| {
            let r = c.rank();
            let shard = tensor(values(r, shard_len(r))).to_dtype(dtype).unwrap();
            let total: usize = (0..3).map(shard_len).sum();
            let full = Tensor::zeros(total, dtype, &Device::Cpu).unwrap();
            c.all_gather_into(&shard, &full)?;
            let summed = Tensor::zeros(shard_len(r), dtype, &Device::Cpu).unwrap();
            c.reduce_scatter_into(&full, &summed, ReduceOp::Sum)?;
            let f32s = |t: &Tensor| {
                t.to_dtype(candle_core::DType::F32)
                    .unwrap()
                    .to_vec1::<f32>()
                    .unwrap()
            };
            Ok((f32s(&full), f32s(&summed), f32s(&shard)))
        }));
        let gathered: Vec<f32> = got.iter().flat_map(|(_, _, s)| s.clone()).collect();
        for (full, summed, shard) in &got {
            assert_eq!(full, &gathered, "{dtype:?}");
            // Three equal copies summed: 3x each element, rounded once to the 16-bit type.
            for (s, x) in summed.iter().zip(shard) {
                let want = Tensor::new(&[3.0 * x], &Device::Cpu)
                    .unwrap()
                    .to_dtype(dtype)
                    .unwrap();
                let want = want
                    .to_dtype(candle_core::DType::F32)
                    .unwrap()
                    .to_vec1::<f32>()
                    .unwrap()[0];
                assert_eq!(*s, want, "{dtype:?}");
            }
        }
    }
}

#[test]
fn colors_split_apart_however_large() {
    // As f32 the two colors would be one number (2^24 + 1 rounds to 2^24).
    let got = ok(ThreadWorld::new(2).run(|c| {
        let group = c.split((1 << 24) + c.rank())?;
        Ok(group.world_size())
    }));
    assert_eq!(got, vec![1, 1]);
}

#[test]
fn a_failure_outside_a_sub_world_lets_its_members_finish_their_call() {
    let outcomes = ThreadWorld::new(4).run(|c| {
        let group = c.split(c.rank() / 2)?;
        if c.rank() == 3 {
            return Err(boom());
        }
        if c.rank() < 2 {
            // Group {0, 1} does not contain rank 3: its gather completes, with the right
            // values, however soon rank 3 fails.
            let shard = tensor(vec![c.rank() as f32; 1000]);
            let full = Tensor::zeros(2000, candle_core::DType::F32, &Device::Cpu).unwrap();
            for _ in 0..50 {
                group.all_gather_into(&shard, &full)?;
            }
            let got = full.to_vec1::<f32>().unwrap();
            assert!(got[..1000].iter().all(|&v| v == 0.0) && got[1000..].iter().all(|&v| v == 1.0));
        }
        c.barrier()
    });
    for rank in [0, 1, 2] {
        let e = outcomes[rank].as_ref().unwrap_err().to_string();
        assert!(
            e.contains("rank 3 failed") && e.contains("boom"),
            "rank {rank}: {e}"
        );
    }
}
