//! A checkpoint read back as pretrained weights: a model created under any strategy and
//! world size takes its slices of the saved parameters from it.

use super::Checkpoint;
use candle_core::{Result, Shape};
use std::ops::Range;
use std::sync::Arc;
use wick_core::{StateReader, WeightSource, PARAM_KIND};

/// A checkpoint's parameters as pretrained weights (see [`Checkpoint::into_weights`]).
struct CheckpointWeights(Checkpoint);

impl WeightSource for CheckpointWeights {
    fn read(&self, name: &str, shape: &Shape, range: Range<usize>) -> Result<Vec<f32>> {
        let params = [(name.to_string(), shape.clone())];
        self.0.read(PARAM_KIND, &params, range)?.to_vec1()
    }
}

impl Checkpoint {
    /// The checkpoint's parameters as pretrained weights: a model created under any
    /// strategy and world size reads its slices from them (`ShardedContext::load_weights`).
    pub fn into_weights(self) -> Arc<dyn WeightSource> {
        Arc::new(CheckpointWeights(self))
    }
}
