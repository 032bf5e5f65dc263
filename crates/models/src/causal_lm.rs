//! `CausalLm`: a model of one of the families, as a `TrainModule` over batches of token ids,
//! from a Hugging Face directory (config, weights, tokenizer) or from a config alone.

use crate::config::ModelConfig;
use crate::decoder::Decoder;
use crate::error::read_text;
use crate::gpt2::Gpt2;
use crate::kv_cache::KvCache;
use crate::lora::{
    Adapters, DropoutKey, LoraConfig, PeftNames, WithAdapters, ADAPTER_CONFIG_FILE,
    ADAPTER_WEIGHTS_FILE,
};
use crate::quantized_base::QuantizedBase;
use crate::scoring::Scoring;
use crate::weight_files::weight_files;
use crate::{ModelError, TextTokenizer};
use candle_core::{DType, Result, Tensor, D};
use std::path::Path;
use std::sync::Arc;
use wick_core::{
    OptimizerConfig, PretrainedWeights, ShardedContext, TokenBatch, TrainModule, WeightSource,
};
use wick_nn::Positions;

/// The built model of one family.
#[derive(Clone)]
enum Net {
    Decoder(Decoder),
    Gpt2(Gpt2),
}

/// A causal language model: logits for every position, the mean next-token cross-entropy
/// over every counted position as its loss. `Batch` is a [`TokenBatch`]: input ids and
/// target ids, both `[batch, seq]` u32, the targets being the inputs shifted by one; a
/// target of [`wick_nn::IGNORE_INDEX`] (a prompt's token in instruction data, padding) is
/// not counted. A packed batch's positions keep each document to itself: attention stops
/// at its boundaries and positions restart at each.
///
/// Its parameters keep Hugging Face's names (`model.layers.0.self_attn.q_proj.weight`,
/// `transformer.h.0.attn.c_attn.weight`), so a consolidated checkpoint of it is a Hugging
/// Face state dict. Each decoder block is one `ctx.wrap` unit.
#[derive(Clone)]
pub struct CausalLm {
    config: ModelConfig,
    config_json: Arc<String>,
    tokenizer: Option<TextTokenizer>,
    weights: Option<Arc<dyn WeightSource>>,
    /// LoRA: the base weights frozen, only the adapters trained.
    lora: Option<LoraConfig>,
    /// The adapters' starting values (a PEFT directory's, a checkpoint's); drawn otherwise.
    adapters: Option<Arc<dyn WeightSource>>,
    /// QLoRA: the frozen base's linear weights born quantized.
    quantized_base: Option<QuantizedBase>,
    /// QLoRA: the token embedding and output head born quantized too.
    quantized_embeddings: bool,
    optimizer: OptimizerConfig,
    /// This rank's index (dropout masks differ between ranks).
    rank: usize,
    net: Option<Net>,
}

impl CausalLm {
    /// A model of the shape `config.json` at `path` describes, whose parameters wick creates
    /// (born sharded, from the counter-based init, with Hugging Face's standard deviations).
    pub fn from_config(path: impl AsRef<Path>) -> std::result::Result<Self, ModelError> {
        let path = path.as_ref();
        let text = read_text(path)?;
        Self::from_config_json(text, path)
    }

    /// [`CausalLm::from_config`] from the JSON text (`path` names it in errors).
    pub fn from_config_json(text: String, path: &Path) -> std::result::Result<Self, ModelError> {
        let config = ModelConfig::from_json(&text, path)?;
        Ok(CausalLm {
            config,
            config_json: Arc::new(text),
            tokenizer: None,
            weights: None,
            lora: None,
            quantized_base: None,
            quantized_embeddings: false,
            adapters: None,
            optimizer: OptimizerConfig::adamw(1e-3),
            rank: 0,
            net: None,
        })
    }

