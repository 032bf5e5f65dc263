//! Memory bounds, watched by a counting allocator that sees every allocation of this test
//! binary. It holds one test, which runs its checks one after another, so no other test's
//! allocations mix in.
//!
//! - Under zero3 no rank ever allocates a full parameter while the model is created: the
//!   largest single allocation stays below half the parameter's size at W = 4.
//! - Under FSDP full_shard and zero3 a unit's full parameters are not alive between its
//!   forward and its backward; under shard_grad_op they are.
//! - Under full_shard and zero3 a training step holds, beyond the parameter shards, no more than the
//!   gradient shards, the kept activations and three units per rank (docs/design.md: the
//!   unit in backward, its gradient and the prefetched neighbour); recomputing every unit
//!   (activation checkpointing) holds less, by at least one activation per unit, and an
//!   evaluation's forward (`no_grad`) keeps no more than a recomputing one.
//! - Activation checkpointing lowers the step's peak under every strategy.
//! - The fused output projection and loss on 16-bit inputs (bf16-mixed, 16-mixed) peaks
//!   below a quarter of the f32 logits it never makes; the composite makes them.
//! - A QLoRA step decodes each NF4 base weight inside its op and drops it: its peak stays
//!   below half of the base's f32 bytes on one rank; under fsdp at W = 2, its blocks
//!   sharded, both ranks together stay below the whole base's f32 bytes.

mod counting_allocator;

use counting_allocator as heap;
use std::sync::Arc;
use wick::accelerator::ThreadWorld;
use wick::core::CollectiveExt;
use wick::core::{
    ActivationCheckpointing, Collective, GradSync, OptimizerConfig, RankStrategy, StepOptions,
    Strategy, Wrapped,
};
use wick::strategies::{Fsdp, FsdpSharding, StrategySpec, Zero3};

/// One 1024 x 4096 weight: 16 MiB in full, 4 MiB per rank at W = 4.
const FULL_BYTES: usize = 1024 * 4096 * 4;

/// Creates the model under `strategy` on 4 ranks; returns the largest allocation seen.
fn largest_allocation_while_creating(strategy: &str) -> usize {
    let world_size = if strategy == "single" { 1 } else { 4 };
    heap::track_largest(true);
    let outcomes = ThreadWorld::new(world_size).run(|comm| {
        let open = wick::strategies::strategy_by_name(strategy)?.open(
            Arc::new(comm),
            candle_core::Device::Cpu,
            0,
        )?;
        let ctx = open.context();
        let _unit: Wrapped<candle_nn::Linear> = {
            let _open = ctx.enter();
            ctx.wrap("big", |vb| candle_nn::linear_no_bias(1024, 4096, vb))?
        };
        let s = open.close()?;
        Ok::<_, wick::core::Error>(s.num_parameters())
    });
    heap::track_largest(false);
    for o in outcomes {
        assert_eq!(o.unwrap(), 1024 * 4096);
    }
    heap::largest()
}

/// A sharded strategy by the name the bounds use: `zero3`, `full_shard` or `shard_grad_op`,
/// prefetching or not, recomputing as `ac` says.
fn sharded(name: &str, prefetch: bool, ac: ActivationCheckpointing) -> Box<dyn Strategy> {
    match name {
        "zero3" => Box::new(
            Zero3::new()
                .with_prefetch(prefetch)
                .with_activation_checkpointing(ac),
        ),
        "full_shard" => Fsdp::new(FsdpSharding::FullShard)
            .with_prefetch(prefetch)
            .with_activation_checkpointing(ac)
            .build(),
        "shard_grad_op" => Fsdp::new(FsdpSharding::ShardGradOp)
            .with_activation_checkpointing(ac)
            .build(),
        other => unreachable!("no sharded strategy {other}"),
    }
}

