//! A stage on this process's ranks: one module and one strategy per rank (kept between
//! stages in the module's [`Session`]), the launch that hands each rank its own, and the
//! ranks' outcomes made one result.

use crate::attached::Session;
use crate::config::Config;
use crate::logging::progress::Progress;
use crate::logging::sinks::StepSinks;
use crate::loops::{enter_stage, run_stage, CallbackList, RankContext, RankOutput, StageInput};
use crate::{Attached, Dataset, Replicate, TrainerError};
use wick_accelerator::{Accelerator, RankError};
use wick_core::{
    BlockingWorld, Callback, CollectiveError, RankStrategy, Stage, Strategy, WaitClock,
};

/// What launching a stage on this process's ranks reads of its trainer.
pub(crate) struct StageLauncher<'a> {
    /// The trainer's identity, which the module's session is kept under.
    pub(crate) trainer: u64,
    pub(crate) accelerator: &'a Accelerator,
    /// The strategy each rank sets the module up under, the first time.
    pub(crate) strategy: &'a dyn Strategy,
    pub(crate) callbacks: &'a [Box<dyn Callback>],
    pub(crate) config: &'a Config,
}

/// What rank r of a stage takes for its own: its module, its strategy (set up by an
/// earlier stage, or to be set up by this one), its callbacks and, on rank 0, the fit's step
/// sinks.
type RankInput<'a, 's, M> = (
    &'a mut M,
    &'a mut Option<Box<dyn RankStrategy>>,
    Vec<Box<dyn Callback>>,
    StepSinks<'s>,
);

impl StageLauncher<'_> {
    /// Runs `stage` on this process's ranks; `sinks`, the fit's step sinks, go to its first
    /// (rank 0's, when this process runs it).
    pub(crate) fn run_stage<M, D>(
        &self,
        module: &mut Attached<M>,
        stage: Stage,
        loaders: &StageInput<'_, D>,
        sinks: StepSinks<'_>,
    ) -> Result<Vec<RankOutput>, TrainerError>
    where
        M: Replicate,
        D: Dataset<Batch = M::Batch>,
    {
        let world_size = self.accelerator.world_size();
        for loader in [loaders.train, loaders.eval].into_iter().flatten() {
            loader.check(world_size)?;
        }
        let (module, kept) = module.parts_for(self.trainer);
        // The ranks' strategies of an earlier stage; or none yet, and each rank sets the
        // module up at the start of this stage.
        let (mut replicas, mut strategies): (Vec<M>, Vec<Option<_>>) = match kept.take() {
            Some(session) => (
                session.replicas,
                session.strategies.into_iter().map(Some).collect(),
            ),
            None => (
                self.new_replicas(module)?,
                self.accelerator.local_ranks().map(|_| None).collect(),
            ),
        };
        let mut sinks = Some(sinks);
        let inputs: Vec<RankInput<'_, '_, M>> = std::iter::once(&mut *module)
            .chain(replicas.iter_mut())
            .zip(strategies.iter_mut())
            .map(|(m, s)| {
                let callbacks = self.callbacks.iter().map(|c| c.clone_box()).collect();
                (m, s, callbacks, sinks.take().unwrap_or_default())
            })
            .collect();
        let (config, strategy) = (self.config, self.strategy);
        let outcomes = self.accelerator.launch_each(inputs, |mut env, input| {
            let (module, slot, callbacks, sinks) = input;
            if !config.overlap_comm {
                env.world = BlockingWorld::over(env.world.clone());
            }
            // Every collective of the stage, the strategy's and the trainer's, is timed.
            let clock = WaitClock::over(env.world.clone());
            env.world = clock.clone();
            let mut callbacks = CallbackList::new(callbacks, env.rank, env.world_size);
            let strategy = enter_stage(
                &env,
                module,
                &mut callbacks,
                (strategy, slot),
                stage,
                config.seed,
            )?;
            let ctx = RankContext {
                bars: Progress::new_if_terminal(env.rank == 0 && config.progress),
                callbacks,
                env,
                clock,
                sinks,
                module,
                strategy,
                config,
            };
            run_stage(ctx, stage, loaders)
        });
        // Every rank set up, kept or not, leaves the stage's world: the module may hold
        // its shards' handles.
        let idled = idle(self.accelerator, strategies.iter_mut().map(Option::as_mut));
        // Kept for the stages to come only where every local rank set the module up: a
        // rank that failed to leaves none, and the next stage sets every rank up afresh.
        let set_up: Option<Vec<Box<dyn RankStrategy>>> = strategies.into_iter().collect();
        if let Some(strategies) = set_up {
            *kept = Some(Session {
                trainer: self.trainer,
                strategies,
                replicas,
            });
        }
        let outputs = collect_ranks(self.accelerator.local_ranks().start, outcomes)?;
        idled?;
        Ok(outputs)
    }

    /// With ranks as threads, a module for each rank after the first (a process under a
    /// launcher runs its own rank only, on the caller's module, and clones nothing).
    fn new_replicas<M: Replicate>(&self, module: &M) -> Result<Vec<M>, TrainerError> {
        let local = self.accelerator.local_ranks();
        local
            .skip(1)
            .map(|_| module.replica().ok_or_else(no_replica))
            .collect()
    }
}

