//! wick-strategies alone: a hand-written training loop driving the `Ddp` strategy over a
//! one-rank world, fitting y = 2x - 1.
//!
//! `cargo run -p wick-strategies --example ddp_loop`

use candle_core::{Device, Module, Tensor};
use std::sync::Arc;
use wick_strategies::{Ddp, Error, GradSync, OptimizerConfig, SoloWorld, StepOptions, Strategy};

fn main() -> Result<(), Error> {
    // The strategy opens this rank's sharding context; the parameters are created in it,
    // and closing it gives the rank's part, which holds them (and the optimizer it is given).
    let open = Ddp::new().open(Arc::new(SoloWorld), Device::Cpu, 7)?;
    let layer = {
        let ctx = open.context();
        let _inside = ctx.enter();
        candle_nn::linear(1, 1, ctx.var_builder().pp("fit"))?
    };
    let mut ddp = open.close()?;
    ddp.configure_optimizer(&OptimizerConfig::sgd(0.1), StepOptions::default());

    let x = Tensor::new(&[[0f32], [1.], [2.], [3.]], &Device::Cpu)?;
    let y = Tensor::new(&[[-1f32], [1.], [3.], [5.]], &Device::Cpu)?;
    for step in 0..200 {
        let loss = (layer.forward(&x)? - &y)?.sqr()?.mean_all()?;
        ddp.backward(&loss, GradSync::Reduce)?;
        ddp.optimizer_step(0.1)?;
        if step % 50 == 0 {
            println!("step {step}: loss {:.5}", loss.to_scalar::<f32>()?);
        }
    }
    for (name, value) in ddp.full_parameters()? {
        println!("{name} = {}", value.flatten_all()?);
    }
    Ok(())
}
