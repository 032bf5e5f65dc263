//! One door from wick-nn's CPU kernels to Candle's custom-op traits: a kernel implements
//! [`CpuOp`] for its number of inputs (its name, its forward over the inputs' storages,
//! and for a forward op the inputs' gradients), and [`Fused`] is the `CustomOp1`/`2`/`3`
//! Candle applies. Candle's traits spell each input as two arguments; here they come as
//! one array, so a kernel's signature is the same line whatever it computes.

use candle_core::{CpuStorage, CustomOp1, CustomOp2, CustomOp3, Layout, Result, Shape, Tensor};

/// What a CPU kernel returns: the output's storage and its shape.
pub(crate) type CpuOut = Result<(CpuStorage, Shape)>;

/// An input as Candle hands it to a CPU kernel: its storage and how the tensor lies in it.
pub(crate) type Input<'a> = (&'a CpuStorage, &'a Layout);

/// A fused CPU op of `N` inputs.
pub(crate) trait CpuOp<const N: usize>: Send + Sync {
    /// The op's name in errors and profiles.
    const NAME: &'static str;

    /// The output of the inputs, with its shape.
    fn cpu(&self, inputs: [Input<'_>; N]) -> CpuOut;

    /// The inputs' gradients, given the output `res` and its gradient `grad` (a backward
    /// op has none: Candle's error for an op without backward).
    fn grads(&self, inputs: [&Tensor; N], res: &Tensor, grad: &Tensor) -> GradsOf<N> {
        let _ = (inputs, res, grad);
        Err(candle_core::Error::BackwardNotSupported { op: Self::NAME })
    }
}

/// The gradients of `N` inputs, `None` where an input gets none.
pub(crate) type GradsOf<const N: usize> = Result<[Option<Tensor>; N]>;

/// A [`CpuOp`] as the custom op Candle applies.
pub(crate) struct Fused<K>(pub(crate) K);

impl<K: CpuOp<1>> CustomOp1 for Fused<K> {
    fn name(&self) -> &'static str {
        K::NAME
    }

    fn cpu_fwd(&self, s: &CpuStorage, l: &Layout) -> CpuOut {
        self.0.cpu([(s, l)])
    }

    fn bwd(&self, a: &Tensor, res: &Tensor, grad: &Tensor) -> Result<Option<Tensor>> {
        let [da] = self.0.grads([a], res, grad)?;
        Ok(da)
    }
}

impl<K: CpuOp<2>> CustomOp2 for Fused<K> {
    fn name(&self) -> &'static str {
        K::NAME
    }

    fn cpu_fwd(&self, s1: &CpuStorage, l1: &Layout, s2: &CpuStorage, l2: &Layout) -> CpuOut {
        self.0.cpu([(s1, l1), (s2, l2)])
    }

    fn bwd(
        &self,
        a: &Tensor,
        b: &Tensor,
        res: &Tensor,
        grad: &Tensor,
    ) -> Result<(Option<Tensor>, Option<Tensor>)> {
        let [da, db] = self.0.grads([a, b], res, grad)?;
        Ok((da, db))
    }
}

impl<K: CpuOp<3>> CustomOp3 for Fused<K> {
    fn name(&self) -> &'static str {
        K::NAME
    }

    fn cpu_fwd(
        &self,
        s1: &CpuStorage,
        l1: &Layout,
        s2: &CpuStorage,
        l2: &Layout,
        s3: &CpuStorage,
        l3: &Layout,
    ) -> CpuOut {
        self.0.cpu([(s1, l1), (s2, l2), (s3, l3)])
    }

    fn bwd(
        &self,
        a: &Tensor,
        b: &Tensor,
        c: &Tensor,
        res: &Tensor,
        grad: &Tensor,
    ) -> Result<(Option<Tensor>, Option<Tensor>, Option<Tensor>)> {
        let [da, db, dc] = self.0.grads([a, b, c], res, grad)?;
        Ok((da, db, dc))
    }
}
