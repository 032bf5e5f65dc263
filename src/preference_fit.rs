//! `wick fit --objective dpo|ipo`: a Hugging Face model tuned on a preference token file,
//! and the reference log-probabilities a whole-model run computes once before it.

use crate::cli::FitArgs;
use crate::program_trainer::{bare_trainer, FitReport, ProgramTrainer};
use anyhow::Context;
use candle_core::{Device, Tensor};
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};
use wick_models::{CausalLm, PreferenceConfig, PreferenceLm};
use wick_trainer::{Attached, DataLoader, Dataset, ModelCheckpoint, PreferenceDataset, Split};

/// Tunes `lm` on the preference pairs of the token files `files`, as `args` say.
pub fn run(
    args: &FitArgs,
    (model, lm): (&Path, CausalLm),
    files: &[PathBuf],
    checkpoints: ModelCheckpoint,
) -> anyhow::Result<FitReport> {
    let loss = args
        .objective
        .preference_loss()
        .context("a preference objective (dpo, ipo)")?;
    let max = lm.config().max_positions();
    anyhow::ensure!(
        args.seq <= max,
        "--seq {} is longer than the model's {max} positions",
        args.seq
    );
    let tokenizer = lm.tokenizer().context("the model has no tokenizer")?;
    let (hash, vocab) = (tokenizer.hash(), lm.config().vocab_size());
    let open = |split| -> anyhow::Result<PreferenceDataset> {
        let pairs = PreferenceDataset::open_files(files, split, args.seq)?;
        pairs.rows().check(&hash, vocab)?;
        if pairs.rows().truncated() > 0 {
            log::warn!(
                "{} of the {} split's completions are longer than --seq {} and were cut to it",
                pairs.rows().truncated(),
                split.name(),
                args.seq
            );
        }
        Ok(pairs)
    };
    let (mut train, mut val) = (open(Split::Train)?, open(Split::Val)?);
    let model_config = PreferenceConfig {
        loss,
        beta: args.beta,
    };
    let tuned = PreferenceLm::new(lm, model_config)?;
    if tuned.needs_reference_log_probs() {
        let reference = Reference::of(args, model, files)?;
        let mut splits = reference.load_or_compute(args, &tuned, [&train, &val])?;
        val = val.with_reference(splits.pop().context("the val split's reference")?)?;
        train = train.with_reference(splits.pop().context("the train split's reference")?)?;
    }
    let (train, val) = (
        DataLoader::new(train, args.batch_size),
        DataLoader::new(val, args.batch_size).without_shuffle(),
    );
    ProgramTrainer::new(args, checkpoints)?.fit(args, tuned, &train, &val)
}

/// The reference log-probabilities of a whole-model preference run: computed once, by a
/// prediction pass of the model as it starts over each split, and kept beside the token
/// files (TRL's `precompute_ref_log_probs`), reused while the model, the data and `--seq`
/// are those they were computed for.
struct Reference {
    path: PathBuf,
    /// What they were computed for: the model's and the token files' paths, sizes and
    /// modification times, and `--seq`.
    key: String,
}

/// How long ranks other than 0 wait for rank 0's reference file (under a launcher).
const WAIT_FOR_RANK_0: Duration = Duration::from_secs(1800);

impl Reference {
    /// The reference of `model` on `files`: `<first file>.dpo-reference`.
    fn of(args: &FitArgs, model: &Path, files: &[PathBuf]) -> anyhow::Result<Self> {
        let first = files.first().context("no token files")?;
        let mut path = first.as_os_str().to_owned();
        path.push(".dpo-reference");
        let mut key = format!("seq {}", args.seq);
        let weights: Vec<PathBuf> = match model.is_dir() {
            true => std::fs::read_dir(model)?
                .map(|e| e.map(|e| e.path()))
                .collect::<std::io::Result<_>>()?,
            false => vec![model.to_path_buf()],
        };
        let mut stamped: Vec<&PathBuf> = weights.iter().chain(files).collect();
        stamped.sort();
        for file in stamped {
            let meta = std::fs::metadata(file).with_context(|| file.display().to_string())?;
            let modified = meta.modified()?.duration_since(std::time::UNIX_EPOCH)?;
            let canonical = std::fs::canonicalize(file)?;
            key.push_str(&format!(
                "; {} {} {}",
                canonical.display(),
                meta.len(),
                modified.as_nanos()
            ));
        }
        Ok(Reference {
            path: PathBuf::from(path),
            key,
        })
    }

