//! One rank's part of a stage: the hook sequence of docs/design.md and the loops.

use crate::checkpoint::{DataPosition, SaveInfo};
use crate::metrics_csv::{MetricsCsv, Row};
use crate::progress::{train_message, Progress};
use crate::trainer::{Config, Metrics};
use crate::{Checkpoint, CheckpointError, DataLoader, Dataset, ModelCheckpoint, TrainerError};
use candle_core::{DType, Tensor};
use std::time::Instant;
use wick_accelerator::{Accelerator, RankEnv};
use wick_core::{
    Callback, GradSync, LrSchedule, OptimizerConfig, ReduceOp, RunState, Stage, Strategy,
    TrainModule,
};

/// What a stage runs over: its data, and for fit the checkpoint it resumes from, where it
/// saves, and the name of its log directory (recorded in its checkpoints).
pub(crate) struct StageInput<'a, D> {
    pub(crate) train: Option<&'a DataLoader<D>>,
    pub(crate) eval: Option<&'a DataLoader<D>>,
    pub(crate) resume: Option<&'a Checkpoint>,
    pub(crate) checkpoint: Option<&'a ModelCheckpoint>,
    pub(crate) run: Option<&'a str>,
}

impl<'a, D> StageInput<'a, D> {
    /// An evaluation or prediction pass over `data`.
    pub(crate) fn eval(data: &'a DataLoader<D>) -> Self {
        StageInput {
            train: None,
            eval: Some(data),
            resume: None,
            checkpoint: None,
            run: None,
        }
    }
}

/// What a rank brings back from a stage.
pub(crate) struct RankOutput {
    pub(crate) metrics: Metrics,
    pub(crate) predictions: Vec<Tensor>,
}

pub(crate) struct RankRun<'a, M> {
    pub(crate) env: RankEnv,
    /// Rank 0's bars on a terminal.
    pub(crate) progress: Option<Progress>,
    /// Rank 0's metrics file, during fit.
    pub(crate) csv: Option<MetricsCsv>,
    pub(crate) module: &'a mut M,
    pub(crate) strategy: &'a mut dyn Strategy,
    pub(crate) callbacks: Vec<Box<dyn Callback>>,
    pub(crate) config: &'a Config,
    pub(crate) state: RunState,
}

/// Which evaluation hook a pass calls and under which metric name it reports.
#[derive(Clone, Copy)]
enum Eval {
    Validation,
    Test,
}

