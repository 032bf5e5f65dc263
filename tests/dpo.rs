//! Preference tuning against TRL's `DPOTrainer` (tests/fixtures/hf/dpo, made by
//! scripts/dpo_fixtures.py): on eight pairs over the Llama fixture, the loss, every
//! trainable parameter's gradient and TRL's metrics of the first step, and 10 AdamW steps,
//! for DPO's sigmoid loss and IPO, tuning the whole model (its reference computed once
//! before training, by wick) and LoRA (its reference the model with the adapters off),
//! under single, ddp, zero3 and fsdp at W = 2 and 4.

use crate::models::{fixtures, max_diff, plain_sgd, recording_builder, recording_trainer, Losses};
use candle_core::{DType, Device, Tensor};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use wick::core::{
    Algorithm, Callback, OptimizerConfig, PreferenceBatch, RunState, Strategy, TokenBatch,
    IGNORE_INDEX,
};
use wick::models::{CausalLm, PreferenceConfig, PreferenceLm, PreferenceLoss, PREFERENCE_METRICS};
use wick::strategies::{strategy_by_name, Fsdp, FsdpSharding};
use wick::trainer::{Attached, DataLoader, Dataset};

/// The bound on the loss and every gradient of the first step.
const STEP_BOUND: f32 = 1e-5;
/// The bound on the losses and parameters after 10 AdamW steps.
const STEPS_BOUND: f32 = 1e-4;

fn fixture() -> HashMap<String, Tensor> {
    let path = fixtures().join("dpo/reference.safetensors");
    candle_core::safetensors::load(path, &Device::Cpu).unwrap()
}

/// TRL's collated batch as wick's rows: inputs are the ids but the last, targets the ids
/// shifted by one, counted where they are completion tokens.
fn rows(f: &HashMap<String, Tensor>) -> TokenBatch {
    let ids = f["ids"].to_dtype(DType::U32).unwrap();
    let mask = f["completion_mask"].to_dtype(DType::U32).unwrap();
    let t = ids.dim(1).unwrap() - 1;
    let inputs = ids.narrow(1, 0, t).unwrap();
    let next = ids.narrow(1, 1, t).unwrap();
    let counted = mask.narrow(1, 1, t).unwrap();
    let ignored = Tensor::full(IGNORE_INDEX, next.dims(), &Device::Cpu).unwrap();
    let targets = counted
        .ne(0u32)
        .unwrap()
        .where_cond(&next, &ignored)
        .unwrap();
    TokenBatch::new(inputs.contiguous().unwrap(), targets.contiguous().unwrap())
}

/// The pairs of TRL's batch (its chosen rows, then its rejected rows), each a sample,
/// with the reference's log-probabilities where given.
struct Pairs {
    rows: TokenBatch,
    reference: Option<Tensor>,
}

impl Pairs {
    fn count(&self) -> usize {
        self.rows.ids.dim(0).unwrap() / 2
    }
}

impl Dataset for Pairs {
    type Batch = PreferenceBatch;

    fn len(&self) -> usize {
        self.count()
    }

    fn batch(&self, idx: &[usize], dev: &Device) -> candle_core::Result<PreferenceBatch> {
        let n = self.count();
        let order: Vec<u32> = (idx.iter().map(|&i| i as u32))
            .chain(idx.iter().map(|&i| (n + i) as u32))
            .collect();
        let order = Tensor::new(order, &Device::Cpu)?;
        let pick = |t: &Tensor| t.index_select(&order, 0)?.to_device(dev);
        let rows = TokenBatch::new(pick(&self.rows.ids)?, pick(&self.rows.targets)?);
        PreferenceBatch::new(rows, self.reference.as_ref().map(pick).transpose()?)
    }
}

/// A case of the fixture: `full_sigmoid`, `full_ipo`, `lora_sigmoid`, `lora_ipo`.
#[derive(Clone, Copy)]
struct Case(&'static str);

impl Case {
    const ALL: [Case; 4] = [
        Case("full_sigmoid"),
        Case("full_ipo"),
        Case("lora_sigmoid"),
        Case("lora_ipo"),
    ];

    fn lora(self) -> bool {
        self.0.starts_with("lora")
    }

    fn config(self, f: &HashMap<String, Tensor>) -> PreferenceConfig {
        let beta = f["beta"].to_vec1::<f32>().unwrap()[0] as f64;
        let loss = match self.0.ends_with("ipo") {
            true => PreferenceLoss::Ipo,
            false => PreferenceLoss::Sigmoid,
        };
        PreferenceConfig { loss, beta }
    }

    /// The model as training starts: the Llama fixture, with the fixture's adapter under
    /// LoRA.
    fn model(self, f: &HashMap<String, Tensor>, optimizer: OptimizerConfig) -> PreferenceLm {
        let mut lm = CausalLm::from_pretrained(fixtures().join("llama")).unwrap();
        if self.lora() {
            lm = lm
                .with_peft_adapter(fixtures().join("dpo/adapter"))
                .unwrap();
        }
        PreferenceLm::new(lm.with_optimizer(optimizer), self.config(f)).unwrap()
    }

    /// TRL's value of `what` (`loss`, `grad.<name>`, ...) in this case.
    fn get<'f>(self, f: &'f HashMap<String, Tensor>, what: &str) -> &'f Tensor {
        &f[&format!("{}.{what}", self.0)]
    }
}

