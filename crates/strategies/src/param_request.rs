//! Checks every parameter request passes, whatever the strategy makes of it.

use candle_core::{DType, Result, Shape};

/// wick keeps f32 master parameters: a request for another dtype is refused.
pub(crate) fn check_dtype(name: &str, dtype: DType) -> Result<()> {
    if dtype != DType::F32 {
        candle_core::bail!(
            "parameter '{name}': wick keeps f32 master parameters, {dtype:?} was requested"
        )
    }
    Ok(())
}

/// A parameter asked for again must be asked for with the shape it was created with.
pub(crate) fn check_same_shape(name: &str, requested: &Shape, created: &Shape) -> Result<()> {
    if requested != created {
        candle_core::bail!(
            "parameter '{name}' requested with shape {requested:?} but created with {created:?}"
        )
    }
    Ok(())
}

/// A parameter asked for again must be trainable or frozen as it was created.
pub(crate) fn check_same_freezing(name: &str, trainable: bool, created: bool) -> Result<()> {
    if trainable != created {
        let was = |t: bool| if t { "trainable" } else { "frozen" };
        candle_core::bail!(
            "parameter '{name}' requested {} but created {}",
            was(trainable),
            was(created)
        )
    }
    Ok(())
}
