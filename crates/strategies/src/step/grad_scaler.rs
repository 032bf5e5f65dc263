//! Dynamic loss scaling for `16-mixed`, with `torch.amp.GradScaler`'s defaults.
//!
//! f16 holds no magnitude below about 6e-8, so small gradients computed in f16 vanish. The
//! loss is multiplied by a large scale before backward and the gradients divided by it
//! before the step. A scale too large overflows to inf: then the step is skipped on every
//! rank and the scale halves; after 2000 good steps in a row it doubles.

use candle_core::{DType, Tensor};
use wick_core::{Collective, CollectiveExt, LossScale, ReduceOp, Result};

/// `GradScaler`'s `init_scale`.
const INIT_SCALE: f64 = 65536.0;
/// `growth_factor`.
const GROWTH_FACTOR: f64 = 2.0;
/// `backoff_factor`.
const BACKOFF_FACTOR: f64 = 0.5;
/// `growth_interval`.
const GROWTH_INTERVAL: usize = 2000;

/// One rank's scaler; every rank holds the same state, because they decide each step
/// together.
#[derive(Debug, Clone)]
pub(crate) struct GradScaler {
    state: LossScale,
}

impl Default for GradScaler {
    fn default() -> Self {
        GradScaler {
            state: LossScale {
                scale: INIT_SCALE,
                growth_tracker: 0,
                skipped_steps: 0,
            },
        }
    }
}

impl GradScaler {
    /// The scaler's state, for checkpoints and logging.
    pub(crate) fn state(&self) -> LossScale {
        self.state
    }

    /// Continues from a checkpoint's state.
    pub(crate) fn restore(&mut self, state: LossScale) {
        self.state = state;
    }

    /// `loss` times the scale, for backward.
    pub(crate) fn scale(&self, loss: &Tensor) -> Result<Tensor> {
        Ok(loss.affine(self.state.scale, 0.0)?)
    }

    /// Divides `grads` (this rank's reduced gradients) by the scale and decides, with every
    /// rank of `worlds`, whether to step: `false` if any rank's gradients hold inf or NaN.
    /// Updates the scale either way.
    pub(crate) fn unscale(
        &mut self,
        grads: &mut [Tensor],
        worlds: &[&dyn Collective],
    ) -> Result<bool> {
        let mut finite = true;
        for g in grads.iter_mut() {
            *g = g.affine(1.0 / self.state.scale, 0.0)?;
            // A sum is inf or NaN exactly when some element is (or when finite elements
            // overflow f32 together, which an unscaled gradient does not).
            let sum = g.sum_all()?.to_dtype(DType::F32)?.to_scalar::<f32>()?;
            finite &= sum.is_finite();
        }
        let mut bad = f32::from(u8::from(!finite));
        for world in worlds {
            bad = world.all_reduce_scalar(bad, ReduceOp::Sum)?;
        }
        let step = bad == 0.0;
        self.update(step);
        Ok(step)
    }

    fn update(&mut self, stepped: bool) {
        let s = &mut self.state;
        if stepped {
            s.growth_tracker += 1;
            if s.growth_tracker == GROWTH_INTERVAL {
                s.scale *= GROWTH_FACTOR;
                s.growth_tracker = 0;
            }
        } else {
            s.scale *= BACKOFF_FACTOR;
            s.growth_tracker = 0;
            s.skipped_steps += 1;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::Device;
    use wick_core::SoloWorld;

    #[test]
    fn backs_off_on_inf_and_grows_after_the_interval() {
        let mut scaler = GradScaler::default();
        let world = SoloWorld;
        let t = |v: f32| Tensor::new(&[v, 1.0], &Device::Cpu).unwrap();
        let mut grads = [t(f32::INFINITY)];
        assert!(!scaler.unscale(&mut grads, &[&world]).unwrap());
        assert_eq!(scaler.state().scale, 32768.0);
        assert_eq!(scaler.state().skipped_steps, 1);
        let mut grads = [t(f32::NAN)];
        assert!(!scaler.unscale(&mut grads, &[&world]).unwrap());
        assert_eq!(scaler.state().scale, 16384.0);
        for i in 1..=GROWTH_INTERVAL {
            let mut grads = [t(16384.0)];
            assert!(scaler.unscale(&mut grads, &[&world]).unwrap());
            assert_eq!(grads[0].to_vec1::<f32>().unwrap()[0], 1.0);
            assert_eq!(scaler.state().growth_tracker, i % GROWTH_INTERVAL);
        }
        assert_eq!(scaler.state().scale, 32768.0);
    }
}
