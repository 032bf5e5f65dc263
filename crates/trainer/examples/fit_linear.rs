//! wick-trainer alone: a `TrainModule` fitted by the `Trainer` with two ranks as threads,
//! checkpointed, and resumed on four ranks under another strategy.
//!
//! `cargo run -p wick-trainer --example fit_linear`

use candle_core::{Device, Module, Tensor};
use candle_nn::Linear;
use wick_core::{OptimizerConfig, ShardedContext, TrainModule};
use wick_trainer::{DataLoader, Dataset, ModelCheckpoint, Trainer};

/// y = 3x + 0.5 on a grid of 64 points.
struct Line;

impl Dataset for Line {
    type Batch = (Tensor, Tensor);
    fn len(&self) -> usize {
        64
    }
    fn batch(&self, indices: &[usize], device: &Device) -> candle_core::Result<Self::Batch> {
        let x: Vec<f32> = indices.iter().map(|&i| i as f32 / 64.0).collect();
        let y: Vec<f32> = x.iter().map(|x| 3.0 * x + 0.5).collect();
        Ok((
            Tensor::from_vec(x, (indices.len(), 1), device)?,
            Tensor::from_vec(y, (indices.len(), 1), device)?,
        ))
    }
}

#[derive(Clone, Default)]
struct Regressor {
    layer: Option<Linear>,
}

impl TrainModule for Regressor {
    type Batch = (Tensor, Tensor);

    fn configure_sharded_model(&mut self, ctx: &ShardedContext) -> candle_core::Result<()> {
        self.layer = Some(candle_nn::linear(1, 1, ctx.var_builder().pp("line"))?);
        Ok(())
    }

    fn configure_optimizers(&self) -> OptimizerConfig {
        OptimizerConfig::adamw(0.05)
    }

    fn training_step(&mut self, (x, y): &Self::Batch, _: usize) -> candle_core::Result<Tensor> {
        let layer = self.layer.as_ref().expect("configured before training");
        (layer.forward(x)? - y)?.sqr()?.mean_all()
    }
}

fn main() -> Result<(), wick_trainer::TrainerError> {
    // Checkpoints at the end of each run, under a fresh directory.
    let root = std::env::temp_dir().join(format!("wick-fit-linear-{}", std::process::id()));
    let data = DataLoader::new(Line, 16);
    let mut trainer = Trainer::builder()
        .devices(2)
        .strategy("ddp")
        .max_epochs(20)
        .no_logger()
        .checkpoint(ModelCheckpoint::new(&root))
        .build()?;
    trainer.fit(&mut Regressor::default(), &data, None)?;

    // Twenty more epochs from that checkpoint, on 4 ranks under zero2 this time.
    let mut trainer = Trainer::builder()
        .devices(4)
        .strategy("zero2")
        .max_epochs(40)
        .no_logger()
        .build()?;
    let mut model = Regressor::default();
    let metrics = trainer.fit_from(&mut model, &data, None, root.join("last"))?;
    let _ = std::fs::remove_dir_all(&root);
    let layer = model.layer.expect("configured");
    println!("train_loss {:.5}", metrics["train_loss"]);
    println!(
        "w = {}, b = {}",
        layer.weight().flatten_all()?,
        layer.bias().expect("bias")
    );
    Ok(())
}
