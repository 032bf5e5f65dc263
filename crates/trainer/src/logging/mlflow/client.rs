//! The logging thread's side of an MLflow run: the REST calls, the batches, the backlog
//! kept while the server does not answer, and what it is told over its channel.

use super::target::MlflowTarget;
use serde_json::{json, Value};
use std::collections::VecDeque;
use std::sync::mpsc;
use std::time::{Duration, Instant};

/// Metrics kept for a server that does not answer; older ones are dropped past it.
pub(super) const BACKLOG: usize = 100_000;
/// Metrics per `log-batch` request (the server's limit is 1000).
const BATCH: usize = 1000;
/// Params per `log-batch` request (the server's limit).
const PARAMS_PER_BATCH: usize = 100;
/// A batch goes at most this long after its first metric.
const SEND_EVERY: Duration = Duration::from_secs(1);

/// What the logging thread is told.
pub(super) enum Message {
    /// One step's metrics.
    Metrics(Vec<Value>),
    /// The run ended with this status: send what is left, terminate the run, report.
    End(&'static str),
}

/// What never reached the server.
pub(super) struct Unsent {
    pub(super) metrics: usize,
    pub(super) terminated: bool,
}

/// The logging thread's side: the server, the run, and what waits to be sent.
pub(super) struct MlflowClient {
    target: MlflowTarget,
    agent: ureq::Agent,
    run_name: String,
    /// `None` until the server created the run (it may be down at the start).
    pub(super) run_id: Option<String>,
    /// Params not sent yet.
    params: VecDeque<(String, String)>,
    /// Metrics not sent yet, oldest first.
    backlog: VecDeque<Value>,
    /// Metrics dropped from a full backlog, or refused by the server.
    dropped: usize,
    /// When the last request failed: the next waits [`SEND_EVERY`] after it.
    failed_at: Option<Instant>,
    /// The first failure was reported.
    pub(super) warned: bool,
}

impl MlflowClient {
    pub(super) fn new(target: &MlflowTarget, run_name: &str, params: &[(String, String)]) -> Self {
        let config = ureq::Agent::config_builder()
            .timeout_global(Some(Duration::from_secs(5)))
            .build();
        MlflowClient {
            target: target.clone(),
            agent: config.into(),
            run_name: run_name.to_string(),
            run_id: None,
            params: params.iter().cloned().collect(),
            backlog: VecDeque::new(),
            dropped: 0,
            failed_at: None,
            warned: false,
        }
    }

    pub(super) fn run_address(&self) -> String {
        match &self.run_id {
            Some(id) => format!(
                "{}/#/experiments/{}/runs/{id}",
                self.target.uri, self.target.experiment_id
            ),
            None => format!("{} (the run is not created yet)", self.target.uri),
        }
    }

    /// Takes messages until the run ends; sends a batch when it is full or
    /// [`SEND_EVERY`] old, and everything at the end.
    pub(super) fn run(mut self, messages: mpsc::Receiver<Message>) -> Unsent {
        if self.run_id.is_some() {
            self.send_params();
        }
        let mut oldest: Option<Instant> = None;
        loop {
            match messages.recv_timeout(SEND_EVERY) {
                Ok(Message::Metrics(metrics)) => {
                    for metric in metrics {
                        if self.backlog.len() == BACKLOG {
                            self.backlog.pop_front();
                            self.dropped += 1;
                        }
                        self.backlog.push_back(metric);
                    }
                    oldest.get_or_insert_with(Instant::now);
                }
                Ok(Message::End(status)) => {
                    self.failed_at = None;
                    self.send();
                    let terminated = self.terminate(status);
                    return Unsent {
                        metrics: self.backlog.len() + self.dropped,
                        terminated,
                    };
                }
                Err(mpsc::RecvTimeoutError::Timeout) => {}
                Err(mpsc::RecvTimeoutError::Disconnected) => {
                    return Unsent {
                        metrics: self.backlog.len() + self.dropped,
                        terminated: self.terminate("FAILED"),
                    }
                }
            }
            let due =
                self.backlog.len() >= BATCH || oldest.is_some_and(|t| t.elapsed() >= SEND_EVERY);
            let may_retry = self.failed_at.is_none_or(|t| t.elapsed() >= SEND_EVERY);
            if due && may_retry {
                self.send();
                if self.backlog.is_empty() {
                    oldest = None;
                }
            }
        }
    }

    fn post(&self, endpoint: &str, body: &Value) -> Result<Value, PostError> {
        let url = format!("{}/api/2.0/mlflow/{endpoint}", self.target.uri);
        let mut response = self.agent.post(&url).send_json(body).map_err(|e| {
            let message = format!("POST {url}: {e}");
            match e {
                // The server read the request and refused what it holds: sending it again
                // would be refused again, and hold up everything after it.
                ureq::Error::StatusCode(code) if (400..500).contains(&code) => {
                    PostError::Refused(message)
                }
                _ => PostError::Unreachable(message),
            }
        })?;
        response
            .body_mut()
            .read_json::<Value>()
            .map_err(|e| PostError::Unreachable(format!("POST {url}: the answer is not JSON: {e}")))
    }

