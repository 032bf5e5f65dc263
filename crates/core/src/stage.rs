//! The four things a trainer can run.

use std::fmt;

/// A trainer entry point; hooks that run for several of them receive it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Stage {
    /// Training, with validation as configured.
    Fit,
    /// One pass over validation data.
    Validate,
    /// One pass over test data.
    Test,
    /// One pass producing predictions.
    Predict,
}

/// The lower-case name, as used in logs and metric names.
impl fmt::Display for Stage {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Stage::Fit => "fit",
            Stage::Validate => "validate",
            Stage::Test => "test",
            Stage::Predict => "predict",
        })
    }
}