    /// The model of a Hugging Face directory: `config.json`, the weights (`model.safetensors`
    /// or the shards of `model.safetensors.index.json`; f32, bf16 or f16, read as f32) and
    /// `tokenizer.json` if there is one. The weights are read when the parameters are made:
    /// under zero3 and fsdp each rank reads only its slices. A GGUF file in place of the
    /// directory is read by [`CausalLm::from_gguf`].
    pub fn from_pretrained(dir: impl AsRef<Path>) -> std::result::Result<Self, ModelError> {
        let dir = dir.as_ref();
        if dir.is_file() && crate::is_gguf(dir) {
            return Self::from_gguf(dir);
        }
        if !dir.is_dir() {
            return Err(ModelError::Missing {
                path: dir.to_path_buf(),
                message: "not a directory (a Hugging Face model directory holds config.json \
                          and model.safetensors) nor a GGUF file"
                    .into(),
            });
        }
        let model = Self::from_config(dir.join("config.json"))?;
        let weights = PretrainedWeights::open(&weight_files(dir)?)?;
        let tokenizer = dir.join("tokenizer.json");
        let tokenizer = match tokenizer.is_file() {
            true => Some(TextTokenizer::from_file(tokenizer)?),
            false => None,
        };
        Ok(model
            .with_weights(Arc::new(weights))
            .with_tokenizer(tokenizer))
    }

    /// The model of a llama.cpp GGUF file: the config from its metadata, its tokenizer
    /// (where it has one), the weights dequantized to f32 as the parameters are made
    /// ([`crate::GgufModel`]).
    pub fn from_gguf(path: impl AsRef<Path>) -> std::result::Result<Self, ModelError> {
        let path = path.as_ref();
        let gguf = crate::GgufModel::open(path)?;
        let tokenizer = gguf
            .tokenizer
            .map(|t| TextTokenizer::from_json(t.tokenizer, path))
            .transpose()?;
        Ok(Self::from_config_json(gguf.config, path)?
            .with_tokenizer(tokenizer)
            .with_weights(Arc::new(gguf.weights)))
    }

    /// Parameters take their values from `weights` (a Hugging Face state dict, or a wick
    /// checkpoint's `into_weights`) instead of the init.
    pub fn with_weights(mut self, weights: Arc<dyn WeightSource>) -> Self {
        self.weights = Some(weights);
        self
    }

    /// Fine-tunes with LoRA: every parameter the model had is frozen (no gradient, no
    /// optimizer state, under every strategy) and `lora`'s adapters are added beside the
    /// layers it targets, the only parameters trained. Refused for GPT-2, whose layers are
    /// not built for it, and for options [`LoraConfig::check`] refuses.
    pub fn with_lora(mut self, lora: LoraConfig) -> std::result::Result<Self, ModelError> {
        lora.check().map_err(ModelError::Lora)?;
        if let ModelConfig::Gpt2(_) = self.config {
            return Err(ModelError::Lora(
                "LoRA is built for the decoder families (Llama, Mistral, Qwen, Gemma 2), not GPT-2"
                    .into(),
            ));
        }
        self.lora = Some(lora);
        Ok(self)
    }

    /// LoRA with the adapters of a PEFT directory (`adapter_config.json` and
    /// `adapter_model.safetensors`, as `peft` saves them), to train further or to run.
    pub fn with_peft_adapter(self, dir: impl AsRef<Path>) -> std::result::Result<Self, ModelError> {
        let dir = dir.as_ref();
        let config_path = dir.join(ADAPTER_CONFIG_FILE);
        let text = read_text(&config_path)?;
        let (lora, _) = LoraConfig::from_peft_json(&text, &config_path)?;
        let weights = PretrainedWeights::open(&[dir.join(ADAPTER_WEIGHTS_FILE)])?;
        self.with_adapters(lora, Arc::new(PeftNames(weights)))
    }

    /// LoRA with adapters read from `adapters` under wick's names (a checkpoint's
    /// `into_weights`), the rest of the model from its own weights.
    pub fn with_adapters(
        self,
        lora: LoraConfig,
        adapters: Arc<dyn WeightSource>,
    ) -> std::result::Result<Self, ModelError> {
        let mut lm = self.with_lora(lora)?;
        lm.adapters = Some(adapters);
        Ok(lm)
    }

