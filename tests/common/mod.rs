//! Shared test fixtures: a small regression data set and an MLP whose layer sizes divide by
//! none of 2, 3 and 4.

use candle_core::{DType, Device, Tensor, D};
use candle_nn::{Linear, Module};
use wick::core::Wrapped;
use wick::core::{
    Algorithm, Call, Collective, CollectiveError, OptimizerConfig, ShardedContext, TrainModule,
    Work,
};
use wick::trainer::{Attached, DataLoader, Dataset, Trainer};
use wick_core::Position;

/// 96 samples of 5 features and one target, deterministic.
pub struct Regression {
    x: Vec<f32>,
    y: Vec<f32>,
}

pub const FEATURES: usize = 5;

impl Regression {
    pub fn new(n: usize) -> Self {
        let x: Vec<f32> = (0..n * FEATURES)
            .map(|i| ((i * 37 % 101) as f32 / 50.0) - 1.0)
            .collect();
        let y = (0..n)
            .map(|s| {
                let r = &x[s * FEATURES..(s + 1) * FEATURES];
                (r[0] * r[1]).sin() + 0.5 * r[2] - r[3] * r[4]
            })
            .collect();
        Regression { x, y }
    }
}

impl Dataset for Regression {
    type Batch = (Tensor, Tensor);
    fn len(&self) -> usize {
        self.y.len()
    }
    fn batch(&self, indices: &[usize], device: &Device) -> candle_core::Result<Self::Batch> {
        let x: Vec<f32> = indices
            .iter()
            .flat_map(|&i| self.x[i * FEATURES..(i + 1) * FEATURES].to_vec())
            .collect();
        let y: Vec<f32> = indices.iter().map(|&i| self.y[i]).collect();
        Ok((
            Tensor::from_vec(x, (indices.len(), FEATURES), device)?,
            Tensor::from_vec(y, (indices.len(), 1), device)?,
        ))
    }
}

/// 5 -> 7 -> 13 -> 1: weights of 35, 91 and 13 elements, biases of 7, 13 and 1.
#[derive(Clone)]
pub struct Mlp {
    pub optimizer: OptimizerConfig,
    /// Pretrained weights to initialise from instead of the initializers.
    pub weights: Option<std::sync::Arc<dyn wick::core::WeightSource>>,
    /// Counts every run of a layer's forward, on every rank (replicas share it).
    pub runs: std::sync::Arc<std::sync::atomic::AtomicUsize>,
    layers: Vec<Wrapped<Linear>>,
}

/// The MLP's layer widths.
pub const DIMS: [usize; 4] = [FEATURES, 7, 13, 1];

impl Mlp {
    pub fn new(optimizer: OptimizerConfig) -> Self {
        Mlp {
            optimizer,
            weights: None,
            runs: std::sync::Arc::default(),
            layers: Vec::new(),
        }
    }

    pub fn forward(&self, x: &Tensor) -> candle_core::Result<Tensor> {
        let mut h = x.clone();
        for (i, l) in self.layers.iter().enumerate() {
            let runs = self.runs.clone();
            h = l.apply(&h, move |layer, x| {
                runs.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                layer.forward(x)
            })?;
            if i + 1 < self.layers.len() {
                h = h.tanh()?;
            }
        }
        Ok(h)
    }

    pub fn loss(&self, batch: &(Tensor, Tensor)) -> candle_core::Result<Tensor> {
        let pred = self.forward(&batch.0)?;
        (pred - &batch.1)?.sqr()?.mean_all()
    }

    /// Every parameter's values, flattened, in layer order (gathers under zero3: call it on
    /// every rank at the same point).
    pub fn parameters(&self) -> Vec<Vec<f32>> {
        self.layers
            .iter()
            .map(|l| l.get().unwrap())
            .flat_map(|l| {
                [
                    l.weight().flatten_all().unwrap().to_vec1().unwrap(),
                    l.bias().unwrap().to_vec1().unwrap(),
                ]
            })
            .collect()
    }

    pub fn is_built(&self) -> bool {
        !self.layers.is_empty()
    }
}

impl TrainModule for Mlp {
    type Batch = (Tensor, Tensor);

