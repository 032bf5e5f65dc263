//! The parts of an optimizer step over reduced gradients: accumulation, the verdict on inf
//! and NaN with the global norm, clipping, dynamic loss scaling, and the mixed-precision
//! policy.

pub(crate) mod clip;
pub(crate) mod grad_scaler;
pub(crate) mod grads;
pub(crate) mod nonfinite;
pub(crate) mod precision;
