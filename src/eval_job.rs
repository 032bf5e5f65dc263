//! `wick validate` and `wick test`: the main job's model with a checkpoint's parameters
//! (saved at any world size and strategy), evaluated on the held-out tenth of the text at
//! this run's `--devices` and `--strategy`.

use crate::char_gpt::CharGpt;
use crate::cli::{name_of, EvalArgs};
use crate::fit_job::{main_job_config, split, Split};
use wick_trainer::{Checkpoint, Trainer};

/// Which pass to run.
#[derive(Debug, Clone, Copy)]
pub enum Pass {
    /// `validation_step` over the held-out text: `val_loss`.
    Validate,
    /// `test_step` over the same text (the corpus has no other): `test_loss`.
    Test,
}

impl Pass {
    /// The metric the pass reports.
    pub fn metric(self) -> &'static str {
        match self {
            Pass::Validate => "val_loss",
            Pass::Test => "test_loss",
        }
    }
}

/// The loss of the pass, averaged over the held-out batches and the ranks, and whether
/// this process is rank 0 (the one that reports).
pub fn run(pass: Pass, args: &EvalArgs) -> anyhow::Result<(f64, bool)> {
    let Split { vocab, val, .. } = split(args.data.as_deref(), args.batch_size)?;
    let checkpoint = Checkpoint::open(&args.checkpoint)?;
    let mut model =
        CharGpt::new(main_job_config(vocab.len()), 1e-3).with_weights(checkpoint.into_weights());
    let mut builder = Trainer::builder()
        .strategy(&name_of(args.strategy))
        .progress(false)
        .model_summary(false)
        .no_logger();
    if let Some(d) = args.devices {
        builder = builder.devices(d);
    }
    let mut trainer = builder.build()?;
    let metrics = match pass {
        Pass::Validate => trainer.validate(&mut model, &val)?,
        Pass::Test => trainer.test(&mut model, &val)?,
    };
    let key = pass.metric();
    let loss = metrics
        .get(key)
        .copied()
        .ok_or_else(|| anyhow::anyhow!("the pass reported no {key}"))?;
    Ok((loss, trainer.is_global_zero()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cli::StrategyName;

    #[test]
    fn a_checkpoint_evaluates_the_same_at_any_world_size() {
        let dir = crate::fit_job::trained_checkpoint(StrategyName::Fsdp, 2);
        let root = dir.path();
        let args = |devices, strategy| EvalArgs {
            checkpoint: root.join("ck/last"),
            devices: Some(devices),
            strategy,
            batch_size: 8,
            data: None,
        };
        let (one, _) = run(Pass::Validate, &args(1, StrategyName::Single)).unwrap();
        let (three, _) = run(Pass::Validate, &args(2, StrategyName::Zero3)).unwrap();
        let (test, _) = run(Pass::Test, &args(2, StrategyName::Fsdp)).unwrap();
        assert!(
            (one - three).abs() < 1e-5 && (one - test).abs() < 1e-5,
            "{one} {three} {test}"
        );
        // Two steps from a random init: the loss is near ln(vocabulary), not zero.
        assert!(one > 3.0, "{one}");
        let e = run(Pass::Validate, &args(3, StrategyName::Ddp)).unwrap_err();
        assert!(e.to_string().contains("batch"), "{e}");
    }
}
