//! Where a fit writes: its log directory and its checkpoint root, chosen before any rank
//! starts so that a run never writes into another run's.
//!
//! A fit that does not resume takes `<log dir>/<run name>` and the configured checkpoint
//! root when they are free, and otherwise the first free version of each: `<name>-v1`,
//! `<name>-v2`, ... (Lightning's `version_N`). A resumed fit continues where the run it
//! resumes wrote: the log directory its checkpoint records and the root the checkpoint
//! lies in, when those are the configured ones or versions of them.

use std::path::{Path, PathBuf};

/// Whether `name` is `base` or a version of it (`base-v<K>`).
fn is_version_of(name: &str, base: &str) -> bool {
    name == base
        || name
            .strip_prefix(base)
            .and_then(|rest| rest.strip_prefix("-v"))
            .is_some_and(|k| !k.is_empty() && k.bytes().all(|b| b.is_ascii_digit()))
}

/// `base`, or its first version that `taken` does not hold.
fn first_free(base: &Path, taken: impl Fn(&Path) -> bool) -> PathBuf {
    let name = base
        .file_name()
        .map(|n| n.to_string_lossy().to_string())
        .unwrap_or_default();
    (0..)
        .map(|v| match v {
            0 => base.to_path_buf(),
            v => base.with_file_name(format!("{name}-v{v}")),
        })
        .find(|p| !taken(p))
        .expect("some version is free")
}

/// A log directory is another run's once anything is in it.
fn log_dir_taken(dir: &Path) -> bool {
    match std::fs::read_dir(dir) {
        Ok(mut entries) => entries.next().is_some(),
        Err(_) => dir.exists(),
    }
}

/// A checkpoint root is another run's once it holds a `last` pointer or a `step-*` entry
/// (other folders inside it, such as another root, leave it free, and so does a save that
/// never completed, `step-*.tmp`: it was never a checkpoint, and the next save of that step
/// removes it).
fn checkpoint_root_taken(root: &Path) -> bool {
    if root.is_file() {
        return true;
    }
    let Ok(entries) = std::fs::read_dir(root) else {
        return false;
    };
    entries.flatten().any(|e| {
        let name = e.file_name();
        let name = name.to_string_lossy();
        name == crate::checkpoint::LAST_FILE
            || (name.starts_with("step-") && !name.ends_with(".tmp"))
    })
}

/// `base` or the version of it that `recorded` (a directory an earlier run wrote) is: the
/// same parent directory and a version's name. `None` when `recorded` is something else.
fn version_at(recorded: &Path, base: &Path) -> Option<PathBuf> {
    let name = recorded.file_name()?.to_str()?;
    let parent_of = |p: &Path| {
        let parent = p.parent().filter(|p| !p.as_os_str().is_empty());
        parent.unwrap_or(Path::new(".")).canonicalize().ok()
    };
    let same_parent = parent_of(recorded).is_some() && parent_of(recorded) == parent_of(base);
    (same_parent && is_version_of(name, base.file_name()?.to_str()?))
        .then(|| base.with_file_name(name))
}

/// The log directory of a fit: `(directory, continues)`. `resumed_run` is the log
/// directory the checkpoint resumed from records; when it is `<log_root>/<run_name>` or a
/// version of it, the fit continues that directory's metrics.
pub(crate) fn log_dir(
    log_root: &Path,
    run_name: &str,
    resumed_run: Option<&Path>,
) -> (PathBuf, bool) {
    let base = log_root.join(run_name);
    match resumed_run.and_then(|run| version_at(run, &base)) {
        Some(dir) => (dir, true),
        None => (first_free(&base, log_dir_taken), false),
    }
}

/// The checkpoint root of a fit configured to save under `root`. `resumed_from` is the
/// checkpoint directory it resumes from: when that lies in `root` or in a version of it,
/// the fit keeps saving there.
pub(crate) fn checkpoint_root(root: &Path, resumed_from: Option<&Path>) -> PathBuf {
    resumed_from
        .and_then(|checkpoint| version_at(checkpoint.parent()?, root))
        .unwrap_or_else(|| first_free(root, checkpoint_root_taken))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versions_are_named_and_recognised() {
        assert!(is_version_of("run", "run"));
        assert!(is_version_of("run-v12", "run"));
        assert!(!is_version_of("run-v", "run"));
        assert!(!is_version_of("run-vx", "run"));
        assert!(!is_version_of("running", "run"));
    }

    #[test]
    fn a_new_run_takes_the_first_free_version() {
        let tmp = tempfile::tempdir().unwrap();
        let logs = tmp.path();
        assert_eq!(log_dir(logs, "r", None), (logs.join("r"), false));
        // An empty directory is free; one with anything in it is not.
        std::fs::create_dir_all(logs.join("r")).unwrap();
        assert_eq!(log_dir(logs, "r", None).0, logs.join("r"));
        std::fs::write(logs.join("r/metrics.csv"), "").unwrap();
        std::fs::create_dir_all(logs.join("r-v1/loss.png")).unwrap();
        assert_eq!(log_dir(logs, "r", None).0, logs.join("r-v2"));
        // A resumed run continues its own version, not the first free one.
        let recorded = logs.join("r-v1");
        assert_eq!(
            log_dir(logs, "r", Some(&recorded)),
            (recorded.clone(), true)
        );
        assert_eq!(
            log_dir(logs, "r", Some(&logs.join("other"))).0,
            logs.join("r-v2")
        );
        // The same name under another log dir is another run.
        let elsewhere = tmp.path().join("elsewhere/r");
        std::fs::create_dir_all(&elsewhere).unwrap();
        assert_eq!(log_dir(logs, "r", Some(&elsewhere)).0, logs.join("r-v2"));

        let ck = tmp.path().join("ck");
        assert_eq!(checkpoint_root(&ck, None), ck);
        std::fs::create_dir_all(ck.join("nested-root")).unwrap();
        assert_eq!(
            checkpoint_root(&ck, None),
            ck,
            "a folder inside is not a checkpoint"
        );
        std::fs::create_dir_all(ck.join("step-00000004.tmp")).unwrap();
        assert_eq!(
            checkpoint_root(&ck, None),
            ck,
            "a save that never completed"
        );
        std::fs::create_dir_all(ck.join("step-00000004")).unwrap();
        assert_eq!(checkpoint_root(&ck, None), tmp.path().join("ck-v1"));
        std::fs::create_dir_all(tmp.path().join("ck-v1")).unwrap();
        std::fs::write(tmp.path().join("ck-v1/last"), "step-00000004").unwrap();
        assert_eq!(checkpoint_root(&ck, None), tmp.path().join("ck-v2"));
        let from = tmp.path().join("ck-v1/step-00000004");
        assert_eq!(checkpoint_root(&ck, Some(&from)), tmp.path().join("ck-v1"));
        let elsewhere = tmp.path().join("nested/ck/step-00000004");
        std::fs::create_dir_all(&elsewhere).unwrap();
        assert_eq!(
            checkpoint_root(&ck, Some(&elsewhere)),
            tmp.path().join("ck-v2"),
            "a checkpoint of another root does not make this one continue"
        );
    }
}
