//! Where each step's record goes on rank 0: the [`StepSink`](crate::StepSink) trait and the
//! fit's sinks in order, the loggers ([`Logger`](crate::Logger): the metrics CSV,
//! TensorBoard event files, MLflow over its REST API), and the terminal's progress bars.

pub(crate) mod loggers;
pub(crate) mod metrics_csv;
pub(crate) mod mlflow;
pub(crate) mod progress;
pub(crate) mod sinks;
pub(crate) mod tensorboard;
