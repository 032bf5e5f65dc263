//! Inf and NaN: a non-finite loss or gradient is an error naming the step, the rank and the
//! first parameter, under every strategy; `OnNonFinite::Skip` skips the step on every rank
//! and counts it.

use crate::common::{adamw, full_parameters, loader, max_diff, quiet_builder, Mlp};
use candle_core::{CpuStorage, CustomOp1, Layout, Shape, Tensor};
use wick::core::{OnNonFinite, OptimizerConfig, ShardedContext, TrainModule};
use wick::strategies::strategy_by_name;
use wick::trainer::{Attached, Checkpoint, ModelCheckpoint, TrainerError};

/// An identity whose backward hands back NaN: a finite loss with non-finite gradients.
struct NanGrad;

impl CustomOp1 for NanGrad {
    fn name(&self) -> &'static str {
        "nan_grad"
    }
    fn cpu_fwd(&self, s: &CpuStorage, l: &Layout) -> candle_core::Result<(CpuStorage, Shape)> {
        let (start, end) = l.contiguous_offsets().expect("contiguous");
        let v = s.as_slice::<f32>()?[start..end].to_vec();
        Ok((CpuStorage::F32(v), l.shape().clone()))
    }
    fn bwd(&self, _: &Tensor, _: &Tensor, grad: &Tensor) -> candle_core::Result<Option<Tensor>> {
        Ok(Some(grad.affine(0.0, f64::NAN)?))
    }
}

#[derive(Clone, Copy)]
enum Poison {
    /// The loss is NaN.
    Loss,
    /// The loss is finite, every gradient NaN.
    Grad,
    /// The loss times zero on every rank, at the batch `at` names: every gradient zero.
    Zero,
}

/// The MLP, poisoned at one batch of the epoch on one rank.
#[derive(Clone)]
struct Poisoned {
    mlp: Mlp,
    rank: usize,
    at: (usize, usize),
    poison: Poison,
}

impl TrainModule for Poisoned {
    type Batch = (Tensor, Tensor);

    fn configure_sharded_model(&mut self, ctx: &ShardedContext) -> candle_core::Result<()> {
        self.rank = ctx.rank();
        self.mlp.configure_sharded_model(ctx)
    }

    fn configure_optimizers(&self) -> OptimizerConfig {
        self.mlp.configure_optimizers()
    }

    fn training_step(&mut self, batch: &Self::Batch, b: usize) -> candle_core::Result<Tensor> {
        if let Poison::Zero = self.poison {
            let zero = b == self.at.1;
            return self
                .mlp
                .loss(batch)?
                .affine(if zero { 0.0 } else { 1.0 }, 0.0);
        }
        if (self.rank, b) != self.at {
            return self.mlp.loss(batch);
        }
        match self.poison {
            Poison::Loss => self.mlp.loss(batch)?.affine(f64::NAN, 0.0),
            Poison::Grad => {
                let out = self.mlp.forward(&batch.0)?.apply_op1(NanGrad)?;
                (out - &batch.1)?.sqr()?.mean_all()
            }
            Poison::Zero => unreachable!("handled above"),
        }
    }
}

/// Fits `steps` steps under `strategy` at `w` ranks, poisoned at batch 3 (step 4) of rank
/// `rank`; returns the final parameters and `skipped_steps`, or the error.
fn fit(
    w: usize,
    strategy: &str,
    steps: usize,
    rank: usize,
    poison: Poison,
    policy: OnNonFinite,
) -> Result<(Vec<Vec<f32>>, f64), TrainerError> {
    fit_poisoned_at(w, strategy, steps, (rank, 3), poison, policy)
}

/// [`fit`], poisoned at (rank, batch) `at`.
fn fit_poisoned_at(
    w: usize,
    strategy: &str,
    steps: usize,
    at: (usize, usize),
    poison: Poison,
    policy: OnNonFinite,
) -> Result<(Vec<Vec<f32>>, f64), TrainerError> {
    let mut trainer = quiet_builder(w, strategy_by_name(strategy).unwrap(), steps)
        .on_nonfinite(policy)
        .build()
        .unwrap();
    let module = Poisoned {
        mlp: Mlp::new(adamw()),
        rank: 0,
        at,
        poison,
    };
    let mut module = Attached::new(module);
    let metrics = trainer.fit(&mut module, &loader(), None)?;
    Ok((
        full_parameters(&mut trainer, &mut module),
        metrics["skipped_steps"],
    ))
}