    fn configure_sharded_model(&mut self, ctx: &ShardedContext) -> candle_core::Result<()> {
        if let Some(w) = &self.weights {
            ctx.load_weights(w.clone());
        }
        self.layers = (0..3)
            .map(|i| {
                ctx.wrap(&format!("l{i}"), move |vb| {
                    candle_nn::linear(DIMS[i], DIMS[i + 1], vb)
                })
            })
            .collect::<candle_core::Result<_>>()?;
        Ok(())
    }

    fn configure_optimizers(&self) -> OptimizerConfig {
        self.optimizer.clone()
    }

    fn training_step(&mut self, batch: &Self::Batch, _: usize) -> candle_core::Result<Tensor> {
        self.loss(batch)
    }

    fn validation_step(
        &mut self,
        batch: &Self::Batch,
        _: usize,
    ) -> candle_core::Result<Option<Tensor>> {
        Ok(Some(self.loss(batch)?))
    }

    fn test_step(&mut self, batch: &Self::Batch, _: usize) -> candle_core::Result<Option<Tensor>> {
        Ok(Some(self.loss(batch)?))
    }

    fn predict_step(&mut self, batch: &Self::Batch, _: usize) -> candle_core::Result<Tensor> {
        self.forward(&batch.0)?.squeeze(D::Minus1)
    }
}

/// The MLP knowing its rank, with losses shaped for a test: the training loss multiplied
/// by a factor (and by another at one batch on one rank, [`RankedMlp::with_spike`]), the
/// validation loss scripted per pass and rank ([`RankedMlp::with_val_script`]).
#[derive(Clone)]
pub struct RankedMlp {
    pub mlp: Mlp,
    factor: f64,
    /// (rank, batch index in the epoch, factor).
    spike: Option<(usize, usize, f64)>,
    /// The validation loss of (pass from 1, rank).
    val_script: Option<fn(usize, usize) -> f64>,
    passes: usize,
    rank: usize,
}

impl RankedMlp {
    /// The MLP with its training loss times `factor`.
    pub fn scaled(optimizer: OptimizerConfig, factor: f64) -> Self {
        RankedMlp {
            mlp: Mlp::new(optimizer),
            factor,
            spike: None,
            val_script: None,
            passes: 0,
            rank: 0,
        }
    }

    /// Multiplies batch `batch` on rank `rank` by `factor` instead.
    pub fn with_spike(mut self, rank: usize, batch: usize, factor: f64) -> Self {
        self.spike = Some((rank, batch, factor));
        self
    }

    /// Rank r's validation loss at pass p (from 1) is `script(p, r)`.
    pub fn with_val_script(mut self, script: fn(usize, usize) -> f64) -> Self {
        self.val_script = Some(script);
        self
    }
}

impl TrainModule for RankedMlp {
    type Batch = (Tensor, Tensor);

    fn configure_sharded_model(&mut self, ctx: &ShardedContext) -> candle_core::Result<()> {
        self.rank = ctx.rank();
        self.mlp.configure_sharded_model(ctx)
    }

    fn configure_optimizers(&self) -> OptimizerConfig {
        self.mlp.configure_optimizers()
    }

    fn training_step(&mut self, batch: &Self::Batch, b: usize) -> candle_core::Result<Tensor> {
        let factor = match self.spike {
            Some((rank, at, spike)) if (rank, at) == (self.rank, b) => spike,
            _ => self.factor,
        };
        self.mlp.loss(batch)?.affine(factor, 0.0)
    }

    fn validation_step(
        &mut self,
        batch: &Self::Batch,
        b: usize,
    ) -> candle_core::Result<Option<Tensor>> {
        let Some(script) = self.val_script else {
            return self.mlp.validation_step(batch, b);
        };
        if b == 0 {
            self.passes += 1;
        }
        let value = script(self.passes, self.rank) as f32;
        Ok(Some(Tensor::new(value, batch.0.device())?))
    }
}

/// The MLP in a module that cannot be cloned (it holds a channel's receiving end): it trains
/// as the one rank of its process, never as several threads.
pub struct SoloMlp {
    pub mlp: Mlp,
    _not_clone: std::sync::mpsc::Receiver<()>,
}

impl SoloMlp {
    pub fn new(optimizer: OptimizerConfig) -> Self {
        SoloMlp {
            mlp: Mlp::new(optimizer),
            _not_clone: std::sync::mpsc::channel().1,
        }
    }
}