/// Heap growth of the whole process between the end of every rank's forward and the start
/// of its backward, for the big unit under `strategy` (see [`sharded`]) at W = 2.
fn held_between_forward_and_backward(strategy: &str) -> usize {
    let outcomes = ThreadWorld::new(2).run(|comm| {
        let world: Arc<dyn Collective> = Arc::new(comm);
        let open = sharded(strategy, false, ActivationCheckpointing::None).open(
            world.clone(),
            candle_core::Device::Cpu,
            0,
        )?;
        let ctx = open.context();
        let unit: Wrapped<candle_nn::Linear> = {
            let _open = ctx.enter();
            ctx.wrap("big", |vb| candle_nn::linear_no_bias(1024, 4096, vb))?
        };
        let mut s = open.close()?;
        s.configure_optimizer(&OptimizerConfig::sgd(0.1), StepOptions::default());
        let x = candle_core::Tensor::ones(
            (2, 1024),
            candle_core::DType::F32,
            &candle_core::Device::Cpu,
        )?;
        world.barrier()?;
        let before = heap::current();
        let y = unit.apply(&x, candle_core::Module::forward)?;
        world.barrier()?;
        let held = heap::current().saturating_sub(before);
        world.barrier()?;
        s.backward(&y.sqr()?.mean_all()?, GradSync::Reduce)?;
        s.optimizer_step(0.1)?;
        Ok::<_, wick::core::Error>(held)
    });
    outcomes.into_iter().map(|o| o.unwrap()).max().unwrap()
}

/// Units of the deep model whose full_shard step is measured.
const DEEP_UNITS: usize = 6;
/// Width of each unit: one 512 x 512 weight, 1 MiB in full.
const DEEP_WIDTH: usize = 512;

/// The deep model's units, and the rank's strategy that holds them.
type DeepModel = (Vec<Wrapped<candle_nn::Linear>>, Box<dyn RankStrategy>);

/// The deep model's units (linear layers, with biases if `bias`), created under `s` on
/// `world`, and the rank's strategy holding them with `optimizer`.
fn deep_model(
    s: &dyn Strategy,
    world: &Arc<dyn Collective>,
    bias: bool,
    optimizer: OptimizerConfig,
) -> wick::core::Result<DeepModel> {
    let open = s.open(world.clone(), candle_core::Device::Cpu, 0)?;
    let ctx = open.context();
    let units = {
        let _open = ctx.enter();
        (0..DEEP_UNITS)
            .map(|i| {
                ctx.wrap(&format!("layers.{i}"), move |vb| match bias {
                    true => candle_nn::linear(DEEP_WIDTH, DEEP_WIDTH, vb),
                    false => candle_nn::linear_no_bias(DEEP_WIDTH, DEEP_WIDTH, vb),
                })
            })
            .collect::<candle_core::Result<_>>()?
    };
    let mut s = open.close()?;
    s.configure_optimizer(&optimizer, StepOptions::default());
    Ok((units, s))
}

/// The deep model's loss on a batch of `rows` rows of ones.
fn deep_loss(
    units: &[Wrapped<candle_nn::Linear>],
    rows: usize,
) -> wick::core::Result<candle_core::Tensor> {
    let mut h = candle_core::Tensor::ones(
        (rows, DEEP_WIDTH),
        candle_core::DType::F32,
        &candle_core::Device::Cpu,
    )?;
    for unit in units {
        h = unit.apply(&h, |layer, x| {
            candle_core::Module::forward(layer, x)?.tanh()
        })?;
    }
    Ok(h.sqr()?.mean_all()?)
}

/// One training step at rate `lr` of the deep model on a batch of `rows` rows of ones.
fn deep_step(
    s: &mut dyn RankStrategy,
    units: &[Wrapped<candle_nn::Linear>],
    lr: f64,
    rows: usize,
) -> wick::core::Result<()> {
    s.backward(&deep_loss(units, rows)?, GradSync::Reduce)?;
    s.optimizer_step(lr).map(drop)
}

/// Rows of the batch whose full_shard step is measured: one activation (a unit's input or
/// output) is `STEP_ROWS * DEEP_WIDTH` floats, half a unit.
const STEP_ROWS: usize = 256;

/// One training step of the deep model under `strategy` (`full_shard` or `zero3`) at W = 2
/// (after a first step, so buffers made once already exist), measured over the whole
/// process: what the heap holds after every rank's forward, and its peak growth over the
/// step.
fn sharded_step_growth(
    strategy: &str,
    prefetch: bool,
    ac: ActivationCheckpointing,
) -> (usize, usize) {
    let outcomes = ThreadWorld::new(2).run(|comm| {
        let world: Arc<dyn Collective> = Arc::new(comm);
        let s = sharded(strategy, prefetch, ac);
        let (units, mut s) = deep_model(s.as_ref(), &world, false, OptimizerConfig::sgd(0.1))?;
        deep_step(s.as_mut(), &units, 0.1, STEP_ROWS)?;
        world.barrier()?;
        if world.rank() == 0 {
            heap::reset_peak();
        }
        world.barrier()?;
        let before = heap::current();
        let loss = deep_loss(&units, STEP_ROWS)?;
        world.barrier()?;
        let held = heap::current().saturating_sub(before);
        world.barrier()?;
        s.backward(&loss, GradSync::Reduce)?;
        s.optimizer_step(0.1)?;
        world.barrier()?;
        Ok::<_, wick::core::Error>((held, heap::peak() - before))
    });
    let all: Vec<(usize, usize)> = outcomes.into_iter().map(|o| o.unwrap()).collect();
    let max = |f: fn(&(usize, usize)) -> usize| all.iter().map(f).max().unwrap();
    (max(|o| o.0), max(|o| o.1))
}

