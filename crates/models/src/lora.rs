//! LoRA as PEFT builds it: beside a frozen linear layer W, a trainable low-rank update,
//! y = W x + (alpha / r) · B A dropout(x), with A `[r, in]` drawn as PEFT draws it
//! (Kaiming-uniform with a = √5, that is U(-1/√in, 1/√in)) and B `[out, r]` zeros, so that
//! training starts from the base model exactly. The adapters are named as PEFT names them
//! (`model.layers.0.self_attn.q_proj.lora_A.weight`); PEFT's files add the prefix
//! [`PEFT_PREFIX`].

use crate::{ModelConfig, ModelError};
use candle_core::{Module, Result, Shape, Tensor};
use candle_nn::{Init, VarBuilder};
use std::ops::Range;
use std::path::Path;
use std::sync::Arc;
use wick_core::{splitmix64, BlockFormat, BlockRead, PretrainedWeights, WeightSource};
use wick_nn::{lora_linear, FrozenLinear, LayerWeight, Linear, LoraParts};

/// The adapter directory's config, as PEFT writes and reads it.
pub const ADAPTER_CONFIG_FILE: &str = "adapter_config.json";
/// The adapter directory's weights, as PEFT writes and reads them.
pub const ADAPTER_WEIGHTS_FILE: &str = "adapter_model.safetensors";
/// What PEFT puts before a model's parameter names in its adapter files.
pub const PEFT_PREFIX: &str = "base_model.model.";

/// The linear layers of a decoder block LoRA can adapt, in a block's order.
pub const DECODER_TARGETS: [&str; 7] = [
    "q_proj",
    "k_proj",
    "v_proj",
    "o_proj",
    "gate_proj",
    "up_proj",
    "down_proj",
];

/// LoRA's options: PEFT's `LoraConfig` fields `r`, `lora_alpha`, `lora_dropout` and
/// `target_modules`, with PEFT's defaults (rank 8, alpha 8, no dropout, `q_proj` and
/// `v_proj`).
#[derive(Debug, Clone, PartialEq)]
pub struct LoraConfig {
    /// The rank r of each update.
    pub rank: usize,
    /// alpha: the update is scaled by alpha / r.
    pub alpha: f64,
    /// The probability that dropout zeroes an element of an adapter's input in training.
    pub dropout: f64,
    /// The adapted layers, by their last name (`q_proj`, `down_proj`, ...).
    pub targets: Vec<String>,
}

impl Default for LoraConfig {
    fn default() -> Self {
        LoraConfig::new(8)
    }
}

impl LoraConfig {
    /// PEFT's defaults at rank `rank` (alpha 8, no dropout, `q_proj` and `v_proj`).
    pub fn new(rank: usize) -> Self {
        LoraConfig {
            rank,
            alpha: 8.0,
            dropout: 0.0,
            targets: vec!["q_proj".into(), "v_proj".into()],
        }
    }

    /// The scale of the update, alpha / r.
    pub fn scale(&self) -> f64 {
        self.alpha / self.rank as f64
    }

    /// Whether the layer called `module` (its last name) is adapted.
    pub fn adapts(&self, module: &str) -> bool {
        self.targets.iter().any(|t| t == module)
    }

    /// Refuses a rank of 0, a dropout outside [0, 1), and targets a decoder block does not
    /// have, naming the option.
    pub fn check(&self) -> std::result::Result<(), String> {
        if self.rank == 0 {
            return Err("--lora-rank must be at least 1".into());
        }
        if !(0.0..1.0).contains(&self.dropout) {
            return Err(format!(
                "--lora-dropout {} is not a probability in [0, 1)",
                self.dropout
            ));
        }
        if !(self.alpha.is_finite() && self.alpha > 0.0) {
            return Err(format!("--lora-alpha {} must be positive", self.alpha));
        }
        if self.targets.is_empty() {
            return Err("--lora-targets names no layer".into());
        }
        if let Some(t) = self
            .targets
            .iter()
            .find(|t| !DECODER_TARGETS.contains(&t.as_str()))
        {
            return Err(format!(
                "--lora-targets names '{t}', not a linear layer of a decoder block (one of {})",
                DECODER_TARGETS.join(", ")
            ));
        }
        Ok(())
    }

