//! A TensorBoard event file, written natively: TFRecord framing (each record's length and
//! data followed by their masked CRC-32C) around `tensorflow.Event` protobuf messages,
//! encoded by prost's derive from the few fields of `event.proto` and `summary.proto` that
//! scalars and text need (no protoc, no generated code).

use std::io::Write;
use std::path::{Path, PathBuf};

/// `tensorflow.Event` (only the fields written here, under their proto tags).
#[derive(Clone, PartialEq, prost::Message)]
pub(crate) struct Event {
    /// Seconds since the Unix epoch.
    #[prost(double, tag = "1")]
    pub(crate) wall_time: f64,
    #[prost(int64, tag = "2")]
    pub(crate) step: i64,
    /// The first event of a file: `brain.Event:2`.
    #[prost(string, optional, tag = "3")]
    pub(crate) file_version: Option<String>,
    #[prost(message, optional, tag = "5")]
    pub(crate) summary: Option<Summary>,
    #[prost(message, optional, tag = "7")]
    pub(crate) session_log: Option<SessionLog>,
}

/// `tensorflow.Summary`.
#[derive(Clone, PartialEq, prost::Message)]
pub(crate) struct Summary {
    #[prost(message, repeated, tag = "1")]
    pub(crate) value: Vec<SummaryValue>,
}

/// `tensorflow.Summary.Value`: a scalar (`simple_value`) or a tensor with its plugin.
#[derive(Clone, PartialEq, prost::Message)]
pub(crate) struct SummaryValue {
    #[prost(string, tag = "1")]
    pub(crate) tag: String,
    #[prost(float, optional, tag = "2")]
    pub(crate) simple_value: Option<f32>,
    #[prost(message, optional, tag = "8")]
    pub(crate) tensor: Option<TensorProto>,
    #[prost(message, optional, tag = "9")]
    pub(crate) metadata: Option<SummaryMetadata>,
}

/// `tensorflow.SummaryMetadata`: which plugin shows the value.
#[derive(Clone, PartialEq, prost::Message)]
pub(crate) struct SummaryMetadata {
    #[prost(message, optional, tag = "1")]
    pub(crate) plugin_data: Option<PluginData>,
}

/// `tensorflow.SummaryMetadata.PluginData`.
#[derive(Clone, PartialEq, prost::Message)]
pub(crate) struct PluginData {
    #[prost(string, tag = "1")]
    pub(crate) plugin_name: String,
}

/// `tensorflow.TensorProto`: here only a scalar string (`DT_STRING`, no dimensions).
#[derive(Clone, PartialEq, prost::Message)]
pub(crate) struct TensorProto {
    #[prost(int32, tag = "1")]
    pub(crate) dtype: i32,
    #[prost(message, optional, tag = "2")]
    pub(crate) tensor_shape: Option<TensorShape>,
    #[prost(bytes = "vec", repeated, tag = "8")]
    pub(crate) string_val: Vec<Vec<u8>>,
}

/// `tensorflow.TensorShapeProto` with no dimensions: a scalar.
#[derive(Clone, PartialEq, prost::Message)]
pub(crate) struct TensorShape {}

/// `tensorflow.SessionLog`: a `START` at step S tells readers to drop what earlier files
/// logged at S and later (a run resumed from an earlier checkpoint).
#[derive(Clone, PartialEq, prost::Message)]
pub(crate) struct SessionLog {
    #[prost(int32, tag = "1")]
    pub(crate) status: i32,
}

/// `SessionLog.START`.
pub(crate) const SESSION_START: i32 = 1;
/// `DataType.DT_STRING`.
const DT_STRING: i32 = 7;

impl SummaryValue {
    /// A scalar: what TensorBoard's Scalars tab plots.
    pub(crate) fn scalar(tag: &str, value: f64) -> Self {
        SummaryValue {
            tag: tag.into(),
            simple_value: Some(value as f32),
            ..SummaryValue::default()
        }
    }

    /// A text, shown in the Text tab (markdown).
    pub(crate) fn text(tag: &str, text: &str) -> Self {
        SummaryValue {
            tag: tag.into(),
            tensor: Some(TensorProto {
                dtype: DT_STRING,
                tensor_shape: Some(TensorShape {}),
                string_val: vec![text.as_bytes().to_vec()],
            }),
            metadata: Some(SummaryMetadata {
                plugin_data: Some(PluginData {
                    plugin_name: "text".into(),
                }),
            }),
            ..SummaryValue::default()
        }
    }
}

/// TFRecord's CRC: CRC-32C, rotated and offset so that a CRC of data holding CRCs is not
/// itself trivial.
pub(crate) fn masked_crc32c(data: &[u8]) -> u32 {
    let crc = crc32c::crc32c(data);
    crc.rotate_right(15).wrapping_add(0xa282_ead8)
}