/// What the heap holds after a forward of the deep model under full_shard at W = 2 that no
/// backward follows (`no_grad`, as the trainer evaluates), on `STEP_ROWS` rows.
fn held_after_evaluation_forward() -> usize {
    let outcomes = ThreadWorld::new(2).run(|comm| {
        let world: Arc<dyn Collective> = Arc::new(comm);
        let s = Fsdp::new(FsdpSharding::FullShard).build();
        let (units, mut s) = deep_model(s.as_ref(), &world, false, OptimizerConfig::sgd(0.1))?;
        world.barrier()?;
        let before = heap::current();
        let loss = wick::core::no_grad(|| deep_loss(&units, STEP_ROWS))?;
        world.barrier()?;
        let held = heap::current().saturating_sub(before);
        world.barrier()?;
        drop(loss);
        s.free_gathered();
        Ok::<_, wick::core::Error>(held)
    });
    outcomes.into_iter().map(|o| o.unwrap()).max().unwrap()
}

/// Peak heap growth of the whole process over one training step of the deep model (after
/// a first one) under `strategy` at W = 2 (1 for `single`), on `rows` rows.
fn step_growth(strategy: &str, ac: ActivationCheckpointing, rows: usize) -> usize {
    let world_size = if strategy == "single" { 1 } else { 2 };
    let outcomes = ThreadWorld::new(world_size).run(|comm| {
        let world: Arc<dyn Collective> = Arc::new(comm);
        let s = make_checkpointed(strategy, ac);
        let (units, mut s) = deep_model(s.as_ref(), &world, true, OptimizerConfig::sgd(0.1))?;
        deep_step(s.as_mut(), &units, 0.1, rows)?;
        world.barrier()?;
        if world.rank() == 0 {
            heap::reset_peak();
        }
        world.barrier()?;
        let before = heap::current();
        deep_step(s.as_mut(), &units, 0.1, rows)?;
        world.barrier()?;
        Ok::<_, wick::core::Error>(heap::peak() - before)
    });
    outcomes.into_iter().map(|o| o.unwrap()).max().unwrap()
}

/// The heap of the whole process, and the bytes allocated so far, after each of 8 training
/// steps of the deep model under `strategy` at W = 2 (1 for `single`), taken when every
/// rank has finished the step.
fn heap_after_each_step(strategy: &str) -> Vec<(usize, usize)> {
    let world_size = if strategy == "single" { 1 } else { 2 };
    let heaps = std::sync::Mutex::new(Vec::with_capacity(8));
    let outcomes = ThreadWorld::new(world_size).run(|comm| {
        let world: Arc<dyn Collective> = Arc::new(comm);
        let s = make(strategy);
        let (units, mut s) = deep_model(s.as_ref(), &world, true, OptimizerConfig::adamw(1e-3))?;
        for _ in 0..8 {
            deep_step(s.as_mut(), &units, 1e-3, 2)?;
            world.barrier()?;
            if world.rank() == 0 {
                let now = (heap::current(), heap::allocated());
                heaps.lock().unwrap().push(now);
            }
            world.barrier()?;
        }
        Ok::<_, wick::core::Error>(())
    });
    for o in outcomes {
        o.unwrap();
    }
    heaps.into_inner().unwrap()
}

