//! Packing that cannot contaminate: for every family, a packed batch (whole examples one
//! after another in each row, positions restarting at each, the rest padding) has the loss
//! and every gradient of its examples run one at a time (a batch of one, no padding), under
//! every strategy; and 10 AdamW steps of a packed run equal those of an unpacked run that
//! sees the same examples, one per row.

use crate::models::{
    max_diff, plain_sgd, pretrained, recording_trainer, reference, Losses, FAMILIES,
};
use candle_core::{Device, Tensor};
use std::collections::HashMap;
use wick::core::{OptimizerConfig, Strategy, TokenBatch, IGNORE_INDEX};
use wick::strategies::{strategy_by_name, Fsdp, FsdpSharding};
use wick::trainer::{best_fit_decreasing, Attached, DataLoader, Dataset};

/// Tokens per row of a packed batch.
const SEQ: usize = 32;

/// One example: its tokens, and whether each of its targets (`tokens[1..]`) counts.
struct Example {
    tokens: Vec<u32>,
    counted: Vec<bool>,
}

impl Example {
    /// How many of its targets count.
    fn terms(&self) -> usize {
        self.counted.iter().filter(|&&c| c).count()
    }

    /// Its inputs, targets (uncounted ones ignored) and positions.
    fn parts(&self) -> (Vec<u32>, Vec<u32>, Vec<u32>) {
        let n = self.tokens.len() - 1;
        let targets = (self.tokens[1..].iter().zip(&self.counted))
            .map(|(&t, &c)| if c { t } else { IGNORE_INDEX })
            .collect();
        (self.tokens[..n].to_vec(), targets, (0..n as u32).collect())
    }
}

/// Examples of 2 to 33 tokens (one target to a whole row), some longer than the sliding
/// windows of Mistral, Qwen2 and Gemma 2 (8), cut from the fixture's token windows; every
/// fourth target from the second is a prompt's (not counted).
fn examples(family: &str) -> Vec<Example> {
    let windows: Vec<u32> = reference(family)["windows"]
        .to_dtype(candle_core::DType::U32)
        .unwrap()
        .flatten_all()
        .unwrap()
        .to_vec1()
        .unwrap();
    let lens = [13, 6, 20, 3, 9, 17, 2, 11, 33, 7, 4, 12];
    let mut at = 0;
    lens.iter()
        .map(|&n| {
            at += n;
            Example {
                tokens: windows[at - n..at].to_vec(),
                counted: (0..n - 1).map(|j| j % 4 != 1).collect(),
            }
        })
        .collect()
}

/// One row of `seq` positions: the examples one after another, then padding (id 0, not
/// counted, each pad at position 0, a document of its own); with positions when `packed`,
/// without (one sequence) when not.
fn row(examples: &[&Example], seq: usize, packed: bool) -> TokenBatch {
    let (mut ids, mut targets, mut positions) = (vec![], vec![], vec![]);
    for e in examples {
        let (i, t, p) = e.parts();
        ids.extend(i);
        targets.extend(t);
        positions.extend(p);
    }
    let pad = seq - ids.len();
    ids.extend(vec![0; pad]);
    targets.extend(vec![IGNORE_INDEX; pad]);
    positions.extend(vec![0; pad]);
    let tensor = |v: Vec<u32>| Tensor::from_vec(v, (1, seq), &Device::Cpu).unwrap();
    match packed {
        true => TokenBatch::packed(tensor(ids), tensor(targets), tensor(positions)),
        false => TokenBatch::new(tensor(ids), tensor(targets)),
    }
}

/// Samples that are ready-made batches (one row or several), concatenated in a global
/// batch's order.
struct Samples(Vec<TokenBatch>);

impl Dataset for Samples {
    type Batch = TokenBatch;

    fn len(&self) -> usize {
        self.0.len()
    }

    fn batch(&self, idx: &[usize], dev: &Device) -> candle_core::Result<TokenBatch> {
        let cat = |part: &dyn Fn(&TokenBatch) -> Tensor| -> candle_core::Result<Tensor> {
            let parts: Vec<Tensor> = idx.iter().map(|&i| part(&self.0[i])).collect();
            Tensor::cat(&parts, 0)?.to_device(dev)
        };
        let (ids, targets) = (cat(&|b| b.ids.clone())?, cat(&|b| b.targets.clone())?);
        Ok(match self.0[idx[0]].positions {
            Some(_) => TokenBatch::packed(ids, targets, cat(&|b| b.positions.clone().unwrap())?),
            None => TokenBatch::new(ids, targets),
        })
    }
}

