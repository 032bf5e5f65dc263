//! The ranks' vote after each step on whether the fit goes on.

use crate::TrainerError;
use candle_core::{Device, Tensor};
use wick_core::{Collective, CollectiveExt, ReduceOp};

/// What one rank brings to the vote after a step: whether a callback asked to stop (with
/// `RunState::request_stop`), and whether a preemption reached it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct StopVote {
    pub(crate) stop_asked: bool,
    pub(crate) preempted: bool,
}

/// What the ranks agreed to do after a step.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Stop {
    Continue,
    /// A callback asked (early stopping): fit ends as at its last step.
    Early,
    /// A preemption: save this step and return [`TrainerError::Interrupted`].
    Preempted,
}

impl StopVote {
    /// The world's decision: one all-reduce of the two counts, so every rank stops after
    /// the same step; a preemption anywhere outweighs an early stop.
    pub(crate) fn agree(self, world: &dyn Collective) -> Result<Stop, TrainerError> {
        let flag = |b: bool| f32::from(u8::from(b));
        let counts = Tensor::new(&[flag(self.stop_asked), flag(self.preempted)], &Device::Cpu)?;
        world.all_reduce_in_place(&counts, ReduceOp::Sum)?;
        let counts = counts.to_vec1::<f32>()?;
        Ok(match (counts[0] > 0.0, counts[1] > 0.0) {
            (_, true) => Stop::Preempted,
            (true, false) => Stop::Early,
            (false, false) => Stop::Continue,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use wick_accelerator::ThreadWorld;

    #[test]
    fn any_rank_asking_stops_every_rank_and_a_preemption_wins() {
        let votes = [
            [StopVote::default(), StopVote::default()],
            [
                StopVote::default(),
                StopVote {
                    stop_asked: true,
                    preempted: false,
                },
            ],
            [
                StopVote {
                    stop_asked: true,
                    preempted: false,
                },
                StopVote {
                    stop_asked: false,
                    preempted: true,
                },
            ],
        ];
        let expected = [Stop::Continue, Stop::Early, Stop::Preempted];
        for (votes, expected) in votes.into_iter().zip(expected) {
            let decided: Vec<Stop> = ThreadWorld::new(2)
                .run_each(votes.to_vec(), |comm, vote| vote.agree(&comm))
                .into_iter()
                .map(|r| r.unwrap_or_else(|e| panic!("{e}")))
                .collect();
            assert_eq!(decided, [expected; 2]);
        }
    }
}