/// Rank 0's TRL metrics of each step.
#[derive(Clone, Default)]
struct Metrics(Arc<Mutex<Vec<Vec<f64>>>>);

impl Callback for Metrics {
    fn on_train_batch_end(&mut self, state: &RunState) -> candle_core::Result<()> {
        if state.rank == 0 {
            let values = PREFERENCE_METRICS.map(|m| state.metrics[m]);
            self.0.lock().unwrap().push(values.to_vec());
        }
        Ok(())
    }
}

/// What a run gave: rank 0's losses and metrics of each step, and the trained
/// parameters by name.
struct Run {
    losses: Vec<f64>,
    metrics: Vec<Vec<f64>>,
    params: HashMap<String, Tensor>,
}

/// `steps` steps of the case's model with `optimizer`, each over all eight pairs.
fn run(
    case: Case,
    (devices, strategy): (usize, Box<dyn Strategy>),
    pairs: Pairs,
    (optimizer, steps): (OptimizerConfig, usize),
) -> Run {
    let f = fixture();
    let (losses, metrics) = (Losses::default(), Metrics::default());
    let mut t = recording_builder(devices, strategy, steps, &losses)
        .callback(metrics.clone())
        .build()
        .unwrap();
    let mut m = Attached::new(case.model(&f, optimizer));
    let batch = pairs.count();
    t.fit(&mut m, &DataLoader::new(pairs, batch), None).unwrap();
    let params = t.full_parameters(&mut m).unwrap().into_iter().collect();
    let (losses, metrics) = (
        losses.0.lock().unwrap().clone(),
        metrics.0.lock().unwrap().clone(),
    );
    Run {
        losses,
        metrics,
        params,
    }
}

/// The reference's log-probabilities of the rows as wick computes them before training:
/// the initial model's, by a prediction pass (`[pairs, 2]`, as `[2 × pairs]`).
fn precomputed_reference(case: Case, rows: &TokenBatch) -> Tensor {
    let f = fixture();
    let mut t = recording_trainer(2, strategy_by_name("ddp").unwrap(), 1, &Losses::default());
    let mut m = Attached::new(case.model(&f, plain_sgd()));
    let pairs = Pairs {
        rows: rows.clone(),
        reference: None,
    };
    let loader = DataLoader::new(pairs, 4).without_shuffle();
    let parts = t.predict(&mut m, &loader).unwrap();
    let per_pair = Tensor::cat(&parts, 0).unwrap();
    Tensor::cat(
        &[
            per_pair.get_on_dim(1, 0).unwrap(),
            per_pair.get_on_dim(1, 1).unwrap(),
        ],
        0,
    )
    .unwrap()
}

/// The pairs of the case: under full tuning with wick's precomputed reference.
fn pairs(case: Case, f: &HashMap<String, Tensor>) -> Pairs {
    let rows = rows(f);
    let reference = (!case.lora()).then(|| {
        let wick = precomputed_reference(case, &rows);
        let trl = case.get(f, "reference");
        let diff = max_diff(&wick, trl);
        assert!(
            diff <= 1e-4,
            "{}: the precomputed reference is {diff} from TRL's",
            case.0
        );
        wick
    });
    Pairs { rows, reference }
}

/// The parameters as training starts, by wick's names: the Llama fixture's and the
/// adapter's.
fn initial() -> HashMap<String, Tensor> {
    let load =
        |path: &str| candle_core::safetensors::load(fixtures().join(path), &Device::Cpu).unwrap();
    let mut all = load("llama/model.safetensors");
    let adapter = load("dpo/adapter/adapter_model.safetensors");
    all.extend(
        adapter
            .into_iter()
            .map(|(k, v)| (k.replace("base_model.model.", ""), v)),
    );
    all
}

/// One device, and sharded at W = 2 and 4.
fn strategies() -> Vec<(String, usize, Box<dyn Strategy>)> {
    let mut all: Vec<(String, usize, Box<dyn Strategy>)> =
        vec![("single".into(), 1, strategy_by_name("single").unwrap())];
    for w in [2, 4] {
        for name in ["ddp", "zero3"] {
            all.push((format!("{name} W={w}"), w, strategy_by_name(name).unwrap()));
        }
        let fsdp = Fsdp::new(FsdpSharding::FullShard).build();
        all.push((format!("fsdp W={w}"), w, fsdp));
    }
    all
}