impl<M: TrainModule> RankRun<'_, M> {
    fn callbacks(
        &mut self,
        mut hook: impl FnMut(&mut dyn Callback, &RunState) -> candle_core::Result<()>,
    ) -> Result<(), TrainerError> {
        for cb in self.callbacks.iter_mut() {
            hook(cb.as_mut(), &self.state)?;
            // What a callback logs is visible to the callbacks after it.
            let logged = self.state.take_logged();
            self.state.metrics.extend(logged);
        }
        Ok(())
    }

    /// Runs `stage` on this rank, in docs/design.md's order.
    pub(crate) fn run<D: Dataset<Batch = M::Batch>>(
        mut self,
        stage: Stage,
        loaders: &StageInput<'_, D>,
    ) -> Result<RankOutput, TrainerError> {
        self.strategy
            .connect(self.env.world.clone(), self.env.device.clone())?;
        self.callbacks(|cb, s| cb.setup(s, stage))?;
        self.module.setup(stage)?;
        if Accelerator::setup(self.strategy, self.module, self.config.seed)? {
            self.callbacks(|cb, s| cb.on_configure_sharded_model(s))?;
        }
        let mut predictions = Vec::new();
        match (stage, loaders.train, loaders.eval) {
            (Stage::Fit, Some(train), val) => self.fit(train, val, loaders)?,
            (Stage::Validate, _, Some(data)) => {
                self.evaluate(data, Eval::Validation)?;
            }
            (Stage::Test, _, Some(data)) => {
                self.evaluate(data, Eval::Test)?;
            }
            (Stage::Predict, _, Some(data)) => {
                predictions = self.predict(data)?;
            }
            _ => unreachable!("the trainer passes the loaders each stage needs"),
        }
        self.callbacks(|cb, s| cb.teardown(s, stage))?;
        self.module.teardown(stage)?;
        Ok(RankOutput {
            metrics: self.state.metrics,
            predictions,
        })
    }

    fn fit<D: Dataset<Batch = M::Batch>>(
        &mut self,
        train: &DataLoader<D>,
        val: Option<&DataLoader<D>>,
        input: &StageInput<'_, D>,
    ) -> Result<(), TrainerError> {
        let resume = input.resume;
        let mut optimizer = self.module.configure_optimizers();
        optimizer
            .schedule
            .validate()
            .map_err(|e| TrainerError::config("lr schedule", e))?;
        self.strategy.configure_optimizer(&optimizer)?;
        self.strategy
            .set_clip_grad_norm(self.config.gradient_clip_val);
        let (rank, world_size) = (self.env.rank, self.env.world_size);
        let accumulate = self.config.accumulate_grad_batches;
        // Optimizer steps per epoch; trailing micro-batches that cannot fill a step are skipped.
        let per_epoch = train.batches_per_epoch() / accumulate;
        let seed = match resume {
            Some(checkpoint) => self.restore(checkpoint, train, &mut optimizer)?,
            None => self.config.seed,
        };
        // The checkpoint resumed from already holds the state at its step.
        let mut last_saved = resume.map(|_| self.state.global_step);
        let (start_epoch, start_batch) = (
            self.state.global_step / per_epoch,
            self.state.global_step % per_epoch,
        );

        let max_epochs = match (self.config.max_epochs, self.config.max_steps) {
            (Some(e), _) => e,
            (None, Some(_)) => usize::MAX,
            (None, None) => 1,
        };
        let total_steps = self
            .config
            .max_steps
            .unwrap_or(usize::MAX)
            .min(per_epoch.saturating_mul(max_epochs));
        let mut csv = self.csv.take();
        let bar = self
            .progress
            .as_ref()
            .map(|p| p.train(total_steps, self.state.global_step));

        self.callbacks(|cb, s| cb.on_fit_start(s))?;
        self.module.on_fit_start()?;
        // The first backward of this fit looks for parameters that get no gradient.
        let mut checked_unused = false;
        let tokens_per_step =
            (train.batch_size() * accumulate * train.dataset().tokens_per_sample()) as f64;
        'epochs: for epoch in start_epoch..max_epochs {
            self.state.epoch = epoch;
            let epoch_start = Instant::now();
            let order = train.epoch_order(seed, epoch);
            let first = if epoch == start_epoch { start_batch } else { 0 };
            for b in first..per_epoch {
                if self.state.global_step >= total_steps {
                    break 'epochs;
                }
                let step_start = Instant::now();
                // `accumulate` micro-batches, each a whole global batch, make one step; each
                // loss is scaled so the step sees the mean over them.
                let mut local = 0f32;
                for micro in 0..accumulate {
                    let index = b * accumulate + micro;
                    let batch = train.dataset().batch(
                        train.rank_slice(&order, index, rank, world_size),
                        &self.env.device,
                    )?;
                    let looking = !checked_unused;
                    if looking {
                        self.strategy.find_unused_parameters();
                    }
                    let loss = self.module.training_step(&batch, index)?;
                    local += scalar(&loss, "training_step")? / accumulate as f32;
                    let loss = if accumulate > 1 {
                        loss.affine(1.0 / accumulate as f64, 0.0)?
                    } else {
                        loss
                    };
                    let sync = GradSync::for_micro_batch(micro, accumulate);
                    self.strategy.backward(&loss, sync)?;
                    if looking {
                        checked_unused = true;
                        self.report_unused_parameters()?;
                    }
                }
                let lr = optimizer.lr_at(self.state.global_step);
                self.state.lr = lr;
                self.strategy.optimizer_step(lr)?;
                let train_loss = self.env.world.all_reduce_scalar(local, ReduceOp::Mean)? as f64;
                self.state.global_step += 1;
                if self.state.global_step == 1 && rank == 0 && self.config.model_summary {
                    let summary = crate::summary::model_summary(&*self.strategy, world_size);
                    match &self.progress {
                        Some(p) => p.suspend(|| print!("{summary}")),
                        None => print!("{summary}"),
                    }
                }
                let tokens_per_s = tokens_per_step / step_start.elapsed().as_secs_f64().max(1e-9);
                self.state.metrics.insert("train_loss".into(), train_loss);
                // Metrics stay deterministic; wall-clock figures go to the CSV only.
                if let Some(scale) = self.strategy.loss_scale() {
                    self.state.metrics.insert("loss_scale".into(), scale.scale);
                }
                self.callbacks(|cb, s| cb.on_train_batch_end(s))?;

                let validate_now = val.is_some()
                    && match self.config.val_check_interval {
                        Some(n) => self.state.global_step % n == 0,
                        None => b + 1 == per_epoch,
                    };
                let val_loss = match val {
                    Some(val) if validate_now => self.evaluate(val, Eval::Validation)?,
                    _ => None,
                };
                if let Some(csv) = csv.as_mut() {
                    csv.row(&Row {
                        step: self.state.global_step,
                        epoch,
                        train_loss,
                        val_loss,
                        lr: self.state.lr,
                        tokens_per_s,
                        epoch_time_s: epoch_start.elapsed().as_secs_f64(),
                    })?;
                }
                if let Some(bar) = &bar {
                    bar.set_message(train_message(train_loss, tokens_per_s));
                    bar.set_position(self.state.global_step as u64);
                }
                if let Some(mc) = input.checkpoint {
                    if mc.due(self.state.global_step) {
                        self.save_checkpoint(mc, input.run, train, &optimizer, seed)?;
                        last_saved = Some(self.state.global_step);
                    }
                }
                if self.stop_requested()? {
                    break 'epochs;
                }
            }
        }
        if let Some(mc) = input.checkpoint {
            let step = self.state.global_step;
            if mc.saves_at_end() && last_saved != Some(step) {
                self.save_checkpoint(mc, input.run, train, &optimizer, seed)?;
            }
        }
        if let Some(bar) = &bar {
            bar.finish();
        }
        if let Some(csv) = csv.as_mut() {
            csv.flush()?;
        }
        self.callbacks(|cb, s| cb.on_fit_end(s))?;
        self.module.on_fit_end()?;
        Ok(())
    }

    /// Whether a callback on any rank asked to stop (with `RunState::request_stop`): the
    /// ranks decide together, so all stop after the same step. Without callbacks nothing
    /// can ask, and no collective is spent.
    fn stop_requested(&mut self) -> Result<bool, TrainerError> {
        if self.callbacks.is_empty() {
            return Ok(false);
        }
        let asked = f32::from(u8::from(self.state.take_stop_request()));
        Ok(self.env.world.all_reduce_scalar(asked, ReduceOp::Sum)? > 0.0)
    }

    /// Restores parameters, optimizer state, step and data position from `checkpoint`, and
    /// the learning-rate schedule, which continues from the checkpoint's step
    /// (replacing the module's if they differ, as Lightning restores a scheduler); returns
    /// the seed of the data order to continue with.
    fn restore<D: Dataset<Batch = M::Batch>>(
        &mut self,
        checkpoint: &Checkpoint,
        train: &DataLoader<D>,
        optimizer: &mut OptimizerConfig,
    ) -> Result<u64, TrainerError> {
        let dir = checkpoint.dir();
        checkpoint.check_model(&self.strategy.parameter_shapes())?;
        let m = checkpoint.manifest();
        let here = self.data_position(train, 0);
        let mismatch = |what: &str, saved: usize, now: usize| {
            Err(CheckpointError::Mismatch {
                path: dir.to_path_buf(),
                message: format!(
                    "saved with {what} {saved}, this run has {now}: the data position would not carry over"
                ),
            })
        };
        if m.data.batch_size != here.batch_size {
            mismatch("batch size", m.data.batch_size, here.batch_size)?;
        }
        if m.data.accumulate != here.accumulate {
            mismatch(
                "accumulate_grad_batches",
                m.data.accumulate,
                here.accumulate,
            )?;
        }
        if m.data.dataset_len != here.dataset_len {
            mismatch(
                "a training set of length",
                m.data.dataset_len,
                here.dataset_len,
            )?;
        }
        let kind = optimizer.kind();
        if m.optimizer.kind != kind {
            return Err(CheckpointError::Mismatch {
                path: dir.to_path_buf(),
                message: format!(
                    "saved with optimizer {}, the module configures {kind}",
                    m.optimizer.kind
                ),
            }
            .into());
        }
        let saved = match &m.optimizer.lr_schedule {
            Some(record) => record
                .schedule()
                .map_err(|message| CheckpointError::Mismatch {
                    path: dir.to_path_buf(),
                    message,
                })?,
            None => LrSchedule::constant(),
        };
        if saved != optimizer.schedule && self.env.rank == 0 {
            eprintln!(
                "note: resuming with the checkpoint's learning-rate schedule ({saved}), not the \
                 module's ({}), so the curve continues where it stopped",
                optimizer.schedule
            );
        }
        optimizer.schedule = saved;
        self.strategy.load_state(checkpoint)?;
        self.state.global_step = m.step;
        Ok(m.rng.seed)
    }

    /// Where the data loader stands after `step` optimizer steps.
    fn data_position<D: Dataset<Batch = M::Batch>>(
        &self,
        train: &DataLoader<D>,
        step: usize,
    ) -> DataPosition {
        let accumulate = self.config.accumulate_grad_batches;
        let per_epoch = (train.batches_per_epoch() / accumulate).max(1);
        DataPosition {
            epoch: step / per_epoch,
            batch: step % per_epoch,
            batch_size: train.batch_size(),
            accumulate,
            dataset_len: train.dataset().len(),
        }
    }

    /// Saves a checkpoint of this step from every rank; rank 0 then points `last` at it and
    /// prunes, before any rank goes on.
    fn save_checkpoint<D: Dataset<Batch = M::Batch>>(
        &mut self,
        mc: &ModelCheckpoint,
        run: Option<&str>,
        train: &DataLoader<D>,
        optimizer: &OptimizerConfig,
        seed: u64,
    ) -> Result<(), TrainerError> {
        let step = self.state.global_step;
        let dir = mc.dir_for(step);
        let data = self.data_position(train, step);
        let info = SaveInfo {
            step,
            epoch: data.epoch,
            seed,
            optimizer,
            data,
            metrics: self.state.metrics.clone(),
            run: run.map(str::to_string),
            attachments: mc.attachments(),
        };
        crate::checkpoint::save(
            self.env.world.as_ref(),
            &*self.strategy,
            &dir,
            &info,
            mc.fault(),
        )?;
        if self.env.rank == 0 {
            mc.committed(&dir)?;
        }
        self.env.world.barrier()?;
        Ok(())
    }

    /// One pass over `data`; returns the loss averaged over batches and ranks, if the module
    /// reports one.
    fn evaluate<D: Dataset<Batch = M::Batch>>(
        &mut self,
        data: &DataLoader<D>,
        kind: Eval,
    ) -> Result<Option<f64>, TrainerError> {
        if let Eval::Validation = kind {
            self.callbacks(|cb, s| cb.on_validation_start(s))?;
        }
        let bar = self.progress.as_ref().map(|p| {
            let name = match kind {
                Eval::Validation => "val",
                Eval::Test => "test",
            };
            p.eval(name, data.eval_batches())
        });
        let losses = self.each_batch(data, |module, batch, b| {
            let (loss, hook) = match kind {
                Eval::Validation => (module.validation_step(batch, b)?, "validation_step"),
                Eval::Test => (module.test_step(batch, b)?, "test_step"),
            };
            if let Some(bar) = &bar {
                bar.inc(1);
            }
            loss.map(|l| scalar(&l, hook)).transpose()
        });
        if let Some(bar) = bar {
            bar.finish_and_clear();
        }
        // The mean over samples, as Lightning weights each batch's loss by its size: a
        // short last batch counts for what it holds, whatever the world size.
        let losses = losses?;
        let reported = losses.iter().any(|(l, _)| l.is_some());
        let (sum, count) = losses
            .iter()
            .filter_map(|(l, n)| l.map(|l| (l as f64 * *n as f64, *n)))
            .fold((0f64, 0usize), |(s, c), (l, n)| (s + l, c + n));
        let mean = match reported {
            false => None,
            true => {
                let world = &self.env.world;
                let sum = world.all_reduce_scalar(sum as f32, ReduceOp::Sum)? as f64;
                let count = world.all_reduce_scalar(count as f32, ReduceOp::Sum)? as f64;
                Some(sum / count)
            }
        };
        let metric = match kind {
            Eval::Validation => "val_loss",
            Eval::Test => "test_loss",
        };
        if let Some(v) = mean {
            self.state.metrics.insert(metric.into(), v);
        }
        match kind {
            Eval::Validation => self.callbacks(|cb, s| cb.on_validation_end(s))?,
            Eval::Test => self.callbacks(|cb, s| cb.on_test_end(s))?,
        }
        Ok(mean)
    }

    fn predict<D: Dataset<Batch = M::Batch>>(
        &mut self,
        data: &DataLoader<D>,
    ) -> Result<Vec<Tensor>, TrainerError> {
        let out = self.each_batch(data, |module, batch, b| Ok(module.predict_step(batch, b)?))?;
        self.callbacks(|cb, s| cb.on_predict_end(s))?;
        let order = data.epoch_order(self.config.seed, 0);
        let mut gathered = Vec::new();
        for (b, (part, _)) in out.iter().enumerate() {
            // Every rank's (rows run, rows that count) of this batch, known to all.
            let rows: Vec<(usize, usize)> = (0..self.env.world_size)
                .map(|r| {
                    let (idx, count) = data.eval_slice(&order, b, r, self.env.world_size);
                    (idx.len(), count)
                })
                .collect();
            gathered.extend(self.gather_to_rank0(part, &rows)?);
        }
        Ok(gathered)
    }

    /// Reports the parameters the first backward gave no gradient: once, on rank 0, as a
    /// warning; or, with `error_on_unused_parameters`, as an error on every rank (all ranks
    /// find the same ones, so they stop together).
    fn report_unused_parameters(&self) -> Result<(), TrainerError> {
        let names = self.strategy.unused_parameters();
        if names.is_empty() {
            return Ok(());
        }
        if self.config.error_on_unused_parameters {
            return Err(TrainerError::UnusedParameters { names });
        }
        if self.env.rank == 0 {
            eprintln!(
                "warning: {} parameter(s) received no gradient at the first step and will not \
                 train (a layer without backward, such as candle-nn's fused LayerNorm, or one \
                 the loss does not use): {}",
                names.len(),
                names.join(", ")
            );
        }
        Ok(())
    }

    /// Every rank's `part` of a global batch joined along dim 0 in rank order, on rank 0
    /// (`None` elsewhere). `rows[r]` is rank r's (rows it ran, rows that count): a part has
    /// one row per sample it ran, and rows that do not count (a rank without a sample of a
    /// short batch) are left out. Types other than f32, bf16 and f16 travel as f32, exactly
    /// for integers below 2^24 (class ids, token ids).
    fn gather_to_rank0(
        &self,
        part: &Tensor,
        rows: &[(usize, usize)],
    ) -> Result<Option<Tensor>, TrainerError> {
        let world = &self.env.world;
        let rank = self.env.rank;
        let ran = rows[rank].0;
        if part.dims().first() != Some(&ran) {
            return Err(TrainerError::config(
                "predict_step",
                format!(
                    "must return one row per sample of its batch (first dimension {ran}), got \
                     shape {:?} on rank {rank}",
                    part.dims()
                ),
            ));
        }
        let row_len = part.elem_count() / ran;
        let mean_row = world.all_reduce_scalar(row_len as f32, ReduceOp::Mean)?;
        if mean_row != row_len as f32 {
            return Err(TrainerError::config(
                "predict_step",
                format!(
                    "rank {rank} returned rows of {row_len} values where the ranks' mean is \
                     {mean_row}: every rank must return rows of the same shape"
                ),
            ));
        }
        let wire = match part.dtype() {
            DType::F32 | DType::BF16 | DType::F16 => part.dtype(),
            _ => DType::F32,
        };
        // Equal chunks for the gather: each part padded to the most rows any rank ran.
        let chunk = rows.iter().map(|r| r.0).max().unwrap_or(0) * row_len;
        let mut flat = part.flatten_all()?.to_dtype(wire)?;
        if flat.elem_count() < chunk {
            let pad = Tensor::zeros(chunk - flat.elem_count(), wire, part.device())?;
            flat = Tensor::cat(&[&flat, &pad], 0)?;
        }
        let flat = flat.contiguous()?;
        let full = Tensor::zeros(chunk * rows.len(), wire, part.device())?;
        world.all_gather_into(&flat, &full)?;
        if rank != 0 {
            return Ok(None);
        }
        let kept = rows
            .iter()
            .enumerate()
            .filter(|(_, (_, count))| *count > 0)
            .map(|(r, (_, count))| full.narrow(0, r * chunk, count * row_len))
            .collect::<candle_core::Result<Vec<_>>>()?;
        let mut dims = part.dims().to_vec();
        dims[0] = rows.iter().map(|r| r.1).sum();
        Ok(Some(
            Tensor::cat(&kept, 0)?
                .reshape(dims)?
                .to_dtype(part.dtype())?,
        ))
    }

    /// Runs `step` on this rank's part of every evaluation batch of `data` (every sample,
    /// epoch 0's order), freeing after each what the strategy gathered for it; returns each
    /// batch's result with the number of this rank's samples that count
    /// ([`DataLoader::eval_slice`]).
    fn each_batch<D: Dataset<Batch = M::Batch>, T>(
        &mut self,
        data: &DataLoader<D>,
        mut step: impl FnMut(&mut M, &M::Batch, usize) -> Result<T, TrainerError>,
    ) -> Result<Vec<(T, usize)>, TrainerError> {
        let order = data.epoch_order(self.config.seed, 0);
        (0..data.eval_batches())
            .map(|b| {
                let (idx, count) = data.eval_slice(&order, b, self.env.rank, self.env.world_size);
                let batch = data.dataset().batch(idx, &self.env.device)?;
                let out = step(self.module, &batch, b);
                self.strategy.free_gathered();
                Ok((out?, count))
            })
            .collect()
    }
}

/// The value of a scalar loss, or an error naming the hook that returned something else.
fn scalar(loss: &Tensor, hook: &str) -> Result<f32, TrainerError> {
    if loss.rank() != 0 {
        return Err(TrainerError::config(
            hook,
            format!("must return a scalar loss, got shape {:?}", loss.dims()),
        ));
    }
    Ok(loss.to_dtype(DType::F32)?.to_scalar::<f32>()?)
}