    /// QLoRA: under LoRA, the frozen base's linear weights ([`crate::is_base_linear_weight`])
    /// are born in `form` (a [`wick_core::BlockFormat`], or [`QuantizedBase::AsRead`]: a GGUF file's own
    /// blocks) and kept so by the strategy (never whole in f32), decoded inside each
    /// layer's op in forward and again in backward. Refused without LoRA (nothing would be
    /// frozen), and as read where the weights hold no base weight in blocks. The strategies
    /// that keep every parameter whole on each rank (single, ddp, zero1, zero2) keep it
    /// whole; zero3 and fsdp shard it by whole blocks.
    pub fn with_quantized_base(
        mut self,
        form: impl Into<QuantizedBase>,
    ) -> std::result::Result<Self, ModelError> {
        if self.lora.is_none() {
            return Err(ModelError::Lora(
                "a quantized base (QLoRA) trains LoRA adapters beside it: give LoRA's options first"
                    .into(),
            ));
        }
        let form = form.into();
        if form == QuantizedBase::AsRead {
            let format_of = form.format_of(self.weights.clone(), false);
            let shapes = self.config.parameter_shapes();
            if !shapes.iter().any(|(name, _)| format_of(name).is_some()) {
                return Err(ModelError::Lora(
                    "the base kept as read needs weights that hold its linear weights in \
                     blocks (a quantized GGUF file); quantize it with a block format instead"
                        .into(),
                ));
            }
        }
        self.quantized_base = Some(form);
        Ok(self)
    }

    /// The form of the frozen base, under QLoRA.
    pub fn quantized_base(&self) -> Option<QuantizedBase> {
        self.quantized_base
    }

    /// QLoRA over a base whose token embedding and output head
    /// ([`crate::is_embedding_weight`]) are held in its form too, not only its linear
    /// weights: a table is sharded by whole blocks like them, its rows decoded as tokens
    /// look them up, and as the output head (tied or not) a slice of its rows at a time
    /// ([`wick_nn::head_score`]), never whole in training. Of most use where the
    /// vocabulary is large beside the width (Llama 3's 128256 rows are a fifth of a 1B
    /// model). Refused without a quantized base, and for a family other than the decoders.
    pub fn with_quantized_embeddings(mut self) -> std::result::Result<Self, ModelError> {
        if self.quantized_base.is_none() {
            return Err(ModelError::Lora(
                "quantized embeddings belong to a quantized base (QLoRA): give its form first"
                    .into(),
            ));
        }
        if !matches!(self.config, ModelConfig::Decoder(_)) {
            return Err(ModelError::Lora(
                "quantized embeddings are for the decoder families (Llama, Qwen, Gemma, ...)"
                    .into(),
            ));
        }
        self.quantized_embeddings = true;
        Ok(self)
    }

    /// Whether the embeddings are held in the base's form too (under QLoRA).
    pub fn quantized_embeddings(&self) -> bool {
        self.quantized_embeddings
    }

    /// The weights its parameters are read from, if any (a pretrained model's).
    pub fn weights(&self) -> Option<&Arc<dyn WeightSource>> {
        self.weights.as_ref()
    }

    /// The LoRA options, when the model is fine-tuned with LoRA.
    pub fn lora(&self) -> Option<&LoraConfig> {
        self.lora.as_ref()
    }

    /// The tokenizer that goes with the model (recorded in checkpoints, used to sample).
    pub fn with_tokenizer(mut self, tokenizer: Option<TextTokenizer>) -> Self {
        self.tokenizer = tokenizer;
        self
    }

    /// What `configure_optimizers` returns (default AdamW at 1e-3).
    pub fn with_optimizer(mut self, optimizer: OptimizerConfig) -> Self {
        self.optimizer = optimizer;
        self
    }

    /// The model's config.
    pub fn config(&self) -> &ModelConfig {
        &self.config
    }

    /// The `config.json` text it was made from (written back unchanged on export).
    pub fn config_json(&self) -> &str {
        &self.config_json
    }

    /// The tokenizer, if the model has one.
    pub fn tokenizer(&self) -> Option<&TextTokenizer> {
        self.tokenizer.as_ref()
    }

    /// The logits of every position of `ids` (`[batch, time]`, u32): `[batch, time, vocab]`,
    /// f32. Needs the parameters (`configure_sharded_model`).
    pub fn logits(&self, ids: &Tensor) -> Result<Tensor> {
        self.logits_in(ids, None)
    }