    /// The adapters these options add to the model of `config`, by name and shape, in the
    /// order the model creates them: for each adapted `[out, in]` weight, A `[r, in]` and
    /// B `[out, r]`.
    pub fn adapter_shapes(&self, config: &ModelConfig) -> Vec<(String, Vec<usize>)> {
        fn adapted<'a>(lora: &LoraConfig, name: &'a str) -> Option<&'a str> {
            let layer = name.strip_suffix(".weight")?;
            let module = layer.rsplit('.').next()?;
            (name.starts_with("model.layers.") && lora.adapts(module)).then_some(layer)
        }
        let mut out = Vec::new();
        if let ModelConfig::Decoder(_) = config {
            for (name, shape) in config.parameter_shapes() {
                if let (Some(layer), [out_dim, in_dim]) = (adapted(self, &name), shape.as_slice()) {
                    out.push((format!("{layer}.lora_A.weight"), vec![self.rank, *in_dim]));
                    out.push((format!("{layer}.lora_B.weight"), vec![*out_dim, self.rank]));
                }
            }
        }
        out
    }

    /// Whether the parameter `name` is a LoRA adapter's.
    pub fn is_adapter(name: &str) -> bool {
        name.contains(".lora_A.") || name.contains(".lora_B.")
    }

    /// PEFT's `adapter_config.json` for these options over the base model at `base`.
    pub fn to_peft_json(&self, base: &str) -> String {
        let json = serde_json::json!({
            "peft_type": "LORA",
            "task_type": "CAUSAL_LM",
            "base_model_name_or_path": base,
            "r": self.rank,
            "lora_alpha": self.alpha,
            "lora_dropout": self.dropout,
            "target_modules": self.targets,
            "bias": "none",
            "fan_in_fan_out": false,
            "use_rslora": false,
            "use_dora": false,
            "init_lora_weights": true,
            "inference_mode": true,
            "modules_to_save": null,
        });
        serde_json::to_string_pretty(&json).expect("a JSON value prints")
    }

    /// The options of PEFT's `adapter_config.json` text (`path` names it in errors), and
    /// its `base_model_name_or_path`. What wick does not build (another `peft_type`, a
    /// bias, rsLoRA, DoRA, per-layer ranks, extra trained modules) is refused by name.
    pub fn from_peft_json(
        text: &str,
        path: &Path,
    ) -> std::result::Result<(Self, Option<String>), ModelError> {
        let bad = |message: String| ModelError::Missing {
            path: path.to_path_buf(),
            message,
        };
        let json: serde_json::Value =
            serde_json::from_str(text).map_err(|e| bad(format!("not JSON: {e}")))?;
        let field = |key: &str| json.get(key).filter(|v| !v.is_null());
        if let Some(kind) = field("peft_type").and_then(|v| v.as_str()) {
            if kind != "LORA" {
                return Err(bad(format!("peft_type {kind}: wick builds LORA only")));
            }
        }
        if let Some(bias) = field("bias").filter(|v| v.as_str() != Some("none")) {
            return Err(bad(format!(
                "bias = {bias} is not built by wick (only \"none\")"
            )));
        }
        // Fields that change the update when set: refused by name, not ignored.
        const UNBUILT: [&str; 15] = [
            "use_rslora",
            "use_dora",
            "use_qalora",
            "use_bdlora",
            "fan_in_fan_out",
            "lora_bias",
            "rank_pattern",
            "alpha_pattern",
            "modules_to_save",
            "layers_to_transform",
            "layers_pattern",
            "exclude_modules",
            "target_parameters",
            "trainable_token_indices",
            "layer_replication",
        ];
        let set = |v: &serde_json::Value| match v {
            serde_json::Value::Bool(b) => *b,
            serde_json::Value::Object(o) => !o.is_empty(),
            serde_json::Value::Array(a) => !a.is_empty(),
            _ => true,
        };
        for key in UNBUILT {
            if let Some(v) = field(key).filter(|v| set(v)) {
                return Err(bad(format!("{key} = {v} is not built by wick")));
            }
        }
        let rank = field("r")
            .and_then(|v| v.as_u64())
            .ok_or_else(|| bad("has no integer 'r'".into()))? as usize;
        let alpha = field("lora_alpha").and_then(|v| v.as_f64()).unwrap_or(8.0);
        let dropout = field("lora_dropout")
            .and_then(|v| v.as_f64())
            .unwrap_or(0.0);
        let targets = match field("target_modules") {
            Some(serde_json::Value::Array(a)) => a
                .iter()
                .map(|t| t.as_str().map(str::to_string))
                .collect::<Option<Vec<_>>>()
                .ok_or_else(|| bad("target_modules holds a non-string".into()))?,
            Some(serde_json::Value::String(one)) => vec![one.clone()],
            _ => LoraConfig::default().targets,
        };
        let config = LoraConfig {
            rank,
            alpha,
            dropout,
            targets,
        };
        config.check().map_err(|m| bad(m.replace("--lora-", "")))?;
        let base = field("base_model_name_or_path")
            .and_then(|v| v.as_str())
            .map(str::to_string);
        Ok((config, base))
    }
}

