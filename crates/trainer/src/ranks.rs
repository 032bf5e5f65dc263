//! A stage on this process's ranks: one module and one strategy per rank (kept between
//! stages in a [`Session`]), the launch, and the ranks' outcomes made one result.

use crate::metrics_csv::MetricsCsv;
use crate::progress::Progress;
use crate::rank_run::{RankOutput, RankRun, StageInput};
use crate::trainer::Trainer;
use crate::{Attached, Dataset, Replicate, TrainerError};
use std::any::Any;
use std::sync::Mutex;
use wick_accelerator::{Accelerator, RankError};
use wick_core::{lock, BlockingWorld, Callback, RunState, Stage, Strategy, WaitClock};

/// The rank replicas and strategies of the module a trainer configured, kept so that later
/// stages on the same module reuse its parameters.
pub(crate) struct Session {
    /// The [`Attached::id`] of the module.
    module: u64,
    pub(crate) strategies: Vec<Box<dyn Strategy>>,
    /// `Vec<M>`: the modules of ranks 1.., rank 0's being the caller's.
    replicas: Box<dyn Any + Send>,
}

type Slot<'a, M> = Mutex<Option<(&'a mut M, &'a mut Box<dyn Strategy>, Vec<Box<dyn Callback>>)>>;

impl Trainer {
    /// Runs `stage` on this process's ranks; `csv`, the fit's metrics file, goes to rank 0.
    pub(crate) fn run_stage<M, D>(
        &mut self,
        module: &mut Attached<M>,
        stage: Stage,
        loaders: &StageInput<'_, D>,
        csv: Option<MetricsCsv>,
    ) -> Result<Vec<RankOutput>, TrainerError>
    where
        M: Replicate + 'static,
        D: Dataset<Batch = M::Batch>,
    {
        let world_size = self.world_size();
        for loader in [loaders.train, loaders.eval].into_iter().flatten() {
            loader.check(world_size)?;
        }
        // Ranks as threads each need a module; a process under a launcher runs its own rank
        // only, on the caller's module, and clones nothing.
        let local = self.accelerator.local_ranks();
        let key = module.id();
        let mut session = match self.session.take() {
            Some(s) if s.module == key => s,
            _ => Session {
                module: key,
                strategies: local
                    .clone()
                    .map(|_| self.strategy.for_new_rank())
                    .collect(),
                replicas: Box::new(
                    local
                        .clone()
                        .skip(1)
                        .map(|_| module.replica().ok_or_else(no_replica))
                        .collect::<Result<Vec<M>, _>>()?,
                ),
            },
        };
        let replicas = session
            .replicas
            .downcast_mut::<Vec<M>>()
            .expect("an Attached id belongs to one module, of one type");
        let slots: Vec<Slot<'_, M>> = std::iter::once(module.module_mut())
            .chain(replicas.iter_mut())
            .zip(session.strategies.iter_mut())
            .map(|(m, s)| {
                Mutex::new(Some((
                    m,
                    s,
                    self.callbacks.iter().map(|c| c.clone_box()).collect(),
                )))
            })
            .collect();
        let config = &self.config;
        let csv = Mutex::new(csv);
        let outcomes = self.accelerator.launch(|mut env| {
            let (module, strategy, callbacks) = slots[env.rank - local.start]
                .lock()
                .map_err(|_| TrainerError::config("rank", "slot lock poisoned"))?
                .take()
                .expect("each rank takes its slot once");
            let state = RunState::new(env.rank, env.world_size);
            if !config.overlap_comm {
                env.world = BlockingWorld::over(env.world.clone());
            }
            // Every collective of the stage, the strategy's and the trainer's, is timed.
            let clock = WaitClock::over(env.world.clone());
            env.world = clock.clone();
            let progress = Progress::new_if_terminal(env.rank == 0 && config.progress);
            let csv = match env.rank {
                0 => lock(&csv).take(),
                _ => None,
            };
            RankRun {
                env,
                clock,
                progress,
                csv,
                module,
                strategy: strategy.as_mut(),
                callbacks,
                config,
                state,
            }
            .run(stage, loaders)
        });
        drop(slots);
        let idled = idle(&self.accelerator, &mut session.strategies);
        self.session = Some(session);
        let outputs = collect_ranks(local.start, outcomes)?;
        idled?;
        Ok(outputs)
    }
}

/// Connects each rank's strategy to the world it keeps between stages
/// ([`Accelerator::idle_world`]): with ranks as threads the launch's world has ended, so a
/// sharded module used outside the trainer says what to call instead of waiting on ranks
/// that left, and whatever the stage gathered is freed.
pub(crate) fn idle(
    accelerator: &Accelerator,
    strategies: &mut [Box<dyn Strategy>],
) -> Result<(), TrainerError> {
    let first = accelerator.local_ranks().start;
    for (rank, strategy) in (first..).zip(strategies.iter_mut()) {
        if let Some((world, device)) = accelerator.idle_world(rank) {
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
    let caused_by_peer =
        |e: &RankError<TrainerError>| matches!(e, RankError::Failed(t) if t.is_consequence());
    let (rank, message) = errors
        .iter()
        .find(|(_, _, e)| !caused_by_peer(e))
        .or(errors.first())
        .map(|(r, m, _)| (*r, m.clone()))
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