#[test]
fn memory_bounds() {
    // QLoRA: a step holds at most about one layer's weights decoded (a quarter of the
    // four layers' f32 bytes), never the whole base: below half of it on one rank; under
    // fsdp at W = 2, both ranks together (each with its activations, decoding its own
    // weights from a unit's gathered blocks) below the whole of it.
    for (strategy, world_size, bound) in [("single", 1, 2), ("fsdp", 2, 1)] {
        let (growth, f32_bytes) = qlora_step_growth(strategy, world_size, None);
        println!(
            "qlora step under {strategy} at W = {world_size}: peak growth {growth} bytes; \
             the block weights in f32 are {f32_bytes}"
        );
        assert!(
            growth < f32_bytes / bound,
            "qlora {strategy}: {growth} bytes, f32 base {f32_bytes}"
        );
    }
    // With the embedding and output head in NF4 too (65536 rows of 512, 128 MiB each in
    // f32), neither is ever decoded whole: the head is scored a slice of rows at a time,
    // under fsdp from the gathered blocks; each rank's growth stays below half a table. The same step over f32 tables gathers the
    // head's whole.
    let table = 65536 * 512 * 4;
    for (strategy, world_size) in [("single", 1), ("fsdp", 2)] {
        let (growth, _) = qlora_step_growth(strategy, world_size, Some((65536, true)));
        println!("qlora step with NF4 embeddings under {strategy}: peak growth {growth} bytes; a table in f32 is {table}");
        assert!(
            growth < world_size * table / 2,
            "{strategy}: {growth} bytes"
        );
    }
    let (gathered, _) = qlora_step_growth("fsdp", 2, Some((65536, false)));
    assert!(gathered > table, "fsdp over f32 tables: {gathered} bytes");
    // The fused output projection and loss never makes the whole logits, also when
    // mixed precision hands it 16-bit inputs; the probe sees the composite make them.
    for dtype in [candle_core::DType::BF16, candle_core::DType::F16] {
        let (composite, logits) = output_loss_peak(dtype, false);
        assert!(
            composite >= logits,
            "{dtype:?} composite: {composite} bytes, logits {logits}"
        );
        let (fused, logits) = output_loss_peak(dtype, true);
        println!("{dtype:?} output loss: fused {fused} bytes, composite {composite}, f32 logits {logits}");
        assert!(
            fused <= logits / 4,
            "{dtype:?} fused: {fused} bytes at its peak; the f32 logits are {logits}"
        );
    }

    // The probe works: creating the full parameter is seen.
    assert!(largest_allocation_while_creating("single") >= FULL_BYTES);
    let largest = largest_allocation_while_creating("zero3");
    assert!(
        largest < FULL_BYTES / 2,
        "zero3 init: largest allocation {largest} bytes; the full parameter is {FULL_BYTES}"
    );

    let kept = held_between_forward_and_backward("shard_grad_op");
    assert!(
        kept >= FULL_BYTES,
        "shard_grad_op keeps the gathered unit: {kept} bytes held"
    );
    for strategy in ["full_shard", "zero3"] {
        let freed = held_between_forward_and_backward(strategy);
        assert!(
            freed < FULL_BYTES / 4,
            "{strategy} held {freed} bytes between forward and backward; the unit is {FULL_BYTES}"
        );
    }

    // Per rank: the gradient shards (the whole model over W), three full units, the
    // activations kept from forward, sixteen more (the batch and the loss's square; for
    // one unit's backward its incoming and outgoing gradients, tanh's and the matmul's, a
    // recomputed unit's own), and 256 KiB for bookkeeping. A unit keeps four activations: its input (the graph's own
    // variable), the matmul's output, tanh's, and the copy that leaves the unit op; a
    // recomputed unit keeps only that copy.
    let unit = DEEP_WIDTH * DEEP_WIDTH * 4;
    let activation = STEP_ROWS * DEEP_WIDTH * 4;
    let per_rank = |kept: usize| {
        DEEP_UNITS * unit / 2 + 3 * unit + (DEEP_UNITS * kept + 16) * activation + (256 << 10)
    };
    for (strategy, prefetch) in [
        ("full_shard", false),
        ("full_shard", true),
        ("zero3", false),
        ("zero3", true),
    ] {
        let (kept_held, kept) =
            sharded_step_growth(strategy, prefetch, ActivationCheckpointing::None);
        let (recomputed_held, recomputed) =
            sharded_step_growth(strategy, prefetch, ActivationCheckpointing::Full);
        println!(
            "{strategy} forward (prefetch {prefetch}) held {kept_held} bytes with activations kept, {recomputed_held} recomputing"
        );
        for (growth, what, bound) in [
            (kept, "kept activations", 2 * per_rank(4)),
            (recomputed, "recomputed", 2 * per_rank(1)),
        ] {
            assert!(
                growth <= bound,
                "{strategy} step ({what}, prefetch {prefetch}) grew the heap by {growth} bytes; the bound is {bound} (units of {unit}, activations of {activation})"
            );
            println!(
                "{strategy} step ({what}, prefetch {prefetch}): {growth} bytes over the shards, bound {bound}"
            );
        }
        // Between forward and backward: kept, every unit's activations and no parameters;
        // recomputed, only what leaves each unit.
        assert!(
            kept_held >= recomputed_held + 2 * 2 * DEEP_UNITS * activation
                && kept_held < 2 * (DEEP_UNITS * 4 + 2) * activation + unit,
            "forward held {kept_held} bytes with activations kept, {recomputed_held} recomputing (activations of {activation}, units of {unit})"
        );
        let evaluating = held_after_evaluation_forward();
        assert!(
            evaluating <= recomputed_held,
            "an evaluation's forward held {evaluating} bytes, a recomputing training forward {recomputed_held}: no_grad must keep no unit's activations"
        );
        assert!(
            recomputed + 2 * DEEP_UNITS * activation <= kept,
            "recomputing every unit grew the step by {recomputed} bytes, keeping activations by {kept}: less than one activation per unit and rank ({activation}) apart"
        );
    }

    // Activation checkpointing lowers every strategy's peak: each unit's matmul, bias and
    // tanh outputs go, and only one unit's come back at a time, in backward, with that
    // backward's own temporaries. At 512 rows an activation is a unit, so activations,
    // not parameters, set the peak.
    let rows = 2 * STEP_ROWS;
    let activation = rows * DEEP_WIDTH * 4;
    for strategy in STRATEGIES {
        let kept = step_growth(strategy, ActivationCheckpointing::None, rows);
        let recomputed = step_growth(strategy, ActivationCheckpointing::Full, rows);
        println!("{strategy}: step peak {kept} bytes keeping activations, {recomputed} recomputing every unit");
        let ranks = if strategy == "single" { 1 } else { 2 };
        assert!(
            recomputed + ranks * DEEP_UNITS * activation / 2 <= kept,
            "{strategy}: recomputing grew the step by {recomputed} bytes, keeping activations by {kept}: less than half an activation per unit and rank ({activation}) apart"
        );
    }

    // After warm-up (the optimizer state and buffers made at the first steps), a training
    // step leaves the heap as it found it, under every strategy.
    for strategy in STRATEGIES {
        let heaps = heap_after_each_step(strategy);
        let growth: Vec<isize> = heaps
            .windows(2)
            .map(|w| w[1].0 as isize - w[0].0 as isize)
            .collect();
        let traffic = (heaps[7].1 - heaps[3].1) / 4;
        println!(
            "{strategy}: heap change per step {growth:?}; {traffic} bytes allocated (and freed) per step"
        );
        assert!(
            growth[2..].iter().all(|&g| g <= 0),
            "{strategy}: the heap grew after warm-up, by {growth:?} bytes per step"
        );
    }
}

