//! The MLflow logger: a run on an MLflow tracking server, over its REST API
//! (`runs/create`, `runs/log-batch` for params and metrics, and `runs/update` for the status
//! at the end, what the Python client's `set_terminated` sends).
//!
//! Metrics are sent in batches, not one request a step. A server that is down or answers
//! errors never stops training: the first failure is reported once, what could not be sent
//! waits in a bounded backlog (the oldest dropped beyond it) and is tried again with the next
//! batch, and the end of the run reports what was never sent. A run that fails is marked
//! `FAILED` on the server, one that ends `FINISHED`.

use crate::logging::sinks::{StepRecord, StepSink};
use crate::logging::tensorboard::scalars;
use crate::TrainerError;
use serde_json::{json, Value};
use std::collections::VecDeque;
use std::sync::mpsc;
use std::time::{Duration, Instant};

/// Metrics kept for a server that does not answer; older ones are dropped past it.
const BACKLOG: usize = 100_000;
/// Metrics per `log-batch` request (the server's limit is 1000).
const BATCH: usize = 1000;
/// Params per `log-batch` request (the server's limit).
const PARAMS_PER_BATCH: usize = 100;
/// A batch goes at most this long after its first metric.
const SEND_EVERY: Duration = Duration::from_secs(1);

/// Where an MLflow run goes: a tracking server's `http://` address and an experiment.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MlflowTarget {
    uri: String,
    experiment_id: String,
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

/// An MLflow run being logged: the steps' metrics go to a thread of its own, which talks
/// to the server, so that training never waits on it.
pub(crate) struct MlflowLog {
    to_client: Option<mpsc::Sender<Message>>,
    client: Option<std::thread::JoinHandle<Unsent>>,
    address: String,
    run_name: String,
    uri: String,
}

/// What the logging thread is told.
enum Message {
    /// One step's metrics.
    Metrics(Vec<Value>),
    /// The run ended with this status: send what is left, terminate the run, report.
    End(&'static str),
}

/// What never reached the server.
struct Unsent {
    metrics: usize,
    terminated: bool,
}

impl MlflowLog {
    /// Starts a run called `run_name` with `params` on `target`'s server (created here, so
    /// that its address is known; a server that does not answer is reported and tried
    /// again later) and the thread that logs to it, which sends the params.
    pub(crate) fn start(
        target: &MlflowTarget,
        run_name: &str,
        params: &[(String, String)],
    ) -> Result<Self, TrainerError> {
        let mut client = MlflowClient::new(target, run_name, params);
        // The run now, for its address; its params from the logging thread.
        client.create_run();
        let address = client.run_address();
        let (to_client, messages) = mpsc::channel();
        let thread = std::thread::Builder::new()
            .name("wick-mlflow".into())
            .spawn(move || client.run(messages))
            .map_err(|cause| TrainerError::Io {
                path: "the mlflow logger's thread".into(),
                cause,
            })?;
        Ok(MlflowLog {
            to_client: Some(to_client),
            client: Some(thread),
            address,
            run_name: run_name.to_string(),
            uri: target.uri.clone(),
        })
    }

    /// The run's address on the server, or the server's while the run is not created.
    pub(crate) fn run_address(&self) -> String {
        self.address.clone()
    }

    /// Tells the thread the run ended as `status` and waits for its report.
    fn end(&mut self, status: &'static str) -> Option<Unsent> {
        let to_client = self.to_client.take()?;
        let _ = to_client.send(Message::End(status));
        self.client.take()?.join().ok()
    }
}

impl StepSink for MlflowLog {
    fn step_end(&mut self, record: &StepRecord) -> Result<(), TrainerError> {
        let timestamp = now_ms();
        let metrics = scalars(record)
            .into_iter()
            .map(|(key, value)| {
                json!({"key": key, "value": metric_value(value), "timestamp": timestamp, "step": record.step})
            })
            .collect();
        if let Some(to_client) = &self.to_client {
            // A thread that ended (it never does before `End`) has nothing to lose here.
            let _ = to_client.send(Message::Metrics(metrics));
        }
        Ok(())
    }

