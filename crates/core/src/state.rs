//! A rank's model and optimizer state as checkpoints see it: ranges of flat buffers.
//!
//! Every strategy lays parameters end to end in groups (one group of all parameters under
//! single, ddp and zero 1-2; one per unit under zero3 and fsdp). A rank saves one contiguous
//! range of each group — of the parameters and of each optimizer state of the same shape —
//! and loads by asking a [`StateReader`] for any range of any list of parameters. The
//! element at a parameter's flat index is the same whatever the world size or strategy
//! that saved it, which is what lets a checkpoint load at any world size.

use candle_core::{Shape, Tensor};
use std::ops::Range;

/// Parameters laid end to end, in order, without padding: parameter `i` starts where
/// parameter `i - 1` ends.
#[derive(Debug, Clone, PartialEq)]
pub struct FlatGroup {
    /// A name unique within the model's groups (`all`, `unit.3`, ...).
    pub name: String,
    /// Each parameter's name and full shape, in order.
    pub params: Vec<(String, Shape)>,
}

impl FlatGroup {
    /// The elements of all parameters together.
    pub fn numel(&self) -> usize {
        self.params.iter().map(|(_, s)| s.elem_count()).sum()
    }
}

/// The state kinds saved beside the parameters: `param` itself, then the optimizer's
/// (`exp_avg`, `exp_avg_sq` for AdamW; `momentum_buffer` for SGD with momentum), named as
/// torch names them.
pub const PARAM_KIND: &str = "param";

/// One group's range as this rank saves it.
#[derive(Debug, Clone)]
pub struct GroupRange {
    /// The group.
    pub group: FlatGroup,
    /// The flat elements this rank saves (may be empty: replicas and padding-only ranks).
    pub range: Range<usize>,
    /// Per state kind, a 1-D f32 tensor of `range.len()` elements.
    pub tensors: Vec<(String, Tensor)>,
}

/// What one rank contributes to a checkpoint.
#[derive(Debug, Clone, Default)]
pub struct RankState {
    /// Its range of every group, in the strategy's group order.
    pub groups: Vec<GroupRange>,
    /// Optimizer steps taken.
    pub optimizer_step: usize,
    /// The dynamic loss scale of `16-mixed` runs (the same on every rank).
    pub loss_scale: Option<LossScale>,
}

/// Where a dynamic loss scaler stands (`torch.amp.GradScaler`'s state).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LossScale {
    /// The factor the loss is multiplied by before backward.
    pub scale: f64,
    /// Steps with finite gradients since the scale last changed.
    pub growth_tracker: usize,
    /// Optimizer steps skipped so far because a gradient held inf or NaN on some rank.
    pub skipped_steps: usize,
}

/// Saved state served by parameter name, whatever world size or strategy saved it.
pub trait StateReader {
    /// Elements `range` of the flat concatenation of `params` (in the order given, without
    /// padding) for state `kind`, as a 1-D f32 tensor. Errors name the parameter and file
    /// when a parameter is missing, has another shape, or a file does not hold its elements.
    fn read(
        &self,
        kind: &str,
        params: &[(String, Shape)],
        range: Range<usize>,
    ) -> candle_core::Result<Tensor>;

    /// The state kinds saved besides `param` (empty before the first optimizer step).
    fn optimizer_kinds(&self) -> Vec<String>;

    /// Optimizer steps taken when the checkpoint was saved.
    fn optimizer_step(&self) -> usize;

    /// The loss scale saved with a `16-mixed` run, if any.
    fn loss_scale(&self) -> Option<LossScale>;
}
