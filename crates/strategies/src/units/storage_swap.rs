//! Releasing a tensor's memory while a graph still holds the tensor, and refilling it
//! before the graph is used again: full sharding keeps a unit's activations this way and
//! gives back only its gathered parameters.
//!
//! It needs `Tensor::swap_storage`, which wick's vendored candle-core adds (see
//! vendor/README.md); `build.rs` tells which candle-core this crate builds against. With
//! stock candle-core the same names exist and [`AVAILABLE`] is false: full sharding then
//! recomputes each unit's forward in backward instead, and says so once.

use candle_core::{Result, Tensor};

/// Whether this build's candle-core can release and refill a tensor's storage.
pub(crate) const AVAILABLE: bool = cfg!(candle_swap_storage);

/// Gives `tensor`'s memory back (every view of it too); its layout stays. Until [`refill`]
/// gives it a storage again, every op that reads or writes `tensor` or a tensor sharing its
/// storage (a view, a clone a closure kept, the graph that holds it) is an error: the
/// vendored candle-core checks each operand's layout against its storage where it
/// dispatches an op.
pub(crate) fn release(tensor: &Tensor) -> Result<()> {
    swap(tensor, &Tensor::zeros(0, tensor.dtype(), tensor.device())?)
}

/// Puts `values` (a contiguous tensor of `tensor`'s shape, dtype and device, used for
/// nothing else) behind `tensor` and every view of it.
pub(crate) fn refill(tensor: &Tensor, values: &Tensor) -> Result<()> {
    if values.shape() != tensor.shape() || !values.is_contiguous() {
        candle_core::bail!(
            "refill: values of shape {:?} for a tensor of shape {:?}",
            values.shape(),
            tensor.shape()
        )
    }
    swap(tensor, values)
}

#[cfg(candle_swap_storage)]
fn swap(a: &Tensor, b: &Tensor) -> Result<()> {
    a.swap_storage(b)
}

#[cfg(not(candle_swap_storage))]
fn swap(_: &Tensor, _: &Tensor) -> Result<()> {
    candle_core::bail!(
        "this candle-core cannot swap a tensor's storage (wick's vendored copy adds \
         Tensor::swap_storage; see vendor/README.md)"
    )
}

/// Whether units asked to keep their activations under full sharding can, telling once
/// per process when this build cannot.
pub(crate) fn can_keep_activations() -> bool {
    static TOLD: std::sync::Once = std::sync::Once::new();
    if !AVAILABLE {
        TOLD.call_once(|| {
            log::warn!(
                "this candle-core has no Tensor::swap_storage, so fsdp full_shard \
                 recomputes each unit's forward in backward instead of keeping its \
                 activations (same results, more compute); add wick's [patch.crates-io] \
                 line for candle-core to keep them (vendor/README.md)"
            );
        });
    }
    AVAILABLE
}

#[cfg(all(test, candle_swap_storage))]
mod tests {
    use super::*;
    use candle_core::{Device, Var};

    #[test]
    fn a_graph_over_a_released_and_refilled_tensor_backpropagates_as_before() {
        let w = Var::from_vec(vec![1f32, 2., 3., 4.], (2, 2), &Device::Cpu).unwrap();
        let x = Tensor::new(&[[1f32, -1.], [0.5, 2.]], &Device::Cpu).unwrap();
        let loss_of = |w: &Var| x.matmul(&w.t()?)?.sqr()?.sum_all();
        let grad_of = |loss: &Tensor| loss.backward()?.get(&w).unwrap().to_vec2::<f32>();
        let want_grad = grad_of(&loss_of(&w).unwrap()).unwrap();
        let loss = loss_of(&w).unwrap();
        let saved = w.as_tensor().copy().unwrap();
        release(&w).unwrap();
        // A clone kept from before the release reads an error, not past the end.
        let e = w.as_tensor().clone().exp().unwrap_err().to_string();
        assert!(e.contains("released"), "{e}");
        // A view (as the graph holds `w.t()`) sees the release too: no elements behind it.
        let elements = |t: &Tensor| match &*t.storage_and_layout().0 {
            candle_core::Storage::Cpu(s) => s.as_slice::<f32>().unwrap().len(),
            _ => unreachable!("a CPU tensor"),
        };
        assert_eq!(elements(&w.t().unwrap()), 0);
        refill(&w, &saved).unwrap();
        assert_eq!(elements(&w.t().unwrap()), 4);
        assert_eq!(grad_of(&loss).unwrap(), want_grad);
        let e = refill(
            &w,
            &Tensor::zeros(3, candle_core::DType::F32, &Device::Cpu).unwrap(),
        );
        assert!(e.unwrap_err().to_string().contains("shape"));
        let e = w.as_tensor().swap_storage(&w.t().unwrap()).unwrap_err();
        assert!(e.to_string().contains("share one storage"), "{e}");
    }
}