    fn fail(&mut self) -> Result<(), TrainerError> {
        self.end("FAILED");
        Ok(())
    }

    fn finish(&mut self) -> Result<(), TrainerError> {
        if let Some(unsent) = self.end("FINISHED") {
            if unsent.metrics > 0 || !unsent.terminated {
                log::warn!(
                    "mlflow: {} metric value(s) of run '{}' were not sent to {}{}",
                    unsent.metrics,
                    self.run_name,
                    self.uri,
                    match unsent.terminated {
                        true => "",
                        false => ", and the run was not marked FINISHED",
                    }
                );
            }
        }
        Ok(())
    }
}

impl Drop for MlflowLog {
    /// A run that ends without `finish` failed: the server is told so, if it answers.
    fn drop(&mut self) {
        self.end("FAILED");
    }
}

/// The logging thread's side: the server, the run, and what waits to be sent.
struct MlflowClient {
    target: MlflowTarget,
    agent: ureq::Agent,
    run_name: String,
    /// `None` until the server created the run (it may be down at the start).
    run_id: Option<String>,
    /// Params not sent yet.
    params: VecDeque<(String, String)>,
    /// Metrics not sent yet, oldest first.
    backlog: VecDeque<Value>,
    /// Metrics dropped from a full backlog, or refused by the server.
    dropped: usize,
    /// When the last request failed: the next waits [`SEND_EVERY`] after it.
    failed_at: Option<Instant>,
    /// The first failure was reported.
    warned: bool,
}

impl MlflowClient {
    fn new(target: &MlflowTarget, run_name: &str, params: &[(String, String)]) -> Self {
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

    fn run_address(&self) -> String {
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
    fn run(mut self, messages: mpsc::Receiver<Message>) -> Unsent {
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
    fn connect(&mut self) -> bool {
        self.create_run() && self.send_params()
    }

    /// Creates the run, if not done yet; false while the server does not answer.
    fn create_run(&mut self) -> bool {
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
fn metric_value(value: f64) -> Value {
    match value {
        v if v.is_nan() => json!("NaN"),
        v if v == f64::INFINITY => json!("Infinity"),
        v if v == f64::NEG_INFINITY => json!("-Infinity"),
        v => json!(v),
    }
}

/// Milliseconds since the Unix epoch, MLflow's timestamps.
fn now_ms() -> u64 {
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

    #[test]
    fn a_server_that_is_down_stops_nothing_and_the_backlog_is_bounded() {
        // A port nobody listens on: every request fails at once.
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        drop(listener);
        let target = MlflowTarget::new(&format!("http://127.0.0.1:{port}")).unwrap();
        let mut client = MlflowClient::new(&target, "down", &[("lr".into(), "0.1".into())]);
        assert!(!client.connect());
        assert!(client.warned && client.run_id.is_none());
        assert!(client.run_address().contains("not created"));
        let (to_client, messages) = mpsc::channel();
        let metric = json!({"key": "train/loss", "value": 1.0, "timestamp": 0, "step": 1});
        for _ in 0..(BACKLOG / 100 + 3) {
            to_client
                .send(Message::Metrics(vec![metric.clone(); 100]))
                .unwrap();
        }
        to_client.send(Message::End("FINISHED")).unwrap();
        let unsent = client.run(messages);
        assert_eq!(
            unsent.metrics,
            BACKLOG + 300,
            "all kept or counted as dropped"
        );
        assert!(!unsent.terminated);
        // The logger's side never waits on the server.
        let mut log = MlflowLog::start(&target, "down", &[]).unwrap();
        let start = Instant::now();
        for step in 1..=1000 {
            log.step_end(&StepRecord {
                step,
                epoch: 0,
                train_loss: 2.0,
                val_loss: None,
                lr: 0.1,
                skipped_steps: 0,
                tokens_per_s: 1.0,
                epoch_time_s: 0.1,
                comm_wait_s: 0.0,
                grad_norm: Some(1.0),
                peak_memory_bytes: None,
                mfu: None,
            })
            .unwrap();
        }
        assert!(
            start.elapsed() < Duration::from_secs(2),
            "{:?}",
            start.elapsed()
        );
        log.finish().unwrap();
    }
}
