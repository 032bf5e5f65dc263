//! The logger the `wick` program installs: the library crates report through the `log`
//! crate and print nothing themselves, and this prints their records as the program always
//! has. Errors, warnings and notes go to standard error, one write a line so that ranks'
//! lines under a launcher do not interleave; the model summary goes to standard output.

use log::{Level, LevelFilter, Log, Metadata, Record};
use std::io::Write;

/// Prints records of level info and above: `error: `, `warning: ` or `note: ` and the
/// message on standard error, and the model summary
/// ([`SUMMARY_TARGET`](crate::trainer::SUMMARY_TARGET)) as it is on standard output.
pub struct TerminalLog;

impl TerminalLog {
    /// Installs it as the process's logger, once; a second call (or a logger installed
    /// before) leaves the first in place.
    pub fn install() {
        static LOG: TerminalLog = TerminalLog;
        if log::set_logger(&LOG).is_ok() {
            log::set_max_level(LevelFilter::Info);
        }
    }
}

impl Log for TerminalLog {
    fn enabled(&self, metadata: &Metadata) -> bool {
        metadata.level() <= Level::Info
    }

    fn log(&self, record: &Record) {
        if !self.enabled(record.metadata()) {
            return;
        }
        // A closed stream has nowhere to report to; the record is dropped, as a print would.
        let _ = if record.target() == crate::trainer::SUMMARY_TARGET {
            std::io::stdout().write_all(format!("{}", record.args()).as_bytes())
        } else {
            let prefix = match record.level() {
                Level::Error => "error",
                Level::Warn => "warning",
                _ => "note",
            };
            let line = format!("{prefix}: {}\n", record.args());
            std::io::stderr().write_all(line.as_bytes())
        };
    }

    fn flush(&self) {
        let _ = std::io::stdout().flush();
    }
}