/// Connects each local rank's strategy (in rank order; `None` for a rank that has none) to
/// the world it keeps between stages ([`Accelerator::idle_world`]): with ranks as threads
/// the launch's world has ended, so a sharded module used outside the trainer says what to
/// call instead of waiting on ranks that left, and whatever the stage gathered is freed.
pub(crate) fn idle<'a>(
    accelerator: &Accelerator,
    strategies: impl IntoIterator<Item = Option<&'a mut Box<dyn RankStrategy>>>,
) -> Result<(), TrainerError> {
    let first = accelerator.local_ranks().start;
    for (rank, strategy) in (first..).zip(strategies) {
        if let (Some(strategy), Some((world, device))) = (strategy, accelerator.idle_world(rank)) {
            strategy.connect(world, device)?;
        }
    }
    Ok(())
}

pub(crate) fn no_replica() -> TrainerError {
    TrainerError::config(
        "devices",
        "ranks as threads need one module per rank, and this module's Replicate::replica \
         gives none: derive Clone on it, or run one rank per process under mpirun or srun",
    )
}

/// The outputs of this process's ranks (the first being `first`), or one error: the error
/// itself when every rank failed with the same one (bad input that no rank caused: a
/// missing file, a wrong option), otherwise [`TrainerError::RankFailed`] naming the rank
/// that failed first.
pub(crate) fn collect_ranks<T>(
    first: usize,
    outcomes: Vec<Result<T, RankError<TrainerError>>>,
) -> Result<Vec<T>, TrainerError> {
    let count = outcomes.len();
    let mut values = Vec::with_capacity(count);
    let mut errors = Vec::new();
    for (rank, outcome) in (first..).zip(outcomes) {
        match outcome {
            Ok(v) => values.push(v),
            Err(e) => errors.push((rank, e.to_string(), e)),
        }
    }
    if errors.is_empty() {
        return Ok(values);
    }
    let shared = errors.len() == count
        && errors
            .iter()
            .all(|(_, m, e)| *m == errors[0].1 && matches!(e, RankError::Failed(_)));
    if shared {
        if let Some((_, _, RankError::Failed(e))) = errors.into_iter().next() {
            return Err(e);
        }
        unreachable!("every error was checked to be a rank's own");
    }
    let collective = |e: &RankError<TrainerError>| match e {
        RankError::Failed(t) => t.collective().cloned(),
        RankError::Panicked(_) => None,
    };
    // The rank to blame: the first whose error is its own (not a report of a peer's
    // failure); else, when the failure was a stall, the rank a timeout waited for in vain
    // (with the timeout's message); else the first.
    let own = errors
        .iter()
        .find(|(_, _, e)| collective(e).and_then(|c| c.blames()).is_none())
        .map(|(r, m, _)| (*r, m.clone()));
    // A stall: the timeouts name the ranks that were in no collective when they fired.
    // Those that timed out themselves only gave up later; of the rest, the rank named most.
    let stalled = || {
        let timeouts: Vec<(Vec<usize>, &String)> = errors
            .iter()
            .filter_map(|(_, m, e)| match collective(e)? {
                CollectiveError::Timeout { missing, .. } => Some((missing, m)),
                _ => None,
            })
            .collect();
        let timed_out = |r: usize| {
            errors.iter().any(|(q, _, e)| {
                *q == r && matches!(collective(e), Some(CollectiveError::Timeout { .. }))
            })
        };
        let named = |r: usize| {
            timeouts
                .iter()
                .filter(|(missing, _)| missing.contains(&r))
                .count()
        };
        let (_, message) = timeouts.first()?;
        timeouts
            .iter()
            .flat_map(|(missing, _)| missing.iter().copied())
            .filter(|&r| !timed_out(r))
            .max_by_key(|&r| (named(r), std::cmp::Reverse(r)))
            .map(|r| (r, (*message).clone()))
    };
    let (rank, message) = own
        .or_else(stalled)
        .or_else(|| errors.first().map(|(r, m, _)| (*r, m.clone())))
        .expect("some rank failed");
    Err(TrainerError::RankFailed {
        rank,
        message,
        ranks: errors
            .into_iter()
            .map(|(r, m, _)| (r, format!("rank {r}: {m}")))
            .collect(),
    })
}