const STRATEGIES: [(usize, &str); 7] = [
    (1, "single"),
    (2, "ddp"),
    (3, "zero1"),
    (2, "zero2"),
    (3, "zero2"),
    (2, "zero3"),
    (3, "fsdp"),
];

#[test]
fn a_nonfinite_loss_is_an_error_naming_the_step_and_the_rank() {
    for (w, strategy) in STRATEGIES {
        let rank = w - 1;
        let e = fit(w, strategy, 6, rank, Poison::Loss, OnNonFinite::Error)
            .unwrap_err()
            .to_string();
        let expected = format!("non-finite loss (NaN) at step 4 on rank {rank}");
        assert!(e.contains(&expected), "{strategy} W={w}: {e}");
    }
}

#[test]
fn a_nonfinite_gradient_is_an_error_naming_the_step_the_rank_and_the_parameter() {
    for (w, strategy) in STRATEGIES {
        // Poisoned on the last rank; after the reduction every rank's part holds NaN, and
        // the first of them (rank 0) reports its first parameter.
        let e = fit(w, strategy, 6, w - 1, Poison::Grad, OnNonFinite::Error)
            .unwrap_err()
            .to_string();
        let expected =
            "non-finite gradient in 'l0.weight' (the first parameter with one) at step 4 on rank 0";
        assert!(e.contains(expected), "{strategy} W={w}: {e}");
    }
}

#[test]
fn all_zero_gradients_at_the_first_step_are_an_error_and_later_are_not() {
    for (w, strategy) in STRATEGIES {
        let at_first = fit_poisoned_at(w, strategy, 3, (0, 0), Poison::Zero, OnNonFinite::Error);
        let e = at_first.unwrap_err();
        assert!(
            matches!(e, TrainerError::ZeroGradient) && e.to_string().contains("step 1"),
            "{strategy} W={w}: {e}"
        );
        // A step of zero gradients later in a run that trained is not refused.
        fit_poisoned_at(w, strategy, 3, (0, 1), Poison::Zero, OnNonFinite::Error).unwrap();
    }
}

#[test]
fn skipped_steps_change_nothing_and_are_counted() {
    for (w, strategy) in STRATEGIES {
        for poison in [Poison::Loss, Poison::Grad] {
            let rank = w - 1;
            let (before, none) = fit(w, strategy, 3, rank, poison, OnNonFinite::Skip).unwrap();
            let (after, one) = fit(w, strategy, 4, rank, poison, OnNonFinite::Skip).unwrap();
            assert_eq!((none, one), (0.0, 1.0), "{strategy} W={w}");
            assert_eq!(
                max_diff(&before, &after),
                0.0,
                "{strategy} W={w}: the skipped step changed the parameters"
            );
            // And training goes on after it.
            let (later, still_one) = fit(w, strategy, 6, rank, poison, OnNonFinite::Skip).unwrap();
            assert_eq!(still_one, 1.0, "{strategy} W={w}");
            assert!(max_diff(&after, &later) > 0.0, "{strategy} W={w}");
        }
    }
}

#[test]
fn the_skipped_count_is_a_typed_field_of_the_checkpoint_and_survives_a_resume() {
    let root = tempfile::TempDir::new().unwrap();
    let poisoned = || Poisoned {
        mlp: Mlp::new(adamw()),
        rank: 0,
        at: (1, 3),
        poison: Poison::Grad,
    };
    let builder = |steps| {
        quiet_builder(2, strategy_by_name("zero2").unwrap(), steps)
            .on_nonfinite(OnNonFinite::Skip)
            .checkpoint(ModelCheckpoint::new(root.path()).every_n_steps(4))
    };
    let mut trainer = builder(4).build().unwrap();
    trainer
        .fit(&mut Attached::new(poisoned()), &loader(), None)
        .unwrap();
    let saved = Checkpoint::open(root.path().join("step-00000004")).unwrap();
    assert_eq!(saved.manifest().skipped_steps, 1);
    // The resumed fit starts from that count: step 4 is not run again.
    let mut trainer = builder(6).build().unwrap();
    let metrics = trainer
        .fit_from(&mut Attached::new(poisoned()), &loader(), None, saved.dir())
        .unwrap();
    assert_eq!(metrics["skipped_steps"], 1.0);
}
