//! A rotary embedding's parameters, as `transformers` reads them: `rope_theta` and the
//! scaling of `rope_scaling` (older configs) or `rope_parameters` (transformers 5).

use super::fields::Fields;
use super::ConfigError;
use serde_json::{Map, Value};

/// The rotary embedding of a decoder: its base and how its frequencies are scaled.
#[derive(Debug, Clone, PartialEq)]
pub struct Rope {
    /// `rope_theta`: frequency i is `theta^(-2i / head_dim)` before scaling.
    pub theta: f64,
    /// `rope_type` and its parameters.
    pub scaling: RopeScaling,
}

/// The rope types wick builds, with the fields `transformers` reads for each.
#[derive(Debug, Clone, PartialEq)]
pub enum RopeScaling {
    /// `default`: unscaled.
    Default,
    /// `linear`: every frequency divided by `factor`.
    Linear {
        /// `factor`.
        factor: f64,
    },
    /// `dynamic` (NTK-aware): past `max_position_embeddings` the base grows with the
    /// sequence's length; within it, unscaled.
    Dynamic {
        /// `factor`.
        factor: f64,
    },
    /// `yarn`: frequencies blended between interpolated and extrapolated by a ramp over
    /// the pairs, and cos and sin scaled by the attention factor.
    Yarn {
        /// `factor`.
        factor: f64,
        /// `original_max_position_embeddings`.
        original_max_position_embeddings: usize,
        /// `attention_factor` (default from `factor`, `mscale` and `mscale_all_dim`).
        attention_factor: f64,
        /// `beta_fast` (default 32).
        beta_fast: f64,
        /// `beta_slow` (default 1).
        beta_slow: f64,
        /// `truncate` (default true): the ramp's ends rounded to whole pairs.
        truncate: bool,
    },
    /// `llama3`: long wavelengths divided by `factor`, short ones kept, the band between
    /// smoothed.
    Llama3 {
        /// `factor`.
        factor: f64,
        /// `low_freq_factor`.
        low_freq_factor: f64,
        /// `high_freq_factor`.
        high_freq_factor: f64,
        /// `original_max_position_embeddings`.
        original_max_position_embeddings: usize,
    },
}

/// Reads the rope of `f`: `rope_theta`, `partial_rotary_factor`, `rope_scaling` and
/// `rope_parameters` (the two must agree where both are set), with `max_positions` the
/// model's `max_position_embeddings` (the default original length).
pub(crate) fn rope(f: &mut Fields, max_positions: usize) -> Result<Rope, ConfigError> {
    let top_theta = f.float("rope_theta")?;
    let partial = f.float("partial_rotary_factor")?;
    let top_original = f.usize("original_max_position_embeddings")?;
    let map = rope_map(f)?;
    let mut d = RopeDict { f, p: map };
    let theta = match (top_theta, d.number("rope_theta")?) {
        (Some(a), Some(b)) if a != b => {
            return Err(f.error(format!(
                "'rope_theta' ({a}) and 'rope_parameters.rope_theta' ({b}) differ"
            )))
        }
        (Some(t), _) | (None, Some(t)) => t,
        (None, None) => 10_000.0,
    };
    match partial.or(d.number("partial_rotary_factor")?) {
        Some(r) if r != 1.0 => {
            return Err(f.error(format!(
                "field 'partial_rotary_factor' is {r}; wick rotates whole heads only (1.0)"
            )))
        }
        _ => {}
    }
    let kind =
        d.p.remove("rope_type")
            .or_else(|| d.p.remove("type"))
            .unwrap_or("default".into());
    d.p.remove("type");
    let kind = kind
        .as_str()
        .ok_or_else(|| f.error(format!("field 'rope_parameters.rope_type' is {kind}")))?
        .to_string();
    // The original length: the top-level field, else the dictionary's, else the model's.
    let original_of = |d: &mut RopeDict| {
        top_original
            .or_else(|| {
                d.p.remove("original_max_position_embeddings")?
                    .as_u64()
                    .map(|n| n as usize)
            })
            .unwrap_or(max_positions)
    };
    let scaling = match kind.as_str() {
        "default" => RopeScaling::Default,
        "linear" => RopeScaling::Linear {
            factor: d.factor(&kind)?,
        },
        "dynamic" => RopeScaling::Dynamic {
            factor: d.factor(&kind)?,
        },
        "llama3" => {
            let factor = d.factor(&kind)?;
            let original = original_of(&mut d);
            llama3(&mut d, factor, original)?
        }
        "yarn" => {
            let factor = d.factor(&kind)?;
            let original = original_of(&mut d);
            yarn(&mut d, factor, original)?
        }
        other => {
            return Err(f.error(format!(
                "rope type '{other}' is not built by wick (default, linear, dynamic, yarn, llama3)"
            )))
        }
    };
    for key in d.p.keys() {
        log::warn!(
            "{}: field 'rope_parameters.{key}' is not read for rope type '{kind}' and is \
             ignored",
            f.path.display()
        );
    }
    Ok(Rope { theta, scaling })
}

