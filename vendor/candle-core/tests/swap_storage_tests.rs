//! `Tensor::swap_storage` (wick's patch): what it exchanges, what it refuses, that a tensor
//! over a released storage is an error for every op that reads or writes it, and that two
//! opposite swaps on two threads cannot deadlock.

use candle_core::{DType, Device, Result, Tensor, Var};
use std::sync::mpsc;
use std::time::Duration;

#[test]
fn swap_exchanges_the_storages_of_every_view() -> Result<()> {
    let a = Tensor::arange(0f32, 6., &Device::Cpu)?.reshape((2, 3))?;
    let b = Tensor::arange(10f32, 16., &Device::Cpu)?.reshape((2, 3))?;
    let a_t = a.t()?;
    a.swap_storage(&b)?;
    assert_eq!(a.to_vec2::<f32>()?, [[10., 11., 12.], [13., 14., 15.]]);
    assert_eq!(b.to_vec2::<f32>()?, [[0., 1., 2.], [3., 4., 5.]]);
    // The view shares a's storage, and keeps its own (transposed) layout.
    assert_eq!(a_t.to_vec2::<f32>()?, [[10., 13.], [11., 14.], [12., 15.]]);
    Ok(())
}

#[test]
fn a_released_storage_refilled_serves_the_graph_that_holds_it() -> Result<()> {
    let w = Var::from_vec(vec![1f32, 2., 3., 4.], (2, 2), &Device::Cpu)?;
    let x = Tensor::new(&[[1f32, -1.], [2., 0.5]], &Device::Cpu)?;
    let loss = x.matmul(&w.t()?)?.sqr()?.sum_all()?;
    let expected = loss.backward()?.get(&w).unwrap().to_vec2::<f32>()?;
    let kept = w.as_tensor().copy()?;
    let empty = Tensor::zeros(0, DType::F32, &Device::Cpu)?;
    w.as_tensor().swap_storage(&empty)?;
    w.as_tensor().swap_storage(&kept)?;
    let again = loss.backward()?.get(&w).unwrap().to_vec2::<f32>()?;
    assert_eq!(again, expected);
    Ok(())
}

#[test]
fn mismatched_or_shared_storages_are_refused_and_nothing_changes() -> Result<()> {
    let a = Tensor::new(&[1f32, 2.], &Device::Cpu)?;
    let b = Tensor::new(&[1f64, 2.], &Device::Cpu)?;
    let dtypes = a.swap_storage(&b);
    assert!(dtypes.unwrap_err().to_string().contains("swap_storage"));
    let view = a.narrow(0, 1, 1)?;
    let shared = a.swap_storage(&view);
    assert!(shared.unwrap_err().to_string().contains("share one storage"));
    assert_eq!(a.to_vec1::<f32>()?, [1., 2.]);
    assert_eq!(b.to_vec1::<f64>()?, [1., 2.]);
    Ok(())
}

#[test]
fn opposite_swaps_on_two_threads_do_not_deadlock() -> Result<()> {
    let a = Tensor::new(&[1f32, 2., 3.], &Device::Cpu)?;
    let b = Tensor::new(&[4f32, 5., 6.], &Device::Cpu)?;
    let (done, finished) = mpsc::channel();
    for forward in [true, false] {
        let (a, b, done) = (a.clone(), b.clone(), done.clone());
        std::thread::spawn(move || {
            for _ in 0..20_000 {
                let (x, y) = if forward { (&a, &b) } else { (&b, &a) };
                x.swap_storage(y).unwrap();
            }
            done.send(()).unwrap();
        });
    }
    for _ in 0..2 {
        // Locks taken in opposite orders would hang both threads: fail instead.
        finished
            .recv_timeout(Duration::from_secs(120))
            .expect("two opposite swaps deadlocked");
    }
    // 40 000 swaps in all, an even number: each tensor has its own values back.
    assert_eq!(a.to_vec1::<f32>()?, [1., 2., 3.]);
    assert_eq!(b.to_vec1::<f32>()?, [4., 5., 6.]);
    Ok(())
}

#[test]
fn every_op_on_a_released_storage_is_an_error_not_a_read() -> Result<()> {
    let w = Var::from_vec((0..12).map(|i| i as f32).collect(), (3, 4), &Device::Cpu)?;
    let kept = w.as_tensor().clone();
    let view = w.t()?;
    let x = Var::ones((2, 3), DType::F32, &Device::Cpu)?;
    let loss = x.matmul(&w)?.sum_all()?;
    w.as_tensor().swap_storage(&Tensor::zeros(0, DType::F32, &Device::Cpu)?)?;
    let released = |r: Result<Tensor>| {
        let e = r.expect_err("an op read a released storage").to_string();
        assert!(e.contains("released"), "{e}");
    };
    released(x.matmul(&kept));
    released(view.matmul(&x.t()?));
    released(kept.exp());
    released(kept.add(&kept));
    released(kept.sum_all());
    released(kept.copy());
    released(view.contiguous());
    released(kept.to_dtype(DType::F16));
    released(kept.index_select(&Tensor::new(&[0u32], &Device::Cpu)?, 0));
    released(loss.backward().map(|_| loss.clone()));
    assert!(kept.to_vec2::<f32>().unwrap_err().to_string().contains("released"));
    // Writing into it is refused too.
    released(
        Tensor::zeros((3, 4), DType::F32, &Device::Cpu)?
            .slice_assign(&[0..3, 0..4], &kept),
    );
    let into_released = kept.slice_set(&Tensor::ones((1, 4), DType::F32, &Device::Cpu)?, 0, 0);
    assert!(into_released.unwrap_err().to_string().contains("released"));
    // Refilled, it is whole again.
    w.as_tensor().swap_storage(&Tensor::ones((3, 4), DType::F32, &Device::Cpu)?)?;
    assert_eq!(kept.sum_all()?.to_scalar::<f32>()?, 12.0);
    Ok(())
}