/// Which dropout mask a forward draws: a step's micro-batch on a rank. The same key gives
/// the same masks, so a unit run again in backward (activation checkpointing, full
/// sharding) sees the mask its forward saw, and a resumed run the masks of the run it
/// continues.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct DropoutKey {
    pub(crate) rank: usize,
    pub(crate) batch: usize,
}

/// Whether a forward runs LoRA's adapters: on, their inputs dropped out with the masks
/// the key draws (training) or not at all (`None`); or off, the base model alone (the
/// reference of preference tuning, PEFT's `disable_adapter()`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Adapters {
    On(Option<DropoutKey>),
    Off,
}

/// One adapted layer's update.
#[derive(Clone, Debug)]
struct Adapter {
    a: Tensor,
    b: Tensor,
    scale: f64,
    dropout: f64,
    /// Tells the masks of this layer from every other's.
    salt: u64,
}

/// A linear layer, with LoRA's update beside it when it is adapted.
#[derive(Clone, Debug)]
pub(crate) struct Projection {
    base: BaseLayer,
    adapter: Option<Adapter>,
}

/// The layer LoRA adapts: dense (trained, or frozen under LoRA), or frozen with a weight
/// born quantized (QLoRA), decoded inside each op.
#[derive(Clone, Debug)]
enum BaseLayer {
    Dense(Linear),
    Quantized(FrozenLinear),
}

impl BaseLayer {
    /// `base` as the strategy handed it out: its weight a u8 tensor of `quantized` blocks
    /// when it was born quantized.
    fn new(
        base: Linear,
        (in_dim, out_dim): (usize, usize),
        quantized: Option<BlockFormat>,
    ) -> Result<Self> {
        let weight = LayerWeight::from_param(base.weight().clone(), (out_dim, in_dim), quantized)?;
        Ok(match weight {
            LayerWeight::Dense(_) => BaseLayer::Dense(base),
            quantized => BaseLayer::Quantized(FrozenLinear::new(quantized, base.bias().cloned())),
        })
    }

    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        match self {
            BaseLayer::Dense(l) => l.forward(x),
            BaseLayer::Quantized(l) => l.forward(x),
        }
    }

    /// The frozen weight and bias LoRA's update is added to.
    fn frozen_parts(&self) -> (LayerWeight, Option<&Tensor>) {
        match self {
            BaseLayer::Dense(l) => (LayerWeight::Dense(l.weight().clone()), l.bias()),
            BaseLayer::Quantized(l) => (l.weight().clone(), l.bias()),
        }
    }
}

impl Projection {
    /// The layer `base` at `vb`, adapted by `lora` if it names the layer (`module`; `salt`
    /// is the layer's place in the model), its weight in `quantized` blocks where the
    /// strategy handed out a base born quantized.
    pub(crate) fn new(
        base: Linear,
        vb: &VarBuilder,
        (module, dims): (&str, (usize, usize)),
        (lora, quantized): (Option<&LoraConfig>, Option<BlockFormat>),
        salt: u64,
    ) -> Result<Self> {
        let base = BaseLayer::new(base, dims, quantized)?;
        let Some(lora) = lora.filter(|l| l.adapts(module)) else {
            return Ok(Projection {
                base,
                adapter: None,
            });
        };
        let (in_dim, out_dim) = dims;
        let bound = 1.0 / (in_dim as f64).sqrt();
        let a = vb.pp("lora_A").get_with_hints(
            (lora.rank, in_dim),
            "weight",
            Init::Uniform {
                lo: -bound,
                up: bound,
            },
        )?;
        let b = vb
            .pp("lora_B")
            .get_with_hints((out_dim, lora.rank), "weight", Init::Const(0.0))?;
        Ok(Projection {
            base,
            adapter: Some(Adapter {
                a,
                b,
                scale: lora.scale(),
                dropout: lora.dropout,
                salt,
            }),
        })
    }

    /// W x + b, plus the update when adapted and `adapters` are on (its input dropped out
    /// as their key draws).
    pub(crate) fn forward(&self, x: &Tensor, adapters: Adapters) -> Result<Tensor> {
        let (Some(adapter), Adapters::On(dropout)) = (&self.adapter, adapters) else {
            return self.base.forward(x);
        };
        let mask = match dropout {
            Some(key) if adapter.dropout > 0.0 => Some(dropout_mask(x, adapter, key)?),
            _ => None,
        };
        let (weight, bias) = self.base.frozen_parts();
        let parts = LoraParts {
            weight: &weight,
            bias,
            a: &adapter.a,
            b: &adapter.b,
            scale: adapter.scale,
            mask: mask.as_ref(),
        };
        lora_linear(x, parts)
    }
}

