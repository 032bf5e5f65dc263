//! Learning-rate schedules: the learning rate of each optimizer step as a factor of the
//! optimizer's base rate, stepped once per optimizer step (not per micro-batch).
//!
//! A schedule is a pure function of the step, so a run resumed at step N takes the same
//! rate at step N as the run that saved it; the trainer stores the schedule in checkpoints.

/// How the rate falls after warmup.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(feature = "clap", derive(clap::ValueEnum))]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[cfg_attr(feature = "serde", serde(rename_all = "lowercase"))]
pub enum Decay {
    /// No decay: the base rate after warmup.
    Constant,
    /// Half a cosine from the base rate down to the floor.
    Cosine,
    /// A straight line from the base rate down to the floor.
    Linear,
}

impl Decay {
    /// Every name [`Decay::from_name`] accepts.
    pub const NAMES: &'static [&'static str] = &["constant", "cosine", "linear"];

    /// The decay's name.
    pub fn name(self) -> &'static str {
        match self {
            Decay::Constant => "constant",
            Decay::Cosine => "cosine",
            Decay::Linear => "linear",
        }
    }

    /// The decay called `name`, or `None`.
    pub fn from_name(name: &str) -> Option<Self> {
        [Decay::Constant, Decay::Cosine, Decay::Linear]
            .into_iter()
            .find(|d| d.name() == name)
    }
}

/// Linear warmup over `warmup_steps`, then `decay` until `total_steps`, then the floor
/// (`min_lr_ratio` times the base rate) for any step after.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LrSchedule {
    /// Steps of linear warmup: step `s < warmup_steps` (from 0) takes `(s + 1) / warmup_steps`
    /// of the base rate, so no step runs at rate 0.
    pub warmup_steps: usize,
    /// The shape after warmup.
    pub decay: Decay,
    /// The step at which the decay reaches the floor.
    pub total_steps: usize,
    /// The floor, as a fraction of the base rate.
    pub min_lr_ratio: f64,
}

impl Default for LrSchedule {
    fn default() -> Self {
        LrSchedule::constant()
    }
}

impl LrSchedule {
    /// The base rate at every step.
    pub fn constant() -> Self {
        LrSchedule {
            warmup_steps: 0,
            decay: Decay::Constant,
            total_steps: 0,
            min_lr_ratio: 1.0,
        }
    }

    /// Linear warmup over `warmup_steps`, then a cosine down to `min_lr_ratio` of the base
    /// rate at `total_steps`.
    pub fn warmup_cosine(warmup_steps: usize, total_steps: usize, min_lr_ratio: f64) -> Self {
        LrSchedule {
            warmup_steps,
            decay: Decay::Cosine,
            total_steps,
            min_lr_ratio,
        }
    }

    /// Linear warmup over `warmup_steps`, then a straight line down to `min_lr_ratio` of
    /// the base rate at `total_steps`.
    pub fn warmup_linear(warmup_steps: usize, total_steps: usize, min_lr_ratio: f64) -> Self {
        LrSchedule {
            decay: Decay::Linear,
            ..LrSchedule::warmup_cosine(warmup_steps, total_steps, min_lr_ratio)
        }
    }

    /// The factor of the base rate for optimizer step `step` (from 0).
    pub fn factor(&self, step: usize) -> f64 {
        if step < self.warmup_steps {
            return (step + 1) as f64 / self.warmup_steps as f64;
        }
        let floor = self.min_lr_ratio;
        let span = self.total_steps.saturating_sub(self.warmup_steps).max(1) as f64;
        let progress = ((step - self.warmup_steps) as f64 / span).min(1.0);
        match self.decay {
            Decay::Constant => 1.0,
            Decay::Cosine => {
                floor + (1.0 - floor) * 0.5 * (1.0 + (std::f64::consts::PI * progress).cos())
            }
            Decay::Linear => floor + (1.0 - floor) * (1.0 - progress),
        }
    }

    /// Checks the schedule's numbers; the message names the bad field.
    pub fn validate(&self) -> Result<(), String> {
        if !(0.0..=1.0).contains(&self.min_lr_ratio) {
            return Err(format!(
                "min_lr_ratio must be in [0, 1], got {}",
                self.min_lr_ratio
            ));
        }
        if self.decay != Decay::Constant && self.total_steps <= self.warmup_steps {
            return Err(format!(
                "total_steps ({}) must exceed warmup_steps ({}) for a {} decay",
                self.total_steps,
                self.warmup_steps,
                self.decay.name()
            ));
        }
        Ok(())
    }
}

impl std::fmt::Display for LrSchedule {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.decay {
            Decay::Constant if self.warmup_steps == 0 => write!(f, "constant"),
            Decay::Constant => write!(f, "{} warmup steps, then constant", self.warmup_steps),
            decay => write!(
                f,
                "{} warmup steps, {} decay to {} of the rate at step {}",
                self.warmup_steps,
                decay.name(),
                self.min_lr_ratio,
                self.total_steps
            ),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn warmup_then_cosine_to_the_floor() {
        let s = LrSchedule::warmup_cosine(4, 14, 0.1);
        let f: Vec<f64> = (0..16).map(|i| s.factor(i)).collect();
        assert_eq!(&f[..4], &[0.25, 0.5, 0.75, 1.0]);
        assert_eq!(f[4], 1.0);
        // Halfway through the decay: halfway between 1 and the floor.
        assert!((f[9] - 0.55).abs() < 1e-12, "{}", f[9]);
        assert!((f[14] - 0.1).abs() < 1e-12 && (f[15] - 0.1).abs() < 1e-12);
        assert!(f[4..15].windows(2).all(|w| w[1] < w[0]));
    }

    #[test]
    fn linear_and_constant() {
        let s = LrSchedule::warmup_linear(0, 10, 0.0);
        assert_eq!(s.factor(0), 1.0);
        assert!((s.factor(5) - 0.5).abs() < 1e-12);
        assert_eq!(s.factor(10), 0.0);
        assert_eq!(s.factor(99), 0.0);
        assert!((0..50).all(|i| LrSchedule::constant().factor(i) == 1.0));
        assert_eq!(LrSchedule::constant().to_string(), "constant");
        assert_eq!(
            LrSchedule::warmup_cosine(40, 400, 0.1).to_string(),
            "40 warmup steps, cosine decay to 0.1 of the rate at step 400"
        );
    }

    #[test]
    fn bad_numbers_are_named() {
        let e = LrSchedule::warmup_cosine(10, 10, 0.1)
            .validate()
            .unwrap_err();
        assert!(e.contains("total_steps"), "{e}");
        let e = LrSchedule::warmup_cosine(1, 10, 2.0)
            .validate()
            .unwrap_err();
        assert!(e.contains("min_lr_ratio"), "{e}");
        assert!(LrSchedule::constant().validate().is_ok());
    }
}
