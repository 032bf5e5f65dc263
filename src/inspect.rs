//! `wick inspect CHECKPOINT [--tensors]`: what a checkpoint holds, after the checks that
//! loading it runs (a damaged one gets the same errors).

use std::fmt::Write;
use std::path::Path;
use wick_trainer::{Checkpoint, CheckpointError};

/// The report `wick inspect` prints.
pub fn report(path: &Path, tensors: bool) -> Result<String, CheckpointError> {
    let ck = Checkpoint::open(path)?;
    let m = ck.manifest();
    let mut out = String::new();
    let w = &mut out;
    let _ = writeln!(w, "checkpoint {}", ck.dir().display());
    let _ = writeln!(
        w,
        "step {}, epoch {}, strategy {}, world size {} ({} v{})",
        m.step, m.epoch, m.strategy, m.world_size, m.format, m.format_version
    );
    optimizer_lines(w, &ck)?;
    let _ = writeln!(
        w,
        "data: epoch {}, batch {} of global batches of {} (accumulate {}), {} samples; seed {}",
        m.data.epoch,
        m.data.batch,
        m.data.batch_size,
        m.data.accumulate,
        m.data.dataset_len,
        m.rng.seed
    );
    let metrics: Vec<String> = m
        .metrics
        .iter()
        .map(|(k, v)| format!("{k}={v:.4}"))
        .collect();
    let _ = writeln!(w, "metrics: {}", metrics.join(", "));
    let (params, elements) = ck.parameters().fold((0, 0), |(n, e), (_, shape)| {
        (n + 1, e + shape.iter().product::<usize>())
    });
    let _ = writeln!(w, "parameters: {params} tensors, {elements} elements");
    let total: u64 = m.files.iter().map(|f| f.bytes).sum();
    let _ = writeln!(w, "files ({total} bytes):");
    for f in &m.files {
        let _ = writeln!(w, "  {:<32} {:>12} bytes", f.name, f.bytes);
    }
    if tensors {
        let _ = writeln!(w, "tensors:");
        for g in &m.groups {
            for p in &g.params {
                let _ = writeln!(
                    w,
                    "  {:<40} {:>16} {}",
                    p.name,
                    format!("{:?}", p.shape),
                    p.dtype
                );
            }
        }
    }
    Ok(out)
}

/// The optimizer's lines of `ck`'s report: its kind, step, hyper-parameters and state, and
/// the learning-rate schedule and loss scale it saved.
fn optimizer_lines(w: &mut String, ck: &Checkpoint) -> Result<(), CheckpointError> {
    let m = ck.manifest();
    let hyper: Vec<String> = m
        .optimizer
        .hyper_parameters
        .iter()
        .map(|(k, v)| format!("{k}={v}"))
        .collect();
    let _ = writeln!(
        w,
        "optimizer {} at step {}: {}; state: {}",
        m.optimizer.kind,
        m.optimizer.step,
        hyper.join(", "),
        match m.optimizer.state_kinds.as_slice() {
            [] => "none".to_string(),
            kinds => kinds.join(", "),
        }
    );
    if let Some(record) = &m.optimizer.lr_schedule {
        let schedule = record
            .schedule()
            .map_err(|message| CheckpointError::Mismatch {
                path: ck.dir().to_path_buf(),
                message,
            })?;
        let _ = writeln!(w, "lr schedule: {schedule}");
    }
    if let Some(s) = &m.optimizer.loss_scale {
        let _ = writeln!(
            w,
            "loss scale: {} ({} good steps since it changed, {} steps skipped)",
            s.scale, s.growth_tracker, s.skipped_steps
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::char_corpus::CharWindows;
    use crate::char_gpt::{CharGpt, GptConfig};
    use wick_trainer::{Attached, DataLoader, ModelCheckpoint, Trainer};

    /// A checkpoint of two steps of a tiny model under zero3 at 2 ranks, in a fresh folder.
    fn checkpoint() -> tempfile::TempDir {
        let root = tempfile::tempdir().unwrap();
        let config = GptConfig {
            vocab: 11,
            block: 8,
            d_model: 16,
            n_layer: 1,
            n_head: 2,
        };
        let ids: Vec<u32> = (0..200).map(|i| (i * 7 % 11) as u32).collect();
        let mut trainer = Trainer::builder()
            .devices(2)
            .strategy("zero3")
            .max_steps(2)
            .no_logger()
            .progress(false)
            .model_summary(false)
            .checkpoint(ModelCheckpoint::new(root.path()).every_n_steps(2))
            .build()
            .unwrap();
        let data = DataLoader::new(CharWindows::new(ids, 8, 1), 4);
        trainer
            .fit(
                &mut Attached::new(
                    CharGpt::new(config, 1e-3)
                        .with_schedule(wick_core::LrSchedule::warmup_cosine(1, 4, 0.1)),
                ),
                &data,
                None,
            )
            .unwrap();
        root
    }

    #[test]
    fn a_good_checkpoint_is_described_whole() {
        let root = checkpoint();
        let text = report(&root.path().join("last"), true).unwrap();
        for expected in [
            "step 2, epoch 0, strategy zero3, world size 2",
            "optimizer adamw at step 2",
            "lr schedule: 1 warmup steps, cosine decay to 0.1 of the rate at step 4",
            "train_loss=",
            "rank-0.safetensors",
            "rank-1.safetensors",
            "blocks.0.attn.qkv.weight",
            "[48, 16] F32",
        ] {
            assert!(text.contains(expected), "missing {expected:?} in\n{text}");
        }
        assert!(!report(&root.path().join("last"), false)
            .unwrap()
            .contains("tensors:"));
    }

    #[test]
    fn a_damaged_checkpoint_gets_the_errors_loading_gets() {
        let root = checkpoint();
        let dir = wick_trainer::checkpoint::resolve_checkpoint(root.path().join("last")).unwrap();
        let file = dir.join("rank-1.safetensors");
        let bytes = std::fs::read(&file).unwrap();
        std::fs::write(&file, &bytes[..bytes.len() / 2]).unwrap();
        let inspected = report(&dir, false).unwrap_err().to_string();
        let loaded = Checkpoint::open(&dir).err().unwrap().to_string();
        assert_eq!(inspected, loaded);
        assert!(inspected.contains("rank-1.safetensors"), "{inspected}");
        std::fs::remove_file(dir.join("manifest.json")).unwrap();
        assert!(report(&dir, false)
            .unwrap_err()
            .to_string()
            .contains("manifest.json"));
    }
}
