//! Bad checkpoints: each is an error naming the file and the tensor or field, never a
//! panic, and the good checkpoint beside it is never touched.

use crate::common::{adamw, loader, Mlp};
use serde_json::{json, Value};
use std::path::{Path, PathBuf};
use tempfile::TempDir;
use wick::core::StateReader;
use wick::trainer::checkpoint::{resolve_checkpoint, MANIFEST_FILE};
use wick::trainer::{consolidate, Attached, Checkpoint, ModelCheckpoint, Trainer};

/// A good zero3 checkpoint of 2 ranks after 2 steps.
fn good_checkpoint(root: &TempDir) -> PathBuf {
    let mut t = Trainer::builder()
        .devices(2)
        .strategy("zero3")
        .max_steps(2)
        .no_logger()
        .progress(false)
        .model_summary(false)
        .checkpoint(ModelCheckpoint::new(root.path().join("ck")))
        .build()
        .unwrap();
    t.fit(&mut Attached::new(Mlp::new(adamw())), &loader(), None)
        .unwrap();
    resolve_checkpoint(root.path().join("ck/last")).unwrap()
}

/// A copy of checkpoint `dir` as `name`, with `edit` applied.
fn broken_copy(dir: &Path, name: &str, edit: impl FnOnce(&Path)) -> PathBuf {
    let copy = dir.parent().unwrap().join(name);
    std::fs::create_dir_all(&copy).unwrap();
    for entry in std::fs::read_dir(dir).unwrap() {
        let entry = entry.unwrap();
        std::fs::copy(entry.path(), copy.join(entry.file_name())).unwrap();
    }
    edit(&copy);
    copy
}

fn edit_manifest(dir: &Path, edit: impl FnOnce(&mut Value)) {
    let path = dir.join(MANIFEST_FILE);
    let mut v: Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    edit(&mut v);
    std::fs::write(&path, v.to_string()).unwrap();
}

/// Opens the checkpoint and reads every parameter and state from it.
fn load_everything(dir: &Path) -> Result<(), String> {
    let c = Checkpoint::open(dir).map_err(|e| e.to_string())?;
    let params: Vec<(String, Vec<usize>)> = c
        .parameters()
        .map(|(n, s)| (n.to_string(), s.to_vec()))
        .collect();
    for kind in std::iter::once("param".to_string()).chain(c.optimizer_kinds()) {
        for (name, shape) in &params {
            let shape = candle_core::Shape::from(shape.clone());
            let n = shape.elem_count();
            c.read(&kind, &[(name.clone(), shape)], 0..n)
                .map_err(|e| e.to_string())?;
        }
    }
    Ok(())
}

fn file_bytes(dir: &Path) -> Vec<(String, Vec<u8>)> {
    let mut files: Vec<(String, Vec<u8>)> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| {
            let e = e.unwrap();
            (
                e.file_name().to_string_lossy().to_string(),
                std::fs::read(e.path()).unwrap(),
            )
        })
        .collect();
    files.sort();
    files
}

fn assert_error(result: Result<(), String>, needles: &[&str]) {
    let err = result.expect_err("a bad checkpoint must be refused");
    for n in needles {
        assert!(err.contains(n), "'{n}' missing from: {err}");
    }
}

