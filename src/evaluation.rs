//! `wick validate` and `wick test`: a model evaluated at this run's `--devices` and
//! `--strategy`. The model is a checkpoint's (saved at any world size and strategy): the
//! main job's on the held-out tenth of its text, a `fit --model` run's on the validation
//! tokens of `--data`. Or it is a Hugging Face directory as it is (`--model`), on those
//! tokens: the base model's loss, before any training.

use crate::char_gpt::CharGpt;
use crate::cli::{EvalArgs, ModelSource};
use crate::main_job::{main_job_config, split};
use wick_trainer::{Attached, Checkpoint, DataLoader, Split, Trainer};

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

/// The loss of the pass, averaged over the held-out samples and the ranks, and whether
/// this process is rank 0 (the one that reports). A checkpoint of a `fit --model` run is
/// evaluated on the validation tokens of `--data`; one of the main job on the held-out
/// tenth of its text.
pub fn run(pass: Pass, args: &EvalArgs) -> anyhow::Result<(f64, bool)> {
    let mut builder = Trainer::builder()
        .strategy(args.strategy)
        .progress(false)
        .model_summary(false)
        .no_logger();
    if let Some(d) = args.devices {
        builder = builder.devices(d);
    }
    let mut trainer = builder.build()?;
    let checkpoint = match args.from.source() {
        ModelSource::Model(dir) => {
            let lm = crate::hf_model::load_model(dir, None)?;
            return report(pass, &mut trainer, lm, args);
        }
        ModelSource::Checkpoint(path) => Checkpoint::open(path)?,
    };
    let metrics = match checkpoint.attachment(crate::hf_files::CONFIG_FILE) {
        Some(_) => {
            let lm = crate::hf_model::from_checkpoint(checkpoint)?.expect("it has a config");
            return report(pass, &mut trainer, lm, args);
        }
        None => {
            let crate::main_job::CharData { vocab, val, .. } =
                split(args.data.as_deref(), args.batch_size)?;
            let model = CharGpt::new(main_job_config(vocab.len()), 1e-3)
                .with_weights(checkpoint.into_weights());
            evaluate(pass, &mut trainer, model, &val)?
        }
    };
    loss_of(pass, &metrics, &trainer)
}

/// The loss of `pass` of the language model `lm` over the validation tokens of `--data`.
fn report(
    pass: Pass,
    trainer: &mut Trainer,
    lm: wick_models::CausalLm,
    args: &EvalArgs,
) -> anyhow::Result<(f64, bool)> {
    let data = args.data.as_deref().ok_or_else(|| {
        anyhow::anyhow!(
            "a Hugging Face model or a `fit --model` run's checkpoint needs --data TOKENS"
        )
    })?;
    let val = crate::hf_model::tokens(&lm, data, Split::Val, (args.seq, args.packing))?;
    let val = DataLoader::new(val, args.batch_size).without_shuffle();
    let metrics = evaluate(pass, trainer, lm, &val)?;
    loss_of(pass, &metrics, trainer)
}

/// The loss `pass` reported, and whether this process reports it (rank 0).
fn loss_of(
    pass: Pass,
    metrics: &wick_trainer::Metrics,
    trainer: &Trainer,
) -> anyhow::Result<(f64, bool)> {
    let key = pass.metric();
    let loss = metrics
        .get(key)
        .copied()
        .ok_or_else(|| anyhow::anyhow!("the pass reported no {key}"))?;
    Ok((loss, trainer.is_global_zero()))
}

/// Runs `pass` of `model` over `data`.
fn evaluate<M, D>(
    pass: Pass,
    trainer: &mut Trainer,
    model: M,
    data: &DataLoader<D>,
) -> anyhow::Result<wick_trainer::Metrics>
where
    M: wick_trainer::Replicate + 'static,
    D: wick_trainer::Dataset<Batch = M::Batch>,
{
    let model = &mut Attached::new(model);
    Ok(match pass {
        Pass::Validate => trainer.validate(model, data)?,
        Pass::Test => trainer.test(model, data)?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use wick_strategies::StrategyKind;

    #[test]
    fn a_checkpoint_evaluates_the_same_at_any_world_size() {
        let dir = crate::main_job::trained_checkpoint(StrategyKind::Fsdp, 2);
        let root = dir.path();
        let args = |devices, strategy| EvalArgs {
            from: crate::cli::ModelChoice {
                checkpoint: Some(root.join("ck/last")),
                model: None,
            },
            devices: Some(devices),
            strategy,
            batch_size: 8,
            data: None,
            seq: 128,
            packing: None,
        };
        let (one, _) = run(Pass::Validate, &args(1, StrategyKind::Single)).unwrap();
        let (three, _) = run(Pass::Validate, &args(2, StrategyKind::Zero3)).unwrap();
        let (test, _) = run(Pass::Test, &args(2, StrategyKind::Fsdp)).unwrap();
        assert!(
            (one - three).abs() < 1e-5 && (one - test).abs() < 1e-5,
            "{one} {three} {test}"
        );
        // Two steps from a random init: the loss is near ln(vocabulary), not zero.
        assert!(one > 3.0, "{one}");
        let e = run(Pass::Validate, &args(3, StrategyKind::Ddp)).unwrap_err();
        assert!(e.to_string().contains("batch"), "{e}");
    }
}