impl wick::trainer::Replicate for SoloMlp {
    fn replica(&self) -> Option<Self> {
        None
    }
}

impl TrainModule for SoloMlp {
    type Batch = (Tensor, Tensor);

    fn configure_sharded_model(&mut self, ctx: &ShardedContext) -> candle_core::Result<()> {
        self.mlp.configure_sharded_model(ctx)
    }

    fn configure_optimizers(&self) -> OptimizerConfig {
        self.mlp.configure_optimizers()
    }

    fn training_step(&mut self, batch: &Self::Batch, i: usize) -> candle_core::Result<Tensor> {
        self.mlp.training_step(batch, i)
    }
}

/// The AdamW every equivalence test uses.
pub fn adamw() -> OptimizerConfig {
    OptimizerConfig::from(Algorithm::AdamW {
        lr: 0.01,
        beta1: 0.9,
        beta2: 0.999,
        eps: 1e-8,
        weight_decay: 0.01,
    })
}

/// The SGD (momentum, weight decay) the equivalence tests use.
pub fn sgd_momentum() -> OptimizerConfig {
    OptimizerConfig::from(Algorithm::Sgd {
        lr: 0.05,
        momentum: 0.9,
        nesterov: false,
        weight_decay: 0.01,
    })
}

/// A trainer with no logger and no progress bar.
pub fn quiet_trainer(devices: usize, strategy: &str, steps: usize) -> Trainer {
    quiet_trainer_with(
        devices,
        wick::strategies::strategy_by_name(strategy).unwrap(),
        steps,
    )
}

/// [`quiet_trainer`] with a strategy instance (non-default options).
pub fn quiet_trainer_with(
    devices: usize,
    strategy: Box<dyn wick::core::Strategy>,
    steps: usize,
) -> Trainer {
    quiet_builder(devices, strategy, steps).build().unwrap()
}

/// The options of [`quiet_trainer_with`], to add to.
pub fn quiet_builder(
    devices: usize,
    strategy: Box<dyn wick::core::Strategy>,
    steps: usize,
) -> wick::trainer::TrainerBuilder {
    Trainer::builder()
        .devices(devices)
        .strategy(strategy)
        .max_steps(steps)
        .seed(42)
        .no_logger()
        .progress(false)
        .model_summary(false)
}

/// Global batches of 12: divisible by 1, 2, 3 and 4 ranks.
pub fn loader() -> DataLoader<Regression> {
    DataLoader::new(Regression::new(96), 12)
}

/// Trains a fresh MLP and returns its parameters, in full, in registration order.
pub fn train(
    devices: usize,
    strategy: &str,
    optimizer: OptimizerConfig,
    steps: usize,
) -> Vec<Vec<f32>> {
    let mut model = Attached::new(Mlp::new(optimizer));
    let mut trainer = quiet_trainer(devices, strategy, steps);
    trainer.fit(&mut model, &loader(), None).unwrap();
    full_parameters(&mut trainer, &mut model)
}

/// The parameters `trainer` configured for `module`, flattened, checking the registration
/// order.
pub fn full_parameters<M>(trainer: &mut Trainer, module: &mut Attached<M>) -> Vec<Vec<f32>> {
    let params = trainer.full_parameters(module).unwrap();
    let names: Vec<&str> = params.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(
        names,
        [
            "l0.weight",
            "l0.bias",
            "l1.weight",
            "l1.bias",
            "l2.weight",
            "l2.bias"
        ]
    );
    params
        .iter()
        .map(|(_, t)| t.flatten_all().unwrap().to_vec1().unwrap())
        .collect()
}

/// Largest absolute difference between two parameter lists.
pub fn max_diff(a: &[Vec<f32>], b: &[Vec<f32>]) -> f32 {
    assert_eq!(a.len(), b.len());
    a.iter()
        .zip(b)
        .flat_map(|(x, y)| {
            assert_eq!(x.len(), y.len());
            x.iter().zip(y).map(|(p, q)| (p - q).abs())
        })
        .fold(0.0, f32::max)
}

/// A world that records every call (name and length) before passing it on, and the wait
/// of every call started ahead (`wait:` and the call's entry).
pub struct Recording {
    pub inner: std::sync::Arc<dyn wick::core::Collective>,
    pub log: std::sync::Arc<std::sync::Mutex<Vec<String>>>,
}