/// The examples in rows of [`SEQ`] by best-fit decreasing: each row's examples.
fn bins(examples: &[Example]) -> Vec<Vec<&Example>> {
    let sizes: Vec<usize> = examples.iter().map(|e| e.tokens.len() - 1).collect();
    (best_fit_decreasing(&sizes, SEQ).into_iter())
        .map(|bin| bin.into_iter().map(|i| &examples[i]).collect())
        .collect()
}

/// `steps` steps of `family` with `optimizer` over `data`, global batches of `batch`
/// samples, in order: rank 0's losses and the final parameters by name.
fn run(
    family: &str,
    (devices, strategy): (usize, Box<dyn Strategy>),
    (data, batch): (Samples, usize),
    (optimizer, steps): (OptimizerConfig, usize),
) -> (Vec<f64>, HashMap<String, Tensor>) {
    let losses = Losses::default();
    let mut t = recording_trainer(devices, strategy, steps, &losses);
    let mut m = Attached::new(pretrained(family, optimizer));
    let loader = DataLoader::new(data, batch).without_shuffle();
    t.fit(&mut m, &loader, None).unwrap();
    let params = t.full_parameters(&mut m).unwrap().into_iter().collect();
    let seen = losses.0.lock().unwrap().clone();
    (seen, params)
}

/// The loss of one step over `data` and every parameter's gradient (one SGD step at rate 1
/// moves a parameter by minus its gradient).
fn gradients(
    family: &str,
    at: (usize, Box<dyn Strategy>),
    data: Samples,
) -> (f64, HashMap<String, Tensor>) {
    let batch = data.len();
    let before: HashMap<String, Tensor> = candle_core::safetensors::load(
        crate::models::fixtures()
            .join(family)
            .join("model.safetensors"),
        &Device::Cpu,
    )
    .unwrap();
    let (losses, after) = run(family, at, (data, batch), (plain_sgd(), 1));
    let grads = after
        .into_iter()
        .map(|(name, p)| {
            let g = (&before[&name] - p).unwrap();
            (name, g)
        })
        .collect();
    (losses[0], grads)
}

/// The strategies a packed batch runs under: one device, and sharded at W = 2 and 4.
fn strategies() -> Vec<(&'static str, usize, Box<dyn Strategy>)> {
    vec![
        ("single", 1, strategy_by_name("single").unwrap()),
        ("ddp", 2, strategy_by_name("ddp").unwrap()),
        ("zero3", 2, strategy_by_name("zero3").unwrap()),
        ("fsdp", 2, Fsdp::new(FsdpSharding::FullShard).build()),
        ("fsdp", 4, Fsdp::new(FsdpSharding::FullShard).build()),
    ]
}

#[test]
fn a_packed_batch_has_the_loss_and_gradients_of_its_examples_alone() {
    for family in FAMILIES {
        let examples = examples(family);
        let total: usize = examples.iter().map(Example::terms).sum();
        // Each example alone: the packed batch's loss is their mean over every counted
        // target, so each weighs by its counted targets.
        let mut want_loss = 0.0;
        let mut want: HashMap<String, Tensor> = HashMap::new();
        for e in &examples {
            let single = (1, strategy_by_name("single").unwrap());
            let n = e.tokens.len() - 1;
            let (loss, grads) = gradients(family, single, Samples(vec![row(&[e], n, false)]));
            let weight = e.terms() as f64 / total as f64;
            want_loss += loss * weight;
            for (name, g) in grads {
                let g = (g * weight).unwrap();
                let sum = match want.remove(&name) {
                    Some(s) => (s + g).unwrap(),
                    None => g,
                };
                want.insert(name, sum);
            }
        }
        let rows = bins(&examples);
        assert_eq!(rows.len(), 4, "{family}: the examples fill four rows");
        for (name, devices, strategy) in strategies() {
            let packed = Samples(rows.iter().map(|r| row(r, SEQ, true)).collect());
            let (loss, grads) = gradients(family, (devices, strategy), packed);
            let loss_diff = (loss - want_loss).abs();
            let grad_diff = (grads.iter())
                .map(|(n, g)| max_diff(g, &want[n]))
                .fold(0f32, f32::max);
            let largest = (want.values())
                .map(|g| max_diff(g, &g.zeros_like().unwrap()))
                .fold(0f32, f32::max);
            println!(
                "{family} {name} at W={devices}: packed loss within {loss_diff:e}, every \
                 gradient within {grad_diff:e} (the largest is {largest:e}) of the examples alone"
            );
            assert!(
                loss_diff <= 1e-6,
                "{family} {name}: loss differs by {loss_diff}"
            );
            assert!(
                grad_diff <= 1e-6,
                "{family} {name}: a gradient differs by {grad_diff}"
            );
            assert!(largest >= 1e-3, "{family}: gradients too small to tell");
        }
        // The same rows without positions attend across examples: the check can fail.
        let across = Samples(rows.iter().map(|r| row(r, SEQ, false)).collect());
        let single = (1, strategy_by_name("single").unwrap());
        let (loss, grads) = gradients(family, single, across);
        let grad_diff = (grads.iter())
            .map(|(n, g)| max_diff(g, &want[n]))
            .fold(0f32, f32::max);
        println!(
            "{family} without positions: loss off by {:e}, a gradient by {grad_diff:e}",
            (loss - want_loss).abs()
        );
        assert!(grad_diff > 1e-3, "{family}: contamination unseen");
    }
}

