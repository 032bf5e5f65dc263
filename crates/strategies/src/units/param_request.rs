//! Checks every parameter request passes, whatever the strategy makes of it.

use candle_core::{DType, Result, Shape};
use wick_core::ParamRequest;

/// wick keeps f32 master parameters: a request for another dtype is refused.
pub(crate) fn check_dtype(request: &ParamRequest<'_>) -> Result<()> {
    if request.dtype != DType::F32 {
        candle_core::bail!(
            "parameter '{}': wick keeps f32 master parameters, {:?} was requested",
            request.name,
            request.dtype
        )
    }
    Ok(())
}

/// A parameter asked for again must be asked for with the shape it was created with, and
/// be trainable or frozen as it was created.
pub(crate) fn check_asked_again(
    request: &ParamRequest<'_>,
    created_shape: &Shape,
    created_trainable: bool,
) -> Result<()> {
    let name = request.name;
    if request.shape != created_shape {
        candle_core::bail!(
            "parameter '{name}' requested with shape {:?} but created with {created_shape:?}",
            request.shape
        )
    }
    if request.trainable != created_trainable {
        let was = |t: bool| if t { "trainable" } else { "frozen" };
        candle_core::bail!(
            "parameter '{name}' requested {} but created {}",
            was(request.trainable),
            was(created_trainable)
        )
    }
    Ok(())
}
