//! wick-trainer alone: a `TrainModule` fitted by the `Trainer` with two ranks as threads,
//! checkpointed, and resumed on four ranks under another strategy, until it has learned
//! y = 3x + 0.5 (it checks that it has).
//!
//! `cargo run -p wick-trainer --example fit_linear`

use candle_core::{Device, Module, Tensor};
use candle_nn::Linear;
use wick_trainer::{
    Algorithm, Attached, DataLoader, Dataset, LrSchedule, ModelCheckpoint, OptimizerConfig,
    ShardedContext, TrainModule, Trainer,
};

/// y = 3x + 0.5 on a grid of 64 points in [-1, 1) (centred, so that w and b are learned
/// apart: on [0, 1) they trade off against each other and take far longer).
struct Line;

impl Dataset for Line {
    type Batch = (Tensor, Tensor);
    fn len(&self) -> usize {
        64
    }
    fn batch(&self, indices: &[usize], device: &Device) -> candle_core::Result<Self::Batch> {
        let x: Vec<f32> = indices.iter().map(|&i| i as f32 / 32.0 - 1.0).collect();
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
        // No weight decay (AdamW's default 0.01 would hold w a little short of 3), and a
        // cosine over both runs' 320 steps, whose late small steps settle w and b.
        let adamw = Algorithm::AdamW {
            lr: 0.1,
            beta1: 0.9,
            beta2: 0.999,
            eps: 1e-8,
            weight_decay: 0.0,
        };
        OptimizerConfig::from(adamw).with_schedule(LrSchedule::warmup_cosine(10, 320, 0.01))
    }

    fn training_step(&mut self, (x, y): &Self::Batch, _: usize) -> candle_core::Result<Tensor> {
        let layer = self.layer.as_ref().expect("configured before training");
        (layer.forward(x)? - y)?.sqr()?.mean_all()
    }
}

fn main() -> Result<(), wick_trainer::TrainerError> {
    // The program's opt-in to wick's process-wide settings for CPU training (Candle's
    // element-wise pool, glibc's malloc thresholds); the library itself changes neither.
    // SAFETY: first in main, before any thread, so no one else touches the environment.
    unsafe { wick_trainer::wick_accelerator::tune_host_process() };
    // Checkpoints at the end of each run, under a fresh directory.
    let root = std::env::temp_dir().join(format!("wick-fit-linear-{}", std::process::id()));
    let data = DataLoader::new(Line, 16);
    let mut trainer = Trainer::builder()
        .devices(2)
        .strategy("ddp")
        .max_epochs(40)
        .no_logger()
        .checkpoint(ModelCheckpoint::new(&root))
        .build()?;
    trainer.fit(&mut Attached::new(Regressor::default()), &data, None)?;

    // Forty more epochs from that checkpoint, on 4 ranks under zero2 this time.
    let mut trainer = Trainer::builder()
        .devices(4)
        .strategy("zero2")
        .max_epochs(80)
        .no_logger()
        .build()?;
    let mut model = Attached::new(Regressor::default());
    let metrics = trainer.fit_from(&mut model, &data, None, root.join("last"))?;
    let _ = std::fs::remove_dir_all(&root);
    let layer = model.into_inner().layer.expect("configured");
    let w = layer.weight().flatten_all()?.to_vec1::<f32>()?[0];
    let b = layer.bias().expect("bias").to_vec1::<f32>()?[0];
    println!(
        "train_loss {:.6}: w = {w:.4}, b = {b:.4}",
        metrics["train_loss"]
    );
    assert!(
        (w - 3.0).abs() < 0.01 && (b - 0.5).abs() < 0.01,
        "y = 3x + 0.5 not learned: w = {w}, b = {b}"
    );
    Ok(())
}
