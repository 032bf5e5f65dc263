//! The main job: train the character GPT with the options of `wick fit`.

use crate::char_corpus::{CharWindows, Vocab, BUNDLED_TEXT};
use crate::char_gpt::{CharGpt, GptConfig};
use crate::cli::FitArgs;
use crate::program_trainer::{FitReport, ProgramTrainer};
use anyhow::Context;
use std::sync::Arc;
use wick_strategies::StrategyKind;
use wick_trainer::{DataLoader, ModelCheckpoint};

/// Context length of the main job's model.
const BLOCK: usize = 64;

/// The main job's model sizes for a vocabulary of `vocab` characters.
pub fn main_job_config(vocab: usize) -> GptConfig {
    GptConfig {
        vocab,
        block: BLOCK,
        d_model: 64,
        n_layer: 2,
        n_head: 4,
    }
}

/// Creates `model`'s parameters on one CPU rank (the `single` strategy over a world of one),
/// for the commands that use the model outside a trainer; the strategy holds them.
pub fn configure_on_one_cpu<M: wick_core::TrainModule>(
    model: &mut M,
) -> anyhow::Result<Box<dyn wick_core::RankStrategy>> {
    let single = wick_strategies::StrategySpec::new(StrategyKind::Single).build();
    let world = Arc::new(wick_core::SoloWorld);
    Ok(wick_core::configure_rank(
        single.as_ref(),
        world,
        candle_core::Device::Cpu,
        0,
        model,
    )?)
}

/// The text the main job trains on: `data`'s, or the bundled corpus.
pub fn corpus(data: Option<&std::path::Path>) -> anyhow::Result<String> {
    Ok(match data {
        Some(path) => std::fs::read_to_string(path)
            .with_context(|| format!("reading --data {}", path.display()))?,
        None => BUNDLED_TEXT.to_string(),
    })
}

/// The main job's data: the vocabulary, the first nine tenths of the text as training
/// windows (a window at every character) and the last tenth held out for validation and
/// test, in non-overlapping windows.
pub struct CharData {
    pub vocab: Vocab,
    pub train: DataLoader<CharWindows>,
    pub val: DataLoader<CharWindows>,
}

/// [`CharData`] of `data`'s text (or the bundled corpus) in global batches of `batch_size`.
pub fn split(data: Option<&std::path::Path>, batch_size: usize) -> anyhow::Result<CharData> {
    let text = corpus(data)?;
    let vocab = Vocab::of(&text);
    let ids = vocab
        .encode(&text)
        .expect("the vocabulary is made from this text");
    anyhow::ensure!(
        ids.len() > 20 * BLOCK,
        "the text has {} characters; wick needs at least {}",
        ids.len(),
        20 * BLOCK
    );
    let at = ids.len() * 9 / 10;
    Ok(CharData {
        train: DataLoader::new(CharWindows::new(ids[..at].to_vec(), BLOCK, 1), batch_size),
        val: DataLoader::new(
            CharWindows::new(ids[at..].to_vec(), BLOCK, BLOCK),
            batch_size,
        )
        .without_shuffle(),
        vocab,
    })
}

/// Trains the model described by `args` (the character model, or with `--model` a Hugging
/// Face model) and reports its losses.
pub fn run(args: &FitArgs) -> anyhow::Result<FitReport> {
    if let Some(model) = &args.model {
        return crate::hf_model::run(args, model);
    }
    let CharData { vocab, train, val } = split(args.data.as_deref(), args.batch_size)?;
    let config = main_job_config(vocab.len());
    let model = CharGpt::new(config, args.lr).with_schedule(args.lr_schedule());
    let run = ProgramTrainer::new(args, ModelCheckpoint::new(&args.checkpoint_dir))?;
    run.fit(args, model, &train, &val)
}

/// A checkpoint of the main job after `steps` steps of `strategy` on 2 ranks (global batch
/// 8), saved in a fresh folder: `<folder>/ck/last`. For the commands' tests.
#[cfg(test)]
pub fn trained_checkpoint(strategy: StrategyKind, steps: usize) -> tempfile::TempDir {
    let dir = tempfile::tempdir().expect("a temporary folder");
    let fit = FitArgs {
        devices: Some(2),
        strategy,
        max_steps: steps,
        batch_size: 8,
        save_every: steps,
        no_progress: true,
        checkpoint_dir: dir.path().join("ck"),
        log_dir: dir.path().join("runs"),
        ..FitArgs::default()
    };
    run(&fit).expect("the main job trains");
    dir
}