/// The part of parameter `name` that its gradients determine: all of it but GPT-2's key
/// bias (the middle third of `c_attn.bias`), whose gradient is zero in exact arithmetic
/// (it adds `q . b_k` to every score of a query, which the softmax takes away) and so only
/// rounding noise, which AdamW's normalisation makes into steps of its full size in either
/// run. The gradient test holds that noise below 1e-6.
fn determined(name: &str, p: &Tensor) -> Tensor {
    match name.ends_with("attn.c_attn.bias") {
        true => {
            let e = p.dim(0).unwrap() / 3;
            Tensor::cat(
                &[p.narrow(0, 0, e).unwrap(), p.narrow(0, 2 * e, e).unwrap()],
                0,
            )
            .unwrap()
        }
        false => p.clone(),
    }
}

#[test]
fn ten_adamw_steps_packed_equal_ten_unpacked_over_the_same_examples() {
    for family in FAMILIES {
        let examples = examples(family);
        let rows = bins(&examples);
        let most = rows.iter().map(Vec::len).max().unwrap();
        // The same examples, one per row, right-padded (padding after a sequence is never
        // attended to); each sample the rows of one packed row's examples, and empty rows
        // up to the same count.
        let unpacked = || {
            let samples = (rows.iter())
                .map(|r| {
                    let mut parts: Vec<TokenBatch> =
                        r.iter().map(|e| row(&[*e], SEQ, false)).collect();
                    parts.resize(most, row(&[], SEQ, false));
                    Samples(parts).batch(&(0..most).collect::<Vec<_>>(), &Device::Cpu)
                })
                .collect::<candle_core::Result<_>>()
                .unwrap();
            Samples(samples)
        };
        let packed = || Samples(rows.iter().map(|r| row(r, SEQ, true)).collect());
        for (name, devices) in [("single", 1), ("fsdp", 2)] {
            let strategy = || match name {
                "single" => strategy_by_name("single").unwrap(),
                _ => Fsdp::new(FsdpSharding::FullShard).build(),
            };
            let adamw = (OptimizerConfig::adamw(1e-3), 10);
            let (a, pa) = run(family, (devices, strategy()), (packed(), 2), adamw.clone());
            let (b, pb) = run(family, (devices, strategy()), (unpacked(), 2), adamw);
            let loss_diff = (a.iter().zip(&b))
                .map(|(x, y)| (x - y).abs())
                .fold(0f64, f64::max);
            let param_diff = (pa.iter())
                .map(|(n, p)| max_diff(&determined(n, p), &determined(n, &pb[n])))
                .fold(0f32, f32::max);
            let moved = (a[0] - a[9]).abs();
            println!(
                "{family} {name} at W={devices}: 10 AdamW steps packed against unpacked: losses \
                 within {loss_diff:e} (they moved {moved:e}), parameters within {param_diff:e}"
            );
            assert_eq!((a.len(), b.len()), (10, 10));
            assert!(
                loss_diff <= 1e-5,
                "{family} {name}: losses differ by {loss_diff}"
            );
            assert!(
                param_diff <= 1e-5,
                "{family} {name}: parameters differ by {param_diff}"
            );
            assert!(moved > 1e-2, "{family}: the loss did not move");
        }
    }
}
