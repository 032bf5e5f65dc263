//! Typed reads of a GGUF file's metadata, each failure naming the file and the key.

use crate::ModelError;
use candle_core::quantized::gguf_file::{Content, Value};
use std::path::Path;

/// The metadata of the GGUF file at `path`.
pub(crate) struct Metadata<'a> {
    pub(crate) content: &'a Content,
    pub(crate) path: &'a Path,
}

impl<'a> Metadata<'a> {
    /// An error naming the file.
    pub(crate) fn error(&self, message: impl Into<String>) -> ModelError {
        ModelError::Missing {
            path: self.path.to_path_buf(),
            message: message.into(),
        }
    }

    fn wrong(&self, key: &str, wanted: &str, value: &Value) -> ModelError {
        self.error(format!("metadata {key} is {value:?}, not {wanted}"))
    }

    /// The value of `key`, if the file has it.
    pub(crate) fn get(&self, key: &str) -> Option<&'a Value> {
        self.content.metadata.get(key)
    }

    /// `key` as an unsigned integer (any width, as llama.cpp's writers vary).
    pub(crate) fn u64(&self, key: &str) -> Result<Option<u64>, ModelError> {
        let Some(value) = self.get(key) else {
            return Ok(None);
        };
        let as_i64 = |v: i64| u64::try_from(v).ok();
        let n = match value {
            Value::I8(v) => as_i64(i64::from(*v)),
            Value::I16(v) => as_i64(i64::from(*v)),
            Value::I32(v) => as_i64(i64::from(*v)),
            Value::I64(v) => as_i64(*v),
            v => v.to_u64().ok(),
        };
        n.map(Some)
            .ok_or_else(|| self.wrong(key, "an unsigned integer", value))
    }

    /// `key` as an unsigned integer, which the file must have.
    pub(crate) fn required(&self, key: &str) -> Result<u64, ModelError> {
        self.u64(key)?
            .ok_or_else(|| self.error(format!("has no metadata {key}")))
    }

    /// `key` as a float.
    pub(crate) fn f64(&self, key: &str) -> Result<Option<f64>, ModelError> {
        let Some(value) = self.get(key) else {
            return Ok(None);
        };
        match value {
            Value::F32(v) => Ok(Some(f64::from(*v))),
            Value::F64(v) => Ok(Some(*v)),
            v => Err(self.wrong(key, "a float", v)),
        }
    }

    /// `key` as a boolean.
    pub(crate) fn bool(&self, key: &str) -> Result<Option<bool>, ModelError> {
        self.get(key)
            .map(|v| v.to_bool().map_err(|_| self.wrong(key, "a boolean", v)))
            .transpose()
    }

    /// `key` as a string.
    pub(crate) fn str(&self, key: &str) -> Result<Option<&'a str>, ModelError> {
        self.get(key)
            .map(|v| match v {
                Value::String(s) => Ok(s.as_str()),
                v => Err(self.wrong(key, "a string", v)),
            })
            .transpose()
    }

    /// `key` as an array whose every element `each` reads.
    pub(crate) fn array<T>(
        &self,
        key: &str,
        each: impl Fn(&'a Value) -> Option<T>,
    ) -> Result<Option<Vec<T>>, ModelError> {
        let Some(value) = self.get(key) else {
            return Ok(None);
        };
        let Value::Array(items) = value else {
            return Err(self.error(format!("metadata {key} is not an array")));
        };
        items
            .iter()
            .enumerate()
            .map(|(i, v)| {
                each(v).ok_or_else(|| self.error(format!("metadata {key}[{i}] is {v:?}")))
            })
            .collect::<Result<Vec<T>, _>>()
            .map(Some)
    }
}

/// A string element of an array.
pub(crate) fn string(v: &Value) -> Option<&str> {
    match v {
        Value::String(s) => Some(s),
        _ => None,
    }
}
