//! `weight_files`: which safetensors files hold a Hugging Face directory's weights.

use crate::ModelError;
use std::path::{Path, PathBuf};

/// The weight files of a Hugging Face directory: `model.safetensors`, or the shards that
/// `model.safetensors.index.json` lists.
pub(crate) fn weight_files(dir: &Path) -> std::result::Result<Vec<PathBuf>, ModelError> {
    let single = dir.join("model.safetensors");
    if single.is_file() {
        return Ok(vec![single]);
    }
    let index = dir.join("model.safetensors.index.json");
    let missing = |message: String| ModelError::Missing {
        path: index.clone(),
        message,
    };
    let text = std::fs::read_to_string(&index).map_err(|_| ModelError::Missing {
        path: dir.to_path_buf(),
        message: "has neither model.safetensors nor model.safetensors.index.json (wick reads \
                  safetensors weights only)"
            .into(),
    })?;
    let json: serde_json::Value =
        serde_json::from_str(&text).map_err(|e| missing(format!("not JSON: {e}")))?;
    let map = json
        .get("weight_map")
        .and_then(|m| m.as_object())
        .ok_or_else(|| missing("has no 'weight_map' object".into()))?;
    let mut files: Vec<PathBuf> = Vec::new();
    for file in map.values() {
        let name = file
            .as_str()
            .filter(|n| !n.contains(['/', '\\']) && !n.starts_with('.'))
            .ok_or_else(|| missing(format!("weight_map names {file}, not a file beside it")))?;
        let path = dir.join(name);
        if !files.contains(&path) {
            files.push(path);
        }
    }
    Ok(files)
}