/// One TFRecord: length, its masked CRC, the data, its masked CRC.
pub(crate) fn record(data: &[u8]) -> Vec<u8> {
    let len = (data.len() as u64).to_le_bytes();
    let mut out = Vec::with_capacity(data.len() + 16);
    out.extend_from_slice(&len);
    out.extend_from_slice(&masked_crc32c(&len).to_le_bytes());
    out.extend_from_slice(data);
    out.extend_from_slice(&masked_crc32c(data).to_le_bytes());
    out
}

/// An event file being written: every event reaches the file when written, and a write
/// that fails is an error naming the file.
pub(crate) struct EventFile {
    path: PathBuf,
    file: std::fs::File,
}

impl EventFile {
    /// Creates a new event file in `dir` (made if missing), its name TensorBoard's
    /// `events.out.tfevents.<seconds>.<host>.<pid>.<n>`, and writes the file-version event.
    pub(crate) fn create(dir: &Path) -> std::io::Result<(Self, PathBuf)> {
        std::fs::create_dir_all(dir)?;
        let now = wall_time();
        let host = std::fs::read_to_string("/etc/hostname")
            .map(|h| h.trim().to_string())
            .ok()
            .filter(|h| !h.is_empty() && !h.contains('/'))
            .unwrap_or_else(|| "localhost".into());
        // A new name even for a second file of the same second in the same process.
        let (path, file) = (0..)
            .map(|n| {
                let name = format!(
                    "events.out.tfevents.{}.{host}.{}.{n}",
                    now as u64,
                    std::process::id()
                );
                dir.join(name)
            })
            .find_map(|path| {
                let created = std::fs::OpenOptions::new()
                    .write(true)
                    .create_new(true)
                    .open(&path);
                match created {
                    Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => None,
                    other => Some(other.map(|file| (path, file))),
                }
            })
            .expect("a free name")?;
        let mut out = EventFile {
            path: path.clone(),
            file,
        };
        out.write(&Event {
            wall_time: now,
            file_version: Some("brain.Event:2".into()),
            ..Event::default()
        })?;
        Ok((out, path))
    }

    /// The file.
    pub(crate) fn path(&self) -> &Path {
        &self.path
    }

    /// Appends `event` as one record.
    pub(crate) fn write(&mut self, event: &Event) -> std::io::Result<()> {
        let data = prost::Message::encode_to_vec(event);
        self.file.write_all(&record(&data))
    }
}

/// Seconds since the Unix epoch, as an event's `wall_time`.
pub(crate) fn wall_time() -> f64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn crc32c_and_its_mask_are_tfrecords() {
        // CRC-32C's check value (RFC 3720's test vector).
        assert_eq!(crc32c::crc32c(b"123456789"), 0xe306_9283);
        // The mask TensorFlow's `MaskedCrc` applies: rotate right by 15, add 0xa282ead8
        // (worked out by hand from the check value).
        assert_eq!(masked_crc32c(b"123456789"), 0xc78ab0e5);
        let r = record(b"abc");
        assert_eq!(r.len(), 8 + 4 + 3 + 4);
        assert_eq!(&r[..8], &3u64.to_le_bytes());
        assert_eq!(&r[12..15], b"abc");
    }

    #[test]
    fn an_event_file_holds_its_records_back_to_back() {
        let dir = tempfile::tempdir().unwrap();
        let (mut file, path) = EventFile::create(dir.path()).unwrap();
        let event = Event {
            wall_time: 1.5,
            step: 7,
            summary: Some(Summary {
                value: vec![SummaryValue::scalar("train/loss", 2.5)],
            }),
            ..Event::default()
        };
        file.write(&event).unwrap();
        let bytes = std::fs::read(&path).unwrap();
        let mut events = Vec::new();
        let mut at = 0;
        while at < bytes.len() {
            let len = u64::from_le_bytes(bytes[at..at + 8].try_into().unwrap()) as usize;
            let crc = u32::from_le_bytes(bytes[at + 8..at + 12].try_into().unwrap());
            assert_eq!(crc, masked_crc32c(&bytes[at..at + 8]));
            let data = &bytes[at + 12..at + 12 + len];
            let crc = u32::from_le_bytes(bytes[at + 12 + len..at + 16 + len].try_into().unwrap());
            assert_eq!(crc, masked_crc32c(data));
            events.push(<Event as prost::Message>::decode(data).unwrap());
            at += 16 + len;
        }
        assert_eq!(events.len(), 2);
        assert_eq!(events[0].file_version.as_deref(), Some("brain.Event:2"));
        assert_eq!(events[1], event);
        let name = path.file_name().unwrap().to_str().unwrap();
        assert!(name.starts_with("events.out.tfevents."), "{name}");
        // A second file in the same second gets its own name.
        let (_, second) = EventFile::create(dir.path()).unwrap();
        assert_ne!(second, path);
    }
}