/// The trainable parameters of the case's fixture, by name, with `prefix` (`grad.`,
/// `final.`).
fn trained<'f>(
    case: Case,
    f: &'f HashMap<String, Tensor>,
    prefix: &str,
) -> Vec<(String, &'f Tensor)> {
    let key = format!("{}.{prefix}", case.0);
    let mut all: Vec<(String, &Tensor)> = (f.iter())
        .filter_map(|(k, v)| k.strip_prefix(&key).map(|n| (n.to_string(), v)))
        .collect();
    all.sort_by(|a, b| a.0.cmp(&b.0));
    assert!(!all.is_empty());
    all
}

#[test]
fn the_first_step_matches_trl_loss_gradients_and_metrics() {
    let f = fixture();
    let initial = initial();
    for case in Case::ALL {
        let want_loss = case.get(&f, "loss").to_vec1::<f32>().unwrap()[0] as f64;
        let want_metrics = case.get(&f, "metrics").to_vec1::<f32>().unwrap();
        let grads = trained(case, &f, "grad.");
        let (mut worst_loss, mut worst_grad, mut worst_metric) = (0f64, 0f32, 0f64);
        for (name, devices, strategy) in strategies() {
            let at = format!("{} {name}", case.0);
            let got = run(case, (devices, strategy), pairs(case, &f), (plain_sgd(), 1));
            let loss_diff = (got.losses[0] - want_loss).abs();
            assert!(
                loss_diff <= STEP_BOUND as f64,
                "{at}: loss {} vs TRL's {want_loss}",
                got.losses[0]
            );
            worst_loss = worst_loss.max(loss_diff);
            for (metric, (&got, &want)) in PREFERENCE_METRICS
                .iter()
                .zip(got.metrics[0].iter().zip(&want_metrics))
            {
                // log-probabilities are sums of ~25 terms of ~5: relative to them.
                let bound = STEP_BOUND as f64 * (want as f64).abs().max(1.0);
                assert!(
                    (got - want as f64).abs() <= bound,
                    "{at}: {metric} {got} vs TRL's {want}"
                );
                worst_metric =
                    worst_metric.max((got - want as f64).abs() / bound * STEP_BOUND as f64);
            }
            for (param, want) in &grads {
                // SGD at rate 1: the parameter moved by minus its gradient.
                let grad = (&initial[param] - &got.params[param]).unwrap();
                let diff = max_diff(&grad, want);
                assert!(
                    diff <= STEP_BOUND,
                    "{at}: the gradient of {param} is {diff} from TRL's"
                );
                worst_grad = worst_grad.max(diff);
            }
        }
        eprintln!(
            "{}: worst over the strategies: loss {worst_loss:.1e}, gradient {worst_grad:.1e}, \
             metric (relative) {worst_metric:.1e}",
            case.0
        );
    }
}

#[test]
fn ten_adamw_steps_match_trl() {
    let f = fixture();
    // TRL's run: AdamW at a constant 1e-3, no weight decay (transformers' Trainer exempts
    // norms and biases from it, wick's AdamW does not), no clipping.
    let adamw = OptimizerConfig::from(Algorithm::AdamW {
        lr: 1e-3,
        beta1: 0.9,
        beta2: 0.999,
        eps: 1e-8,
        weight_decay: 0.0,
    });
    for case in Case::ALL {
        let want = case.get(&f, "steps.losses").to_vec1::<f32>().unwrap();
        let finals = trained(case, &f, "final.");
        let (mut worst_loss, mut worst_param) = (0f64, 0f32);
        for (name, devices, strategy) in strategies() {
            let at = format!("{} {name}", case.0);
            let got = run(
                case,
                (devices, strategy),
                pairs(case, &f),
                (adamw.clone(), 10),
            );
            for (step, (&got, &want)) in got.losses.iter().zip(&want).enumerate() {
                let diff = (got - want as f64).abs();
                let bound = STEPS_BOUND as f64 * (want as f64).abs().max(1.0);
                assert!(
                    diff <= bound,
                    "{at}: step {} loss {got} vs TRL's {want}",
                    step + 1
                );
                worst_loss = worst_loss.max(diff / bound * STEPS_BOUND as f64);
            }
            for (param, want) in &finals {
                let diff = max_diff(&got.params[param], want);
                assert!(
                    diff <= STEPS_BOUND,
                    "{at}: {param} is {diff} from TRL's after 10 steps"
                );
                worst_param = worst_param.max(diff);
            }
        }
        // What the bound is set against: how far TRL's 10 steps moved the parameters.
        let start = initial();
        let moved = (finals.iter().map(|(p, want)| max_diff(&start[p], want))).fold(0f32, f32::max);
        eprintln!(
            "{}: worst over the strategies after 10 steps: loss (relative) {worst_loss:.1e}, \
             parameter {worst_param:.1e}; TRL moved them up to {moved:.1e}",
            case.0
        );
    }
}