#[test]
fn each_bad_checkpoint_is_refused_with_the_file_and_the_tensor_or_field() {
    let root = TempDir::new().unwrap();
    let good = good_checkpoint(&root);
    let before = file_bytes(&good);
    load_everything(&good).unwrap();

    let truncated = broken_copy(&good, "truncated", |d| {
        let f = d.join("rank-1.safetensors");
        let len = std::fs::metadata(&f).unwrap().len();
        std::fs::OpenOptions::new()
            .write(true)
            .open(&f)
            .unwrap()
            .set_len(len - 10)
            .unwrap();
    });
    assert_error(
        load_everything(&truncated),
        &["rank-1.safetensors", "truncated"],
    );

    let corrupted = broken_copy(&good, "corrupted", |d| {
        let f = d.join("rank-0.safetensors");
        let mut bytes = std::fs::read(&f).unwrap();
        let last = bytes.len() - 1;
        bytes[last] ^= 0xff;
        std::fs::write(&f, bytes).unwrap();
    });
    assert_error(
        load_everything(&corrupted),
        &["rank-0.safetensors", "corrupted"],
    );

    // A file whose header is damaged but whose length and checksum were recorded that way
    // (as if written wrong): the safetensors validation still refuses it.
    let bad_header = broken_copy(&good, "bad-header", |d| {
        let f = d.join("rank-0.safetensors");
        let mut bytes = std::fs::read(&f).unwrap();
        bytes[0..8].copy_from_slice(&u64::MAX.to_le_bytes());
        std::fs::write(&f, &bytes).unwrap();
        rerecord(d, 0, &bytes);
    });
    assert_error(
        load_everything(&bad_header),
        &["rank-0.safetensors", "not a valid safetensors file"],
    );

    // The same damage done to a dtype: I32 has the size of F32, so offsets still validate.
    let wrong_dtype = broken_copy(&good, "wrong-dtype", |d| {
        let f = d.join("rank-1.safetensors");
        let mut bytes = std::fs::read(&f).unwrap();
        let at = bytes.windows(5).position(|w| w == b"\"F32\"").unwrap();
        bytes[at + 1..at + 4].copy_from_slice(b"I32");
        std::fs::write(&f, &bytes).unwrap();
        rerecord(d, 1, &bytes);
    });
    assert_error(
        load_everything(&wrong_dtype),
        &["rank-1.safetensors", "tensor '", "dtype I32"],
    );

    let missing_tensor = broken_copy(&good, "missing-tensor", |d| {
        edit_manifest(d, |m| {
            m["optimizer"]["state_kinds"]
                .as_array_mut()
                .unwrap()
                .push(json!("momentum_buffer"))
        })
    });
    assert_error(
        load_everything(&missing_tensor),
        &[
            "rank-0.safetensors",
            "'unit0.momentum_buffer'",
            "no such tensor",
        ],
    );

    let wrong_shape = broken_copy(&good, "wrong-shape", |d| {
        // unit1.param of rank 0 stored as [1, n] instead of [n]: a valid file, a wrong tensor.
        let f = d.join("rank-0.safetensors");
        let bytes = std::fs::read(&f).unwrap();
        let n = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
        let mut header: Value = serde_json::from_slice(&bytes[8..8 + n]).unwrap();
        let shape = header["unit1.param"]["shape"].as_array().unwrap()[0].clone();
        header["unit1.param"]["shape"] = json!([1, shape]);
        let mut text = header.to_string().into_bytes();
        text.resize(text.len().div_ceil(8) * 8, b' ');
        let mut out = (text.len() as u64).to_le_bytes().to_vec();
        out.extend(text);
        out.extend(&bytes[8 + n..]);
        std::fs::write(&f, &out).unwrap();
        rerecord(d, 0, &out);
    });
    assert_error(
        load_everything(&wrong_shape),
        &["rank-0.safetensors", "'unit1.param'", "shape [1, "],
    );

    let wrong_piece = broken_copy(&good, "wrong-piece", |d| {
        edit_manifest(d, |m| {
            // Rank 0's piece of unit0 said to be 1 element long: its file holds more.
            m["groups"][0]["pieces"][0]["end"] = json!(1);
            m["groups"][0]["pieces"][1]["start"] = json!(1);
        })
    });
    assert_error(
        load_everything(&wrong_piece),
        &["rank-0.safetensors", "the manifest gives it elements 0..1"],
    );

    let version = broken_copy(&good, "version", |d| {
        edit_manifest(d, |m| m["format_version"] = json!(99))
    });
    assert_error(
        load_everything(&version),
        &[MANIFEST_FILE, "'format_version'", "99"],
    );

    let missing_field = broken_copy(&good, "missing-field", |d| {
        edit_manifest(d, |m| {
            m.as_object_mut().unwrap().remove("groups");
        })
    });
    assert_error(load_everything(&missing_field), &[MANIFEST_FILE, "groups"]);

    let not_json = broken_copy(&good, "not-json", |d| {
        std::fs::write(d.join(MANIFEST_FILE), "{ not json").unwrap()
    });
    assert_error(load_everything(&not_json), &[MANIFEST_FILE]);

    let empty = root.path().join("empty");
    std::fs::create_dir_all(&empty).unwrap();
    assert_error(load_everything(&empty), &["empty", "not a wick checkpoint"]);
    assert_error(
        load_everything(&root.path().join("nowhere")),
        &["nowhere", "no such file or directory"],
    );

    // A checkpoint of another model: refused by the trainer before any state changes, on
    // every rank alike (no hang), naming the parameter.
    let other_model = broken_copy(&good, "other-model", |d| {
        edit_manifest(d, |m| {
            m["groups"][0]["params"][0]["name"] = json!("encoder.weight")
        })
    });
    let err = Trainer::builder()
        .devices(2)
        .strategy("zero3")
        .max_steps(3)
        .no_logger()
        .progress(false)
        .model_summary(false)
        .build()
        .unwrap()
        .fit_from(
            &mut Attached::new(Mlp::new(adamw())),
            &loader(),
            None,
            &other_model,
        )
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("'l0.weight'") && err.contains("other-model"),
        "{err}"
    );
    assert!(
        consolidate(&truncated, root.path().join("out.safetensors"), false).is_err(),
        "consolidate refuses a bad checkpoint too"
    );
    assert!(!root.path().join("out.safetensors").exists());

    assert_eq!(file_bytes(&good), before, "the good checkpoint was touched");
}