    /// An empty cache of keys and values for [`CausalLm::next_logits`]. Needs the
    /// parameters (`configure_sharded_model`).
    pub fn new_cache(&self) -> Result<KvCache> {
        Ok(match self.net()? {
            Net::Decoder(m) => m.new_cache(),
            Net::Gpt2(m) => m.new_cache(),
        })
    }

    /// The logits of the token after `ids` (`[batch, time]`, u32, the positions that follow
    /// those `cache` holds): `[batch, vocab]`, f32. The cache then holds `ids`' positions
    /// too, so that generation computes each new token's position only: the prompt once,
    /// then one token at a time. Inference only, on a model whose units are whole on this
    /// rank (the `single` strategy).
    pub fn next_logits(&self, ids: &Tensor, cache: &mut KvCache) -> Result<Tensor> {
        let t = cache.len() + ids.dim(1)?;
        if t > self.config.max_positions() || ids.dim(1)? == 0 {
            candle_core::bail!(
                "{} new tokens after {} cached: a model of {} positions takes 1 to {} more",
                ids.dim(1)?,
                cache.len(),
                self.config.max_positions(),
                self.config.max_positions().saturating_sub(cache.len())
            )
        }
        let logits = match self.net()? {
            Net::Decoder(m) => m.next_logits(ids, cache)?,
            Net::Gpt2(m) => m.next_logits(ids, cache)?,
        };
        logits.to_dtype(DType::F32)
    }

    /// The model's layers, once its parameters exist.
    fn net(&self) -> Result<&Net> {
        match &self.net {
            Some(net) => Ok(net),
            None => candle_core::bail!(
                "the model's parameters do not exist yet: run it through the trainer"
            ),
        }
    }

    /// The model's layers, checked to take a sequence as long as `ids`'.
    fn net_for(&self, ids: &Tensor) -> Result<&Net> {
        let (_, t) = ids.dims2()?;
        if t > self.config.max_positions() {
            candle_core::bail!(
                "a sequence of {t} tokens is longer than the model's {} positions",
                self.config.max_positions()
            )
        }
        self.net()
    }

    /// [`CausalLm::logits`], each document kept to itself where `documents` are given.
    fn logits_in(&self, ids: &Tensor, documents: Option<&Positions>) -> Result<Tensor> {
        let logits = match self.net_for(ids)? {
            Net::Decoder(m) => m.logits(ids, documents)?,
            Net::Gpt2(m) => m.logits(ids, documents)?,
        };
        logits.to_dtype(DType::F32)
    }

    /// A batch's documents, where it is packed.
    fn documents(batch: &TokenBatch) -> Result<Option<Positions>> {
        batch.positions.as_ref().map(Positions::new).transpose()
    }

    /// The mean cross-entropy of `targets` (`[batch, time]`, u32) under the logits of `ids`,
    /// over the targets that are not [`wick_nn::IGNORE_INDEX`] (`transformers`' -100 labels).
    /// The output projection and the loss are one op ([`wick_nn::linear_cross_entropy`]),
    /// so on the CPU the `[batch, time, vocab]` logits are never made whole (on CUDA its
    /// composite makes them).
    pub fn loss(&self, ids: &Tensor, targets: &Tensor) -> Result<Tensor> {
        self.batch_loss(&TokenBatch::new(ids.clone(), targets.clone()))
    }

    /// [`CausalLm::loss`] of a batch, each document of a packed one kept to itself.
    pub fn batch_loss(&self, batch: &TokenBatch) -> Result<Tensor> {
        self.score(batch, Adapters::On(None), Scoring::MeanLoss)
    }

    /// The log-probability of each row's counted targets, summed over the row: `[rows]`,
    /// f32 (what preference tuning compares). The output projection and the
    /// log-probabilities are one op ([`wick_nn::linear_log_probs`]).
    pub fn row_log_probs(&self, batch: &TokenBatch) -> Result<Tensor> {
        self.score(batch, Adapters::On(None), Scoring::RowLogProbs)
    }

