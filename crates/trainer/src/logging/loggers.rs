//! Which loggers a fit writes on rank 0 ([`Logger`]), and their opening before the ranks
//! start: an unwritable directory or a bad tracking URI is the fit's error before any step.

use crate::logging::metrics_csv::MetricsCsv;
use crate::logging::mlflow::{MlflowLog, MlflowTarget};
use crate::logging::sinks::StepSink;
use crate::logging::tensorboard::TensorBoardLog;
use crate::TrainerError;
use std::fmt;
use std::path::Path;
use std::str::FromStr;

/// A logger of the run's steps (Lightning's `logger=`): each gets every step's record on
/// rank 0. The default set is [`Logger::DEFAULT`], `csv` and `tensorboard`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Logger {
    /// `<log dir>/<run>/metrics.csv`, one row a step.
    Csv,
    /// TensorBoard event files in `<log dir>/<run>/` (`tensorboard --logdir <log dir>`).
    TensorBoard,
    /// An MLflow tracking server's run, over its REST API
    /// ([`TrainerBuilder::mlflow_uri`](crate::TrainerBuilder::mlflow_uri), or
    /// `MLFLOW_TRACKING_URI`).
    Mlflow,
}

impl Logger {
    /// Every logger, in the order the help lists them.
    pub const ALL: [Logger; 3] = [Logger::Csv, Logger::TensorBoard, Logger::Mlflow];
    /// What a fit writes unless told otherwise.
    pub const DEFAULT: [Logger; 2] = [Logger::Csv, Logger::TensorBoard];

    /// The name users type: `csv`, `tensorboard`, `mlflow`.
    pub fn name(self) -> &'static str {
        match self {
            Logger::Csv => "csv",
            Logger::TensorBoard => "tensorboard",
            Logger::Mlflow => "mlflow",
        }
    }
}

impl fmt::Display for Logger {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Logger {
    type Err = TrainerError;

    fn from_str(s: &str) -> Result<Self, TrainerError> {
        Logger::ALL
            .into_iter()
            .find(|l| l.name() == s)
            .ok_or_else(|| {
                TrainerError::config(
                    "logger",
                    format!("unknown logger '{s}'; valid: csv, tensorboard, mlflow"),
                )
            })
    }
}

/// Where one logger of a fit writes: a file, or a tracking server's run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LogDestination {
    /// The logger.
    pub logger: Logger,
    /// Its file, or its run's address.
    pub location: String,
}

/// The loggers' sinks, in order, and where each writes.
pub(crate) type OpenedLogs = (Vec<Box<dyn StepSink>>, Vec<LogDestination>);

/// What the loggers of one fit are told and where they go.
pub(crate) struct LogPlan<'a> {
    pub(crate) loggers: &'a [Logger],
    /// The run's directory.
    pub(crate) dir: &'a Path,
    pub(crate) run_name: &'a str,
    /// The step the run resumes after, when it continues its run's logs.
    pub(crate) resumed_after: Option<usize>,
    /// The run's options, (name, value), for TensorBoard's text and MLflow's params.
    pub(crate) options: &'a [(String, String)],
    pub(crate) mlflow: Option<&'a MlflowTarget>,
}

impl LogPlan<'_> {
    /// Opens every logger: their sinks, in the order given, and where each writes.
    pub(crate) fn open(&self) -> Result<OpenedLogs, TrainerError> {
        let mut sinks: Vec<Box<dyn StepSink>> = Vec::new();
        let mut destinations = Vec::new();
        for &logger in self.loggers {
            let (sink, location): (Box<dyn StepSink>, String) = match logger {
                Logger::Csv => {
                    let csv = match self.resumed_after {
                        Some(step) => MetricsCsv::resume(self.dir, step)?,
                        None => MetricsCsv::create(self.dir)?,
                    };
                    let path = csv.path().display().to_string();
                    (Box::new(csv), path)
                }
                Logger::TensorBoard => {
                    let tb = TensorBoardLog::open(self.dir, self.resumed_after, self.options)?;
                    let path = tb.path().display().to_string();
                    (Box::new(tb), path)
                }
                Logger::Mlflow => {
                    // The builder refuses the mlflow logger without a server.
                    let target = self.mlflow.expect("an mlflow target");
                    let log = MlflowLog::start(target, self.run_name, self.options)?;
                    let location = log.run_address();
                    (Box::new(log), location)
                }
            };
            sinks.push(sink);
            destinations.push(LogDestination { logger, location });
        }
        Ok((sinks, destinations))
    }
}
