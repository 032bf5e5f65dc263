//! Where an MLflow run goes.

use crate::TrainerError;

/// Where an MLflow run goes: a tracking server's `http://` address and an experiment.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MlflowTarget {
    pub(super) uri: String,
    pub(super) experiment_id: String,
}

impl MlflowTarget {
    /// The tracking server at `uri` (`http://host:port`, MLflow's `--mlflow-uri` or
    /// `MLFLOW_TRACKING_URI`), experiment `0` (the server's default). Refused: another
    /// scheme (`https` needs TLS, which this client leaves out; `file:` and `databricks`
    /// are stores, not servers), or no host.
    pub fn new(uri: &str) -> Result<Self, TrainerError> {
        let bad = |why: &str| TrainerError::config("mlflow-uri", format!("'{uri}': {why}"));
        let rest = uri.strip_prefix("http://").ok_or_else(|| {
            bad("wick's MLflow client talks to a tracking server at http://host:port")
        })?;
        let host = rest.split(['/', ':']).next().unwrap_or_default();
        if host.is_empty() {
            return Err(bad("no host"));
        }
        Ok(MlflowTarget {
            uri: uri.trim_end_matches('/').to_string(),
            experiment_id: "0".into(),
        })
    }

    /// The same server, logging under experiment `id` (MLflow's `MLFLOW_EXPERIMENT_ID`).
    pub fn with_experiment_id(mut self, id: impl Into<String>) -> Self {
        self.experiment_id = id.into();
        self
    }

    /// The server's address.
    pub fn uri(&self) -> &str {
        &self.uri
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_tracking_uri_must_be_a_server() {
        let ok = MlflowTarget::new("http://127.0.0.1:5000/").unwrap();
        assert_eq!(ok.uri(), "http://127.0.0.1:5000");
        for bad in [
            "https://mlflow.example.com",
            "file:///tmp/mlruns",
            "databricks",
            "http://",
        ] {
            let e = MlflowTarget::new(bad).unwrap_err().to_string();
            assert!(e.contains("mlflow-uri") && e.contains(bad), "{e}");
        }
    }
}
