//! One rank's side of a stage: its context ([`RankContext`], plain data), the hook
//! sequence of docs/design.md around the stage ([`run_stage`]), and the loops that own
//! their state: [`FitLoop`] with its typed [`FitProgress`], one [`TrainStep`] at a time,
//! the [`StopVote`] after it, and the evaluation and prediction passes ([`EvalLoop`],
//! [`PredictLoop`]).

mod callback_list;
pub(crate) mod checkpoint_manager;
mod eval_loop;
mod fit_loop;
mod fit_progress;
mod model_summary;
mod predict_loop;
mod rank_context;
mod rank_stage;
mod resume;
mod stop_vote;
mod train_step;

pub(crate) use callback_list::CallbackList;
pub(crate) use eval_loop::{EvalKind, EvalLoop};
pub(crate) use fit_loop::FitLoop;
pub(crate) use fit_progress::FitProgress;
pub(crate) use predict_loop::PredictLoop;
pub(crate) use rank_context::RankContext;
pub use rank_stage::Metrics;
pub(crate) use rank_stage::{enter_stage, run_stage, RankOutput, StageInput};
pub(crate) use stop_vote::{Stop, StopVote};
pub(crate) use train_step::TrainStep;

use crate::TrainerError;
use candle_core::{DType, Tensor};

/// The value of a scalar loss, or an error naming the hook that returned something else.
pub(crate) fn scalar(loss: &Tensor, hook: &str) -> Result<f32, TrainerError> {
    if loss.rank() != 0 {
        return Err(TrainerError::config(
            hook,
            format!("must return a scalar loss, got shape {:?}", loss.dims()),
        ));
    }
    Ok(loss.to_dtype(DType::F32)?.to_scalar::<f32>()?)
}