    /// `scoring` of `batch` with LoRA's adapters as `adapters` says (off: the base
    /// model's).
    pub(crate) fn score(
        &self,
        batch: &TokenBatch,
        adapters: Adapters,
        scoring: Scoring,
    ) -> Result<Tensor> {
        let TokenBatch { ids, targets, .. } = batch;
        let documents = Self::documents(batch)?;
        let documents = documents.as_ref();
        match self.net_for(ids)? {
            Net::Decoder(m) => m.score((ids, targets), documents, adapters, scoring),
            Net::Gpt2(m) => m.score((ids, targets), documents, scoring),
        }
    }

    /// The adapters of training step `batch_idx`: on, their dropout masks drawn from this
    /// rank and `batch_idx`, so that a unit run again in backward and a resumed run draw
    /// the same.
    pub(crate) fn training_adapters(&self, batch_idx: usize) -> Adapters {
        Adapters::On(Some(DropoutKey {
            rank: self.rank,
            batch: batch_idx,
        }))
    }
}

impl TrainModule for CausalLm {
    type Batch = TokenBatch;

    fn configure_sharded_model(&mut self, ctx: &ShardedContext) -> Result<()> {
        let is_adapter = LoraConfig::is_adapter;
        match (&self.weights, &self.adapters) {
            (Some(base), Some(adapters)) => ctx.load_weights(Arc::new(WithAdapters {
                base: base.clone(),
                adapters: adapters.clone(),
            })),
            (Some(base), None) => {
                ctx.load_weights(base.clone());
                // New adapters on a pretrained model start from their init (B = 0).
                ctx.init_only(is_adapter);
            }
            (None, Some(adapters)) => {
                ctx.load_weights(adapters.clone());
                ctx.init_only(move |name| !is_adapter(name));
            }
            (None, None) => {}
        }
        if self.lora.is_some() {
            ctx.train_only(is_adapter);
        }
        let format_of = (self.quantized_base)
            .map(|form| form.format_of(self.weights.clone(), self.quantized_embeddings));
        if let Some(format_of) = format_of.clone() {
            ctx.quantize_frozen(move |name| format_of(name));
        }
        self.rank = ctx.rank();
        let lora = self.lora.as_ref();
        self.net = Some(match &self.config {
            ModelConfig::Decoder(c) => Net::Decoder(Decoder::new(ctx, c, lora, format_of)?),
            ModelConfig::Gpt2(c) => Net::Gpt2(Gpt2::new(ctx, c)?),
        });
        Ok(())
    }

    fn configure_optimizers(&self) -> OptimizerConfig {
        self.optimizer.clone()
    }

    /// [`ModelConfig::flops_per_token`], with the adapters under LoRA.
    fn flops_per_token(&self, seq: usize) -> Option<f64> {
        let adapters = self.lora.as_ref().map(|l| {
            let shapes = l.adapter_shapes(&self.config);
            shapes
                .iter()
                .map(|(_, s)| s.iter().product::<usize>())
                .sum()
        });
        Some(self.config.flops_per_token(seq, adapters))
    }

    /// The loss of the batch; LoRA's dropout masks are drawn from this rank and
    /// `batch_idx`, so that a unit run again in backward and a resumed run draw the same.
    fn training_step(&mut self, batch: &Self::Batch, batch_idx: usize) -> Result<Tensor> {
        let adapters = self.training_adapters(batch_idx);
        self.score(batch, adapters, Scoring::MeanLoss)
    }

    /// The targets that count: those not [`wick_nn::IGNORE_INDEX`] (a prompt's, in
    /// instruction data, and padding), so that a step's loss is the mean over every counted
    /// target of the global batch.
    fn loss_terms(&self, batch: &Self::Batch) -> Option<usize> {
        batch.counted().ok()
    }

    fn validation_step(&mut self, batch: &Self::Batch, _: usize) -> Result<Option<Tensor>> {
        self.batch_loss(batch).map(Some)
    }

    fn test_step(&mut self, batch: &Self::Batch, _: usize) -> Result<Option<Tensor>> {
        self.batch_loss(batch).map(Some)
    }

    /// The most likely next token at every position: `[batch, time]`, u32.
    fn predict_step(&mut self, batch: &Self::Batch, _: usize) -> Result<Tensor> {
        let documents = Self::documents(batch)?;
        self.logits_in(&batch.ids, documents.as_ref())?
            .argmax(D::Minus1)
    }
}