    /// Reports `failure` the first time only: a down server is said once, not every step.
    fn failed(&mut self, failure: impl std::fmt::Display) {
        self.failed_at = Some(Instant::now());
        if !self.warned {
            self.warned = true;
            log::warn!(
                "mlflow: {failure}; training goes on, and metrics wait (at most {BACKLOG}) \
                 to be sent later"
            );
        }
    }

    /// Creates the run and sends its params, if not done yet; false while the server does
    /// not answer.
    pub(super) fn connect(&mut self) -> bool {
        self.create_run() && self.send_params()
    }

    /// Creates the run, if not done yet; false while the server does not answer.
    pub(super) fn create_run(&mut self) -> bool {
        if self.run_id.is_none() {
            let body = json!({
                "experiment_id": self.target.experiment_id,
                "run_name": self.run_name,
                "start_time": now_ms(),
                "tags": [{"key": "mlflow.source.name", "value": "wick"}],
            });
            let created = self.post("runs/create", &body).and_then(|answer| {
                answer["run"]["info"]["run_id"]
                    .as_str()
                    .map(str::to_string)
                    .ok_or_else(|| {
                        PostError::Unreachable(format!(
                            "runs/create answered without a run_id: {answer}"
                        ))
                    })
            });
            match created {
                Ok(id) => self.run_id = Some(id),
                Err(e) => {
                    self.failed(e);
                    return false;
                }
            }
        }
        true
    }

    /// Sends the params not sent yet; false while the server does not take them.
    fn send_params(&mut self) -> bool {
        // In batches, as the server takes them (100 params a request), not one a request.
        while !self.params.is_empty() {
            let n = self.params.len().min(PARAMS_PER_BATCH);
            let params: Vec<Value> = (self.params.range(..n))
                .map(|(key, value)| json!({"key": key, "value": value}))
                .collect();
            let body = json!({"run_id": self.run_id, "params": params});
            if let Err(e) = self.post("runs/log-batch", &body) {
                self.failed(e);
                return false;
            }
            self.params.drain(..n);
        }
        true
    }

    /// Sends the backlog in batches, as far as the server takes it.
    fn send(&mut self) {
        if self.backlog.is_empty() || !self.connect() {
            return;
        }
        while !self.backlog.is_empty() {
            let n = self.backlog.len().min(BATCH);
            let metrics: Vec<Value> = self.backlog.range(..n).cloned().collect();
            let body = json!({"run_id": self.run_id, "metrics": metrics});
            match self.post("runs/log-batch", &body) {
                Ok(_) => {}
                Err(PostError::Refused(e)) => {
                    log::warn!("mlflow refused {n} metrics, which are dropped: {e}");
                    self.dropped += n;
                }
                Err(e) => {
                    self.failed(e);
                    return;
                }
            }
            self.backlog.drain(..n);
        }
    }

    /// Ends the run as `status` on the server; false if it could not be told.
    fn terminate(&mut self, status: &str) -> bool {
        if !self.connect() {
            return false;
        }
        let body = json!({"run_id": self.run_id, "status": status, "end_time": now_ms()});
        match self.post("runs/update", &body) {
            Ok(_) => true,
            Err(e) => {
                self.failed(e);
                false
            }
        }
    }
}

/// Why a request did not go through.
enum PostError {
    /// The server answered that the request is wrong (4xx): never sent again.
    Refused(String),
    /// No answer, or one to try again later (a server that is down or failing).
    Unreachable(String),
}

impl std::fmt::Display for PostError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            PostError::Refused(m) | PostError::Unreachable(m) => f.write_str(m),
        }
    }
}

/// A metric's value as MLflow's REST API takes it: a JSON number, or for a value JSON has no
/// number for, the strings of protobuf's JSON mapping ("NaN", "Infinity", "-Infinity"),
/// which MLflow stores as those values (serde_json would send `null`, refused or stored as
/// 0).
pub(super) fn metric_value(value: f64) -> Value {
    match value {
        v if v.is_nan() => json!("NaN"),
        v if v == f64::INFINITY => json!("Infinity"),
        v if v == f64::NEG_INFINITY => json!("-Infinity"),
        v => json!(v),
    }
}

/// Milliseconds since the Unix epoch, MLflow's timestamps.
pub(super) fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn non_finite_values_go_as_mlflow_reads_them() {
        assert_eq!(metric_value(f64::NAN), json!("NaN"));
        assert_eq!(metric_value(f64::INFINITY), json!("Infinity"));
        assert_eq!(metric_value(f64::NEG_INFINITY), json!("-Infinity"));
        assert_eq!(metric_value(0.25), json!(0.25));
    }
}