/// Records rank `rank`'s file as `bytes` in the manifest (length and checksum), so that
/// the damage is not caught by the checksum but by what comes after it.
fn rerecord(dir: &Path, rank: usize, bytes: &[u8]) {
    let crc = crc32fast::hash(bytes);
    edit_manifest(dir, |m| {
        m["files"][rank]["bytes"] = json!(bytes.len());
        m["files"][rank]["crc32"] = json!(crc);
    });
}

#[test]
fn random_bytes_and_truncations_give_errors_never_panics() {
    let root = TempDir::new().unwrap();
    let good = good_checkpoint(&root);
    let names = ["rank-0.safetensors", "rank-1.safetensors", MANIFEST_FILE];
    let originals: Vec<Vec<u8>> = names
        .iter()
        .map(|n| std::fs::read(good.join(n)).unwrap())
        .collect();
    let mut state = 0x2545_f491_4f6c_dd1du64;
    let mut next = |n: usize| {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        (state % n.max(1) as u64) as usize
    };
    let mut refused = 0;
    for round in 0..120 {
        let which = next(names.len());
        let mut bytes = originals[which].clone();
        match round % 4 {
            0 => bytes.truncate(next(bytes.len())),
            1 => {
                for _ in 0..1 + next(8) {
                    let at = next(bytes.len());
                    bytes[at] = next(256) as u8;
                }
            }
            2 => bytes = (0..next(4096)).map(|_| next(256) as u8).collect(),
            _ => {
                // Damage the header region, where lengths and offsets live.
                let at = next(bytes.len().min(400));
                bytes[at] = next(256) as u8;
            }
        }
        let dir = broken_copy(&good, &format!("fuzz-{round}"), |d| {
            std::fs::write(d.join(names[which]), &bytes).unwrap();
            if which < 2 && round % 8 >= 4 {
                // Half the file damage also gets a matching manifest record, so the
                // checksum does not stop it and the parsers meet it.
                rerecord(d, which, &bytes);
            }
        });
        // Loading must return, never panic; a changed value byte can make a valid file.
        if load_everything(&dir).is_err() {
            refused += 1;
        }
        std::fs::remove_dir_all(&dir).unwrap();
    }
    assert!(
        refused > 90,
        "only {refused} of 120 damaged checkpoints refused"
    );
}