/// The peak heap (above what was live before) of the loss of a language model's output
/// projection on 16-bit activations and weights, forward and backward: `fused`
/// (`linear_cross_entropy`) or the composite. Returns it and the f32 logits' size.
fn output_loss_peak(dtype: candle_core::DType, fused: bool) -> (usize, usize) {
    use candle_core::{Device, Tensor, Var};
    use wick::nn::{linear_cross_entropy, linear_cross_entropy_composite};
    let (rows, hidden, vocab) = (2048, 64, 32768);
    let sixteen = |n: usize, shape: (usize, usize)| {
        let values: Vec<f32> = (0..n)
            .map(|i| ((i * 7919) % 1000) as f32 / 1000.0 - 0.5)
            .collect();
        let t = Tensor::from_vec(values, shape, &Device::Cpu).unwrap();
        Var::from_tensor(&t.to_dtype(dtype).unwrap()).unwrap()
    };
    let x = sixteen(rows * hidden, (rows, hidden));
    let w = sixteen(vocab * hidden, (vocab, hidden));
    let targets: Vec<u32> = (0..rows as u32).map(|i| (i * 131) % vocab as u32).collect();
    let targets = Tensor::new(targets, &Device::Cpu).unwrap();
    let before = heap::reset_peak();
    let loss = match fused {
        true => linear_cross_entropy(&x, &w, &targets, None),
        false => linear_cross_entropy_composite(&x, &w, &targets, None),
    }
    .unwrap();
    let grads = loss.backward().unwrap();
    assert_eq!(grads.get(&w).unwrap().dtype(), dtype);
    drop((grads, loss));
    (heap::peak() - before, rows * vocab * 4)
}

