//! The MLflow logger: a run on an MLflow tracking server, over its REST API
//! (`runs/create`, `runs/log-batch` for params and metrics, and `runs/update` for the status
//! at the end, what the Python client's `set_terminated` sends).
//!
//! Metrics are sent in batches, not one request a step. A server that is down or answers
//! errors never stops training: the first failure is reported once, what could not be sent
//! waits in a bounded backlog (the oldest dropped beyond it) and is tried again with the next
//! batch, and the end of the run reports what was never sent. A run that fails is marked
//! `FAILED` on the server, one that ends `FINISHED`.

mod client;
mod target;

pub use target::MlflowTarget;

use crate::logging::sinks::{StepRecord, StepSink};
use crate::logging::tensorboard::scalars;
use crate::TrainerError;
use client::{metric_value, now_ms, Message, MlflowClient, Unsent};
use serde_json::json;
use std::sync::mpsc;

/// An MLflow run being logged: the steps' metrics go to a thread of its own, which talks
/// to the server, so that training never waits on it.
pub(crate) struct MlflowLog {
    to_client: Option<mpsc::Sender<Message>>,
    client: Option<std::thread::JoinHandle<Unsent>>,
    address: String,
    run_name: String,
    uri: String,
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
            uri: target.uri().to_string(),
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

#[cfg(test)]
mod tests {
    use super::*;
    use client::BACKLOG;
    use std::time::{Duration, Instant};

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
                module_metrics: vec![],
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
