//! wick-core alone: a custom `ParamSource` behind a `ShardedContext`, and a candle-nn layer
//! built through it. This is the contract a strategy implements.
//!
//! `cargo run -p wick-core --example param_source`

use candle_core::{DType, Device, Module, Shape, Tensor};
use std::sync::{Arc, Mutex};
use wick_core::{ParamRequest, ParamSource, ShardedContext, SoloWorld};

/// Creates every parameter filled with 0.5 and remembers what was asked for.
#[derive(Default)]
struct Recording(Mutex<Vec<(String, Shape)>>);

impl ParamSource for Recording {
    fn get_or_create(&self, request: ParamRequest<'_>) -> candle_core::Result<Tensor> {
        let entry = (request.name.to_string(), request.shape.clone());
        self.0.lock().unwrap().push(entry);
        Tensor::full(0.5f32, request.shape, request.device)?.to_dtype(request.dtype)
    }

    fn contains(&self, name: &str) -> bool {
        self.0.lock().unwrap().iter().any(|(n, _)| n == name)
    }
}

fn main() -> candle_core::Result<()> {
    let source = Arc::new(Recording::default());
    let ctx = ShardedContext::new(source.clone(), Arc::new(SoloWorld), Device::Cpu, "example");
    let layer = {
        let _open = ctx.enter();
        candle_nn::linear(3, 2, ctx.var_builder().pp("proj"))?
    };
    let y = layer.forward(&Tensor::ones((1, 3), DType::F32, &Device::Cpu)?)?;
    println!("requested: {:?}", source.0.lock().unwrap());
    println!("output: {y}");
    // Closed now: a late request is refused.
    assert!(ctx.var_builder().get(4, "late").is_err());
    Ok(())
}