/// Dropout's factors for `x`: 0 with probability p, 1 / (1 - p) otherwise, a pure function
/// of (layer, rank, micro-batch, element).
fn dropout_mask(x: &Tensor, adapter: &Adapter, key: DropoutKey) -> Result<Tensor> {
    let p = adapter.dropout;
    let keep = (1.0 / (1.0 - p)) as f32;
    let stream =
        splitmix64(splitmix64(splitmix64(adapter.salt) ^ key.rank as u64) ^ key.batch as u64);
    let mask: Vec<f32> = (0..x.elem_count() as u64)
        .map(|i| {
            // 24 random bits: a uniform f32 in [0, 1).
            let u = (splitmix64(stream ^ i) >> 40) as f64 / (1u64 << 24) as f64;
            if u < p {
                0.0
            } else {
                keep
            }
        })
        .collect();
    Tensor::from_vec(mask, x.shape(), x.device())?.to_dtype(x.dtype())
}

/// Weights whose adapter names are read from `adapters` and the rest from `base`: a base
/// model with the adapters of a PEFT directory or of a checkpoint.
pub(crate) struct WithAdapters {
    pub(crate) base: Arc<dyn WeightSource>,
    pub(crate) adapters: Arc<dyn WeightSource>,
}

impl WithAdapters {
    fn source_of(&self, name: &str) -> &dyn WeightSource {
        match LoraConfig::is_adapter(name) {
            true => self.adapters.as_ref(),
            false => self.base.as_ref(),
        }
    }
}

impl WeightSource for WithAdapters {
    fn read(&self, name: &str, shape: &Shape, range: Range<usize>) -> Result<Vec<f32>> {
        self.source_of(name).read(name, shape, range)
    }

    fn block_format(&self, name: &str) -> Option<BlockFormat> {
        self.source_of(name).block_format(name)
    }

    fn read_blocks(&self, read: &BlockRead<'_>) -> Result<Option<Vec<u8>>> {
        self.source_of(read.name).read_blocks(read)
    }
}

/// Weights stored under PEFT's names: `name` is read as [`PEFT_PREFIX`]`name`.
pub(crate) struct PeftNames(pub(crate) PretrainedWeights);

impl WeightSource for PeftNames {
    fn read(&self, name: &str, shape: &Shape, range: Range<usize>) -> Result<Vec<f32>> {
        self.0.read(&format!("{PEFT_PREFIX}{name}"), shape, range)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn peft_config_round_trips_and_refuses_what_is_not_built() {
        let lora = LoraConfig {
            rank: 4,
            alpha: 16.0,
            dropout: 0.05,
            targets: vec!["q_proj".into(), "down_proj".into()],
        };
        let path = Path::new("adapter_config.json");
        let (back, base) = LoraConfig::from_peft_json(&lora.to_peft_json("/m"), path).unwrap();
        assert_eq!((back, base.as_deref()), (lora, Some("/m")));
        let dora = r#"{"peft_type": "LORA", "r": 4, "use_dora": true}"#;
        let err = LoraConfig::from_peft_json(dora, path)
            .unwrap_err()
            .to_string();
        assert!(err.contains("use_dora"), "{err}");
        let bad = LoraConfig {
            targets: vec!["c_attn".into()],
            ..LoraConfig::default()
        };
        assert!(bad.check().unwrap_err().contains("c_attn"));
    }

    #[test]
    fn dropout_masks_depend_on_the_key_only() {
        let adapter = Adapter {
            a: Tensor::zeros((1, 1), candle_core::DType::F32, &candle_core::Device::Cpu).unwrap(),
            b: Tensor::zeros((1, 1), candle_core::DType::F32, &candle_core::Device::Cpu).unwrap(),
            scale: 1.0,
            dropout: 0.25,
            salt: 3,
        };
        let x = Tensor::ones(4096, candle_core::DType::F32, &candle_core::Device::Cpu).unwrap();
        let key = DropoutKey { rank: 1, batch: 7 };
        // x is ones: x ⊙ mask is the mask.
        let draw = |key| {
            dropout_mask(&x, &adapter, key)
                .unwrap()
                .to_vec1::<f32>()
                .unwrap()
        };
        let (a, b) = (draw(key), draw(key));
        assert_eq!(a, b);
        let zeroed = a.iter().filter(|&&v| v == 0.0).count() as f64 / a.len() as f64;
        assert!((zeroed - 0.25).abs() < 0.03, "{zeroed}");
        assert!(a.iter().all(|&v| v == 0.0 || (v - 4.0 / 3.0).abs() < 1e-6));
        assert_ne!(a, draw(DropoutKey { rank: 0, batch: 7 }));
    }
}