#[test]
fn every_form_of_a_checkpoint_path_resolves_alike_everywhere() {
    let root = TempDir::new().unwrap();
    let dir = good_checkpoint(&root);
    let ck = root.path().join("ck");
    let want = Checkpoint::open(&dir).unwrap().manifest().step;
    for path in [dir.clone(), ck.clone(), ck.join("last")] {
        let what = path.display().to_string();
        assert_eq!(
            Checkpoint::open(&path).unwrap().manifest().step,
            want,
            "{what}"
        );
        let out = root.path().join("out.safetensors");
        consolidate(&path, &out, false).unwrap_or_else(|e| panic!("{what}: {e}"));
        std::fs::remove_file(&out).unwrap();
        let mut t = Trainer::builder()
            .devices(2)
            .strategy("zero3")
            .max_steps(3)
            .no_logger()
            .progress(false)
            .model_summary(false)
            .build()
            .unwrap();
        t.fit_from(
            &mut Attached::new(Mlp::new(adamw())),
            &loader(),
            None,
            &path,
        )
        .unwrap_or_else(|e| panic!("{what}: {e}"));
    }
    // A file where a checkpoint directory is expected is named as one.
    for file in [dir.join("rank-0.safetensors"), dir.join(MANIFEST_FILE)] {
        let e = consolidate(&file, root.path().join("x.safetensors"), false)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains(&file.display().to_string())
                && e.contains("a file, where a checkpoint directory"),
            "{e}"
        );
    }
    // What is wrong behind `last` says that `last` pointed there.
    std::fs::remove_file(dir.join(MANIFEST_FILE)).unwrap();
    let e = Checkpoint::open(&ck).err().unwrap().to_string();
    assert!(
        e.contains("manifest.json")
            && e.contains(&format!("{} points there", ck.join("last").display())),
        "{e}"
    );
    std::fs::remove_dir_all(&dir).unwrap();
    let e = Checkpoint::open(ck.join("last")).err().unwrap().to_string();
    assert!(
        e.contains("no such directory") && e.contains("points there"),
        "{e}"
    );
}

#[test]
fn attachments_are_saved_in_every_checkpoint_and_checked_whole() {
    let root = TempDir::new().unwrap();
    let mc = ModelCheckpoint::new(root.path().join("ck"))
        .every_n_steps(1)
        .with_attachment("notes.txt", b"config of the run".to_vec());
    let mut t = Trainer::builder()
        .devices(2)
        .strategy("zero3")
        .max_steps(2)
        .no_logger()
        .progress(false)
        .model_summary(false)
        .checkpoint(mc)
        .build()
        .unwrap();
    t.fit(&mut Attached::new(Mlp::new(adamw())), &loader(), None)
        .unwrap();
    for step in ["step-00000001", "step-00000002"] {
        let c = Checkpoint::open(root.path().join("ck").join(step)).unwrap();
        let path = c.attachment("notes.txt").unwrap();
        assert_eq!(std::fs::read(path).unwrap(), b"config of the run");
        assert!(c.attachment("other.txt").is_none());
    }
    let dir = root.path().join("ck/step-00000002");
    std::fs::write(dir.join("notes.txt"), b"config of the RUN").unwrap();
    let e = Checkpoint::open(&dir).err().unwrap().to_string();
    assert!(e.contains("notes.txt") && e.contains("corrupted"), "{e}");
    for bad in ["manifest.json", "rank-0.safetensors", "../x", ""] {
        let e = Trainer::builder()
            .checkpoint(ModelCheckpoint::new("ck").with_attachment(bad, vec![]))
            .build()
            .err()
            .unwrap()
            .to_string();
        assert!(e.contains("plain file name"), "{bad}: {e}");
    }
}