/// The rope dictionary of `f`: `rope_parameters` or `rope_scaling`, whichever is set (an
/// error when both are and their type or factor differ), or an empty one.
fn rope_map(f: &mut Fields) -> Result<Map<String, Value>, ConfigError> {
    let mut object = |key: &str| match f.take(key) {
        None => Ok(None),
        Some(Value::Object(m)) => Ok(Some(m)),
        Some(v) => Err(f.error(format!("field '{key}' must be an object, got {v}"))),
    };
    let (scaling, parameters) = (object("rope_scaling")?, object("rope_parameters")?);
    match (scaling, parameters) {
        (Some(a), Some(b)) => {
            // transformers 5 writes both from one dict; a disagreement is a mistake.
            let type_of = |m: &Map<String, Value>| {
                m.get("rope_type")
                    .or_else(|| m.get("type"))
                    .cloned()
                    .unwrap_or("default".into())
            };
            if type_of(&a) != type_of(&b) || a.get("factor") != b.get("factor") {
                return Err(f.error(format!(
                    "fields 'rope_scaling' ({}) and 'rope_parameters' ({}) differ",
                    Value::Object(a),
                    Value::Object(b)
                )));
            }
            Ok(b)
        }
        (Some(m), None) | (None, Some(m)) => Ok(m),
        (None, None) => Ok(Map::new()),
    }
}

/// What is left to read of a rope dictionary, and the fields its errors name.
struct RopeDict<'a> {
    f: &'a Fields,
    p: Map<String, Value>,
}

impl RopeDict<'_> {
    /// The number at `key`, taken out (`None` when absent or null).
    fn number(&mut self, key: &str) -> Result<Option<f64>, ConfigError> {
        match self.p.remove(key) {
            None | Some(Value::Null) => Ok(None),
            Some(v) => v.as_f64().map(Some).ok_or_else(|| {
                self.f.error(format!(
                    "field 'rope_parameters.{key}' must be a number, got {v}"
                ))
            }),
        }
    }

    /// The number at `key`, which rope type `kind` needs.
    fn needed(&mut self, kind: &str, key: &str) -> Result<f64, ConfigError> {
        self.number(key)?
            .ok_or_else(|| self.f.error(format!("rope type '{kind}' needs '{key}'")))
    }

    /// The `factor` of rope type `kind`: at least 1.
    fn factor(&mut self, kind: &str) -> Result<f64, ConfigError> {
        match self.number("factor")? {
            Some(x) if x >= 1.0 => Ok(x),
            other => Err(self.f.error(format!(
                "rope type '{kind}' needs 'factor' of at least 1, got {other:?}"
            ))),
        }
    }
}

/// Llama 3's scaling of `factor` over `original` positions, from `d`'s frequency factors.
fn llama3(d: &mut RopeDict, factor: f64, original: usize) -> Result<RopeScaling, ConfigError> {
    let (low_freq_factor, high_freq_factor) = (
        d.needed("llama3", "low_freq_factor")?,
        d.needed("llama3", "high_freq_factor")?,
    );
    if high_freq_factor <= low_freq_factor {
        return Err(d.f.error(format!(
            "rope 'high_freq_factor' ({high_freq_factor}) must exceed \
             'low_freq_factor' ({low_freq_factor})"
        )));
    }
    Ok(RopeScaling::Llama3 {
        factor,
        low_freq_factor,
        high_freq_factor,
        original_max_position_embeddings: original,
    })
}

/// YaRN's scaling of `factor` over `original` positions, from `d`'s attention factor (or
/// `mscale` and `mscale_all_dim`), betas and `truncate`, with transformers' defaults.
fn yarn(d: &mut RopeDict, factor: f64, original: usize) -> Result<RopeScaling, ConfigError> {
    let (mscale, mscale_all) = (d.number("mscale")?, d.number("mscale_all_dim")?);
    // The paper's attention factor, as transformers' `get_mscale`.
    let get_mscale = |scale: f64, m: f64| match scale <= 1.0 {
        true => 1.0,
        false => 0.1 * m * scale.ln() + 1.0,
    };
    let attention_factor = match (d.number("attention_factor")?, mscale, mscale_all) {
        (Some(a), _, _) => a,
        (None, Some(m), Some(a)) if m != 0.0 && a != 0.0 => {
            get_mscale(factor, m) / get_mscale(factor, a)
        }
        _ => get_mscale(factor, 1.0),
    };
    let beta_fast = d.number("beta_fast")?.filter(|&b| b != 0.0).unwrap_or(32.0);
    let beta_slow = d.number("beta_slow")?.filter(|&b| b != 0.0).unwrap_or(1.0);
    let truncate = match d.p.remove("truncate") {
        None | Some(Value::Null) => true,
        Some(Value::Bool(b)) => b,
        Some(v) => {
            return Err(d
                .f
                .error(format!("rope 'truncate' must be true or false, got {v}")))
        }
    };
    Ok(RopeScaling::Yarn {
        factor,
        original_max_position_embeddings: original,
        attention_factor,
        beta_fast,
        beta_slow,
        truncate,
    })
}
