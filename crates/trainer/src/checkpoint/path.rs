//! The one resolution of a checkpoint path, used by everything that reads a checkpoint:
//! a checkpoint directory (it holds `manifest.json`), a checkpoint root (it holds `last`),
//! or a root's `last` file itself.

use super::manifest::MANIFEST_FILE;
use super::model_checkpoint::LAST_FILE;
use super::CheckpointError;
use std::path::{Path, PathBuf};

/// A checkpoint directory, and the `last` file that named it, if one did.
pub(crate) struct Resolved {
    pub(crate) dir: PathBuf,
    pub(crate) pointer: Option<PathBuf>,
}

impl Resolved {
    /// `error`, saying which `last` pointed at the checkpoint when one did.
    pub(crate) fn explain(&self, error: CheckpointError) -> CheckpointError {
        match &self.pointer {
            Some(last) => CheckpointError::NamedBy {
                last: last.clone(),
                error: Box::new(error),
            },
            None => error,
        }
    }
}

/// Resolves `path` as [`resolve_checkpoint`] does, keeping the pointer it went through.
pub(crate) fn resolve(path: &Path) -> Result<Resolved, CheckpointError> {
    let not_a_checkpoint = |message: &str| CheckpointError::NotACheckpoint {
        path: path.to_path_buf(),
        message: message.to_string(),
    };
    let pointer = if path.is_file() {
        if path.file_name().and_then(|n| n.to_str()) != Some(LAST_FILE) {
            return Err(not_a_checkpoint(&format!(
                "a file, where a checkpoint directory (with {MANIFEST_FILE}) or a checkpoint \
                 root (with a `{LAST_FILE}` file) was expected"
            )));
        }
        path.to_path_buf()
    } else if path.is_dir() {
        if path.join(MANIFEST_FILE).is_file() || !path.join(LAST_FILE).is_file() {
            // A checkpoint, or a directory that Checkpoint::open will say is none.
            return Ok(Resolved {
                dir: path.to_path_buf(),
                pointer: None,
            });
        }
        path.join(LAST_FILE)
    } else {
        return Err(not_a_checkpoint("no such file or directory"));
    };
    let name = std::fs::read_to_string(&pointer).map_err(CheckpointError::io(&pointer))?;
    let name = name.trim();
    if name.is_empty() || name.contains(['/', '\\']) || name.starts_with('.') {
        return Err(CheckpointError::NotACheckpoint {
            path: pointer,
            message: format!("'{name}' is not a checkpoint name"),
        });
    }
    Ok(Resolved {
        dir: pointer.with_file_name(name),
        pointer: Some(pointer),
    })
}

/// The checkpoint directory `path` names: a checkpoint directory itself, a root whose
/// `last` file names one (`ck`), or that `last` file (`ck/last`). A file that is not a
/// `last` pointer, or a path that does not exist, is an error saying so.
pub fn resolve_checkpoint(path: impl AsRef<Path>) -> Result<PathBuf, CheckpointError> {
    resolve(path.as_ref()).map(|r| r.dir)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_checkpoint_a_root_and_its_pointer_resolve_alike() {
        let tmp = tempfile::tempdir().unwrap();
        let root = tmp.path();
        let ck = root.join("step-00000002");
        std::fs::create_dir_all(&ck).unwrap();
        std::fs::write(ck.join(MANIFEST_FILE), "{}").unwrap();
        std::fs::write(root.join(LAST_FILE), "step-00000002\n").unwrap();
        for path in [ck.clone(), root.to_path_buf(), root.join(LAST_FILE)] {
            assert_eq!(resolve_checkpoint(&path).unwrap(), ck, "{}", path.display());
        }
        assert!(resolve(&ck).unwrap().pointer.is_none());
        assert_eq!(resolve(root).unwrap().pointer, Some(root.join(LAST_FILE)));

        let e = resolve_checkpoint(ck.join(MANIFEST_FILE))
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("manifest.json") && e.contains("a file, where a checkpoint directory"),
            "{e}"
        );
        let e = resolve_checkpoint(root.join("nothing"))
            .unwrap_err()
            .to_string();
        assert!(e.contains("no such file or directory"), "{e}");
        std::fs::write(root.join(LAST_FILE), "../elsewhere").unwrap();
        let e = resolve_checkpoint(root).unwrap_err().to_string();
        assert!(e.contains("'../elsewhere' is not a checkpoint name"), "{e}");
    }
}