    /// Each split's `(chosen, rejected)` log-probabilities per pair: read back when they
    /// are this run's, otherwise computed (written by rank 0, waited for elsewhere).
    fn load_or_compute(
        &self,
        args: &FitArgs,
        model: &PreferenceLm,
        splits: [&PreferenceDataset; 2],
    ) -> anyhow::Result<Vec<Vec<[f32; 2]>>> {
        if let Some(found) = self.read()? {
            log::info!("the reference log-probabilities: {}", self.path.display());
            return Ok(found);
        }
        log::info!(
            "computing the reference log-probabilities of {} training and {} validation pairs",
            splits[0].len(),
            splits[1].len()
        );
        let mut trainer = bare_trainer(args)?;
        let mut module = Attached::new(model.clone());
        let mut all = Vec::new();
        for split in splits {
            let loader = DataLoader::new(split.clone(), args.batch_size).without_shuffle();
            all.push(trainer.predict(&mut module, &loader)?);
        }
        if !trainer.is_global_zero() {
            return self.wait_for_rank_0();
        }
        let per_pair = all
            .into_iter()
            .map(|parts| pairs_of(&parts))
            .collect::<anyhow::Result<Vec<_>>>()?;
        self.write(&per_pair)?;
        log::info!("wrote {}", self.path.display());
        Ok(per_pair)
    }

    /// The file's splits when it holds this run's reference.
    fn read(&self) -> anyhow::Result<Option<Vec<Vec<[f32; 2]>>>> {
        if !self.path.is_file() {
            return Ok(None);
        }
        let tensors = candle_core::safetensors::load(&self.path, &Device::Cpu)
            .with_context(|| format!("reading {}", self.path.display()))?;
        let key = tensors.get("key").map(|k| k.to_vec1::<u8>()).transpose()?;
        if key.as_deref() != Some(self.key.as_bytes()) {
            return Ok(None);
        }
        let split = |name: &str| -> anyhow::Result<Vec<[f32; 2]>> {
            let t = tensors
                .get(name)
                .with_context(|| format!("{}: no '{name}'", self.path.display()))?;
            Ok(t.to_vec2::<f32>()?
                .into_iter()
                .map(|r| [r[0], r[1]])
                .collect())
        };
        Ok(Some(vec![split("train")?, split("val")?]))
    }

    /// Writes the splits with the key (its bytes, a u8 tensor), atomically (a rank that waits never reads half).
    fn write(&self, splits: &[Vec<[f32; 2]>]) -> anyhow::Result<()> {
        let mut tensors = HashMap::new();
        for (name, pairs) in ["train", "val"].iter().zip(splits) {
            let flat: Vec<f32> = pairs.iter().flatten().copied().collect();
            tensors.insert(
                *name,
                Tensor::from_vec(flat, (pairs.len(), 2), &Device::Cpu)?,
            );
        }
        let key = self.key.as_bytes().to_vec();
        let len = key.len();
        tensors.insert("key", Tensor::from_vec(key, len, &Device::Cpu)?);
        let tmp = self.path.with_extension("dpo-reference.tmp");
        candle_core::safetensors::save(&tensors, &tmp)?;
        std::fs::rename(&tmp, &self.path)
            .with_context(|| format!("writing {}", self.path.display()))?;
        Ok(())
    }

    /// Rank 0's file, once it is there (under a launcher, every process predicts, and
    /// only rank 0 holds the gathered result).
    fn wait_for_rank_0(&self) -> anyhow::Result<Vec<Vec<[f32; 2]>>> {
        let start = Instant::now();
        loop {
            if let Some(found) = self.read()? {
                return Ok(found);
            }
            anyhow::ensure!(
                start.elapsed() < WAIT_FOR_RANK_0,
                "rank 0 wrote no reference log-probabilities to {} in {} s",
                self.path.display(),
                WAIT_FOR_RANK_0.as_secs()
            );
            std::thread::sleep(Duration::from_millis(200));
        }
    }
}

/// The predictions of a split (`[pairs, 2]` per batch) as one `(chosen, rejected)` per pair.
fn pairs_of(parts: &[Tensor]) -> anyhow::Result<Vec<[f32; 2]>> {
    let mut out = Vec::new();
    for part in parts {
        out.extend(part.to_vec2::<f32>()?.into_iter().map(|r| [r[0], r[1]]));
    }
    Ok(out)
}