impl Recording {
    /// `world`, with every call recorded.
    pub fn over(world: impl Collective + 'static) -> std::sync::Arc<Self> {
        std::sync::Arc::new(Recording {
            inner: std::sync::Arc::new(world),
            log: Default::default(),
        })
    }

    /// The entry of `call`: its name (`_start` added when `started`) and its output's
    /// length in elements; `None` for a barrier, which is not recorded.
    fn entry(call: &Call<'_>, started: bool) -> Option<String> {
        let (name, len) = match call {
            Call::AllGather { full, .. } => ("all_gather", full.elem_count()),
            Call::AllGatherHost { shard, full } => {
                ("all_gather", full.len() / shard.dtype().size_in_bytes())
            }
            Call::ReduceScatter { full, .. } => ("reduce_scatter", full.elem_count()),
            Call::ReduceScatterParts { full, .. } => ("reduce_scatter_parts", full.elem_count()),
            Call::AllReduce { tensor, .. } => ("all_reduce", tensor.elem_count()),
            Call::Broadcast { tensor, .. } => ("broadcast", tensor.elem_count()),
            Call::Barrier => return None,
        };
        let suffix = if started { "_start" } else { "" };
        Some(format!("{name}{suffix}({len})"))
    }
}

impl Collective for Recording {
    fn position(&self) -> Position {
        self.inner.position()
    }
    fn run(&self, call: Call<'_>) -> Result<(), CollectiveError> {
        if let Some(entry) = Self::entry(&call, false) {
            self.log.lock().unwrap().push(entry);
        }
        self.inner.run(call)
    }
    fn start(&self, call: Call<'_>) -> Result<Work, CollectiveError> {
        let Some(entry) = Self::entry(&call, true) else {
            return self.inner.start(call);
        };
        self.log.lock().unwrap().push(entry.clone());
        let (log, work) = (self.log.clone(), self.inner.start(call)?);
        Ok(Work::pending(move || {
            let done = work.wait();
            log.lock().unwrap().push(format!("wait:{entry}"));
            done
        }))
    }
    fn split(&self, color: usize) -> Result<std::sync::Arc<dyn Collective>, CollectiveError> {
        // Sub-worlds are not recorded: the log shows this channel's calls only.
        self.inner.split(color)
    }
}

/// How far the parameters `got` ended from `want`, relative to how far `want` moved from
/// `init`: the norm of `got - want` over the norm of `want - init`, over every parameter
/// all three hold. A bound on it bounds the error of the update itself, whatever the
/// learning rate and number of steps, so the reference always moves far more than the
/// tolerance (a bound of 0.1 is a tenth of the movement). Per-element bounds cannot do
/// that for 16-bit compute under Adam, whose near-zero gradients flip sign with rounding
/// and move an element a full learning rate either way.
pub fn relative_update_error<'a>(
    got: impl IntoIterator<Item = (&'a String, &'a Tensor)>,
    want: impl Fn(&str) -> Option<Tensor>,
    init: impl Fn(&str) -> Option<Tensor>,
) -> f32 {
    let squared = |a: &Tensor, b: &Tensor| -> f64 {
        let d = (a.to_dtype(DType::F32).unwrap() - b.to_dtype(DType::F32).unwrap()).unwrap();
        d.sqr()
            .unwrap()
            .sum_all()
            .unwrap()
            .to_scalar::<f32>()
            .unwrap() as f64
    };
    let (mut error, mut moved) = (0f64, 0f64);
    for (name, p) in got {
        if let (Some(w), Some(i)) = (want(name), init(name)) {
            error += squared(p, &w);
            moved += squared(&w, &i);
        }
    }
    assert!(moved > 0.0, "the reference did not move");
    (error / moved).sqrt() as f32
}

/// One `#[test]` per strategy from one body, as candle's `test_device!` makes one per
/// device: `per_strategy!(body: ddp, zero1)` defines the tests `ddp` and `zero1`, each
/// calling `body` with its strategy's name. Put it in a module named for what the body
/// checks, so that a failure reads `matches_single::zero2`.
#[macro_export]
macro_rules! per_strategy {
    ($body:path: $($strategy:ident),+ $(,)?) => {
        $(
            #[test]
            fn $strategy() {
                $body(stringify!($strategy));
            }
        )+
    };
}