/// The strategies checked, by registry name (`fsdp` is full_shard) and shard_grad_op.
const STRATEGIES: [&str; 7] = [
    "single",
    "ddp",
    "zero1",
    "zero2",
    "zero3",
    "fsdp",
    "fsdp_shard_grad_op",
];

fn make(strategy: &str) -> Box<dyn Strategy> {
    make_checkpointed(strategy, ActivationCheckpointing::None)
}

/// `strategy` by name (or `fsdp_shard_grad_op`), recomputing the units `ac` picks.
fn make_checkpointed(strategy: &str, ac: ActivationCheckpointing) -> Box<dyn Strategy> {
    let spec = match strategy {
        "fsdp_shard_grad_op" => StrategySpec::from(Fsdp::new(FsdpSharding::ShardGradOp)),
        name => StrategySpec::new(name.parse().unwrap()),
    };
    spec.with_activation_checkpointing(ac).build()
}

/// QLoRA: the heap growth of the whole process over one training step (after a first one)
/// of a Llama whose block linear weights (hidden 512, MLP 2048, 4 layers: 67 MB in f32) are
/// born NF4, under `strategy` on `world_size` CPU ranks, and those weights' f32 bytes. Each
/// layer decodes its weight inside its op and drops it (under fsdp, from the unit's gathered
/// blocks), so the step never holds them all decoded. `table`: a vocabulary of that many
/// rows (the fixture's 384 otherwise), and whether its embedding and untied head are NF4.
fn qlora_step_growth(
    strategy: &str,
    world_size: usize,
    table: Option<(usize, bool)>,
) -> (usize, usize) {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/hf/llama");
    let mut config: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(path.join("config.json")).unwrap()).unwrap();
    for (key, value) in [
        ("hidden_size", 512),
        ("intermediate_size", 2048),
        ("num_hidden_layers", 4),
        ("num_attention_heads", 8),
        ("num_key_value_heads", 8),
        ("head_dim", 64),
    ] {
        config[key] = value.into();
    }
    if let Some((vocab, _)) = table {
        config["vocab_size"] = vocab.into();
    }
    let f32_bytes = 4 * 4 * (4 * 512 * 512 + 3 * 512 * 2048);
    let outcomes = ThreadWorld::new(world_size).run(|comm| {
        let world: Arc<dyn Collective> = Arc::new(comm);
        let mut model = wick::models::CausalLm::from_config_json(config.to_string(), &path)
            .unwrap()
            .with_optimizer(OptimizerConfig::sgd(0.1))
            .with_lora(wick::models::LoraConfig::new(4))
            .unwrap()
            .with_quantized_base(wick::models::BlockFormat::Nf4)
            .unwrap();
        if table.is_some_and(|(_, quantized)| quantized) {
            model = model.with_quantized_embeddings().unwrap();
        }
        let s = wick::strategies::strategy_by_name(strategy)?;
        let device = candle_core::Device::Cpu;
        let mut s =
            wick::core::configure_rank(s.as_ref(), world.clone(), device.clone(), 0, &mut model)?;
        s.configure_optimizer(&OptimizerConfig::sgd(0.1), StepOptions::default());
        // Each rank its own rows of the batch.
        let window: Vec<u32> = (0..66u32)
            .map(|i| (i * 37 + world.rank() as u32) % 384)
            .collect();
        let window = candle_core::Tensor::from_vec(window, (2, 33), &device)?;
        let (ids, targets) = (window.narrow(1, 0, 32)?, window.narrow(1, 1, 32)?);
        let mut step = || -> wick::core::Result<()> {
            s.backward(&model.loss(&ids, &targets)?, GradSync::Reduce)?;
            s.optimizer_step(0.1).map(drop)
        };
        step()?;
        world.barrier()?;
        if world.rank() == 0 {
            heap::reset_peak();
        }
        world.barrier()?;
        let before = heap::current();
        step()?;
        world.barrier()?;
        Ok::<_, wick::core::Error>(heap::peak() - before)
    });
    let growth = outcomes.into_iter().map(|o| o.unwrap()).max().unwrap();
    (growth, f32_bytes)
}
