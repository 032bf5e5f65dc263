//! `Accelerator`: which device each rank gets, how ranks are launched (threads of this
//! process, or processes a launcher started), and the sharded setup of a module.

use crate::device::{check_gpus, rank_device, DeviceKind};
use crate::launcher::LaunchEnv;
use crate::thread_budget::{run_within, ThreadBudget};
use crate::worker_spin::DEFAULT_WORKER_SPIN;
use crate::worlds::{panic_message, EndedWorld, MpiWorld, NcclWorld, RankError, ThreadWorld};
use candle_core::Device;
use std::sync::Arc;
use std::time::Duration;
use wick_core::{Collective, CollectiveExt, Error, Result, SoloWorld};

/// What a rank has once its environment is set up: its place in the world and its device.
#[derive(Clone)]
pub struct RankEnv {
    /// This rank.
    pub rank: usize,
    /// The number of ranks.
    pub world_size: usize,
    /// The world's collectives, up and usable.
    pub world: Arc<dyn Collective>,
    /// This rank's device.
    pub device: Device,
}

/// How the ranks of a world come to be.
#[derive(Debug, Clone)]
enum Ranks {
    /// Every rank is a thread of this process.
    Threads(usize),
    /// A launcher started one process per rank; this process is rank `rank`.
    Process {
        launch: LaunchEnv,
        rank: usize,
        world_size: usize,
    },
}

/// Devices and the world they form: ranks as threads of this process, or, with the `mpi`
/// feature, this process as one rank of a world that `mpirun` or `srun` started; each rank
/// on the CPU, or on a CUDA GPU of its own (the `cuda` feature).
///
/// The worlds: CPU ranks use a `ThreadWorld` (threads) or an `MpiWorld` (processes). CUDA
/// ranks use an `NcclWorld` over that world with the `nccl` feature, and otherwise stage
/// their collectives through host memory over it.
#[derive(Debug, Clone)]
pub struct Accelerator {
    ranks: Ranks,
    timeout: Option<Duration>,
    budget: ThreadBudget,
    /// How long the idle threads of a rank's pool look for work before they nap.
    worker_spin: Duration,
    kind: DeviceKind,
    /// The devices of this process's ranks, opened once so that every launch sees the same
    /// Candle devices (tensors of one launch are used by the next).
    devices: Vec<Device>,
    layer: Option<WorldLayer>,
}

/// What every rank's collectives go through on their way to its world: a recorder, a
/// counter, or a test's fault injector. It is given each rank's world (its rank and size
/// are the world's) and returns the world the rank uses.
#[derive(Clone)]
pub struct WorldLayer(Arc<WrapWorld>);

/// What a [`WorldLayer`] does to each rank's world.
type WrapWorld = dyn Fn(Arc<dyn Collective>) -> Arc<dyn Collective> + Send + Sync;

impl WorldLayer {
    /// A layer that wraps each rank's world with `wrap`.
    pub fn new(
        wrap: impl Fn(Arc<dyn Collective>) -> Arc<dyn Collective> + Send + Sync + 'static,
    ) -> Self {
        WorldLayer(Arc::new(wrap))
    }
}

impl std::fmt::Debug for WorldLayer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("WorldLayer")
    }
}

impl Accelerator {
    /// `devices` CPU ranks, run as threads of this process (whatever started it).
    ///
    /// It changes nothing of the process's (the environment, malloc): a program that wants
    /// wick's settings for CPU training calls [`crate::tune_host_process`] first.
    pub fn cpu(devices: usize) -> Result<Self> {
        if devices == 0 {
            return Err(Error::config("devices", "must be at least 1, got 0"));
        }
        Ok(Self::on_cpu(Ranks::Threads(devices), devices))
    }

    /// `ranks`, `local` of them in this process, on the CPU with the default options.
    fn on_cpu(ranks: Ranks, local: usize) -> Self {
        Accelerator {
            ranks,
            timeout: None,
            budget: ThreadBudget::Auto,
            worker_spin: DEFAULT_WORKER_SPIN,
            kind: DeviceKind::Cpu,
            devices: vec![Device::Cpu; local],
            layer: None,
        }
    }

    /// `devices` ranks as threads of this process, rank r on CUDA GPU r. Fewer GPUs than
    /// ranks, no GPU, or a build without the `cuda` feature is an error, never a CPU run.
    pub fn cuda(devices: usize) -> Result<Self> {
        Self::cpu(devices)?.on(DeviceKind::Cuda)
    }

    /// `ranks` ranks as threads that all compute on CUDA GPU 0, their collectives staged
    /// through host memory (a `ThreadWorld`). Slow; it exists so that the strategies' device
    /// code runs at several ranks on a machine with one GPU, which NCCL refuses.
    pub fn cuda_one_gpu(ranks: usize) -> Result<Self> {
        let mut accelerator = Self::cpu(ranks)?;
        check_gpus(ranks, 0)?;
        // One Candle device for all: each thread still computes on its own stream.
        accelerator.devices = vec![rank_device(DeviceKind::Cuda, 0)?; ranks];
        accelerator.kind = DeviceKind::Cuda;
        Ok(accelerator)
    }

    /// The same ranks on devices of `kind`: with CUDA, rank r of this process's ranks on
    /// GPU r (threads), or the process on GPU `local_rank` (a launcher's processes).
    pub fn on(mut self, kind: DeviceKind) -> Result<Self> {
        let ordinals: Vec<usize> = match &self.ranks {
            Ranks::Threads(n) => (0..*n).collect(),
            Ranks::Process { launch, .. } => vec![launch.local_rank],
        };
        if kind == DeviceKind::Cuda {
            let highest = ordinals.iter().copied().max().unwrap_or(0);
            check_gpus(self.world_size(), highest)?;
        }
        self.devices = ordinals
            .into_iter()
            .map(|o| rank_device(kind, o))
            .collect::<Result<_>>()?;
        self.kind = kind;
        Ok(self)
    }

    /// The kind of device the ranks compute on.
    pub fn device_kind(&self) -> DeviceKind {
        self.kind
    }

    /// CPU ranks as the environment says: when a launcher (`mpirun`, `srun`) started this
    /// process, it is one rank of the launcher's world, and `devices`, if given, must equal
    /// that world's size; otherwise `devices` ranks (default 1) as threads.
    ///
    /// A process started by a launcher in a build without the `mpi` feature is refused:
    /// W independent copies that write the same files are never what was meant.
    pub fn from_env(devices: Option<usize>) -> Result<Self> {
        match LaunchEnv::detect()? {
            None => Self::cpu(devices.unwrap_or(1)),
            Some(launch) => Self::process(launch, devices),
        }
    }

    fn process(launch: LaunchEnv, devices: Option<usize>) -> Result<Self> {
        if !MpiWorld::ENABLED {
            let launcher = launch.launcher.name();
            let of = launch
                .world_size
                .map(|w| format!(" of {w}"))
                .unwrap_or_default();
            return Err(Error::config(
                "launcher",
                format!(
                    "{launcher} started this process as rank {}{of}, but this wick was built \
                     without the `mpi` feature and cannot join the other processes; rebuild with \
                     `--features mpi`, or start it without {launcher} to run ranks as threads",
                    launch.rank
                ),
            ));
        }
        let world = MpiWorld::process_world()?;
        let (rank, world_size) = (world.rank(), world.world_size());
        let launcher = launch.launcher.name();
        if let Some(env_size) = launch.world_size.filter(|&s| s != world_size) {
            return Err(Error::config(
                "launcher environment",
                format!(
                    "{launcher} set a world of {env_size} processes but MPI has {world_size}: \
                     was this process started by another MPI's launcher?"
                ),
            ));
        }
        if let Some(d) = devices.filter(|&d| d != world_size) {
            return Err(Error::config(
                "devices",
                format!(
                    "{d} asked, but {launcher} started {world_size} processes: leave it out \
                     or pass {world_size}"
                ),
            ));
        }
        let ranks = Ranks::Process {
            launch,
            rank,
            world_size,
        };
        Ok(Self::on_cpu(ranks, 1))
    }

    /// Fails a collective that waits longer than `timeout` for the other ranks (ranks as
    /// threads; under a launcher a rank that dies ends the job instead).
    pub fn with_collective_timeout(mut self, timeout: Duration) -> Self {
        self.timeout = Some(timeout);
        self
    }

    /// Makes every rank's collectives go through `layer` (see [`WorldLayer`]).
    pub fn with_world_layer(mut self, layer: WorldLayer) -> Self {
        self.layer = Some(layer);
        self
    }

    /// The compute threads each CPU rank may use (default [`ThreadBudget::Auto`]: the
    /// cores shared out between ranks that are threads). A process that a launcher
    /// started runs in a pool of its own only with [`ThreadBudget::PerRank`] (as
    /// `torch.set_num_threads` in each of PyTorch's processes), and otherwise on Candle's
    /// own pool; CUDA ranks always keep Candle's.
    pub fn with_thread_budget(mut self, budget: ThreadBudget) -> Self {
        self.budget = budget;
        self
    }

    /// How long the idle threads of a rank's pool (one of [`ThreadBudget`]'s, of two or more
    /// threads) keep looking for work after their last job before they nap, as OpenMP's
    /// threads spin between parallel regions; rayon's own workers sleep after tens of
    /// microseconds, and waking one again cost each op tens more on a virtual machine.
    /// Default 5 ms; zero leaves the workers to rayon.
    pub fn with_worker_spin(mut self, spin: Duration) -> Self {
        self.worker_spin = spin;
        self
    }

    /// The number of ranks in the world.
    pub fn world_size(&self) -> usize {
        match &self.ranks {
            Ranks::Threads(n) => *n,
            Ranks::Process { world_size, .. } => *world_size,
        }
    }

    /// The ranks this process runs: all of them as threads, or its own under a launcher.
    pub fn local_ranks(&self) -> std::ops::Range<usize> {
        match &self.ranks {
            Ranks::Threads(n) => 0..*n,
            Ranks::Process { rank, .. } => *rank..*rank + 1,
        }
    }

    /// The world (and device) rank `rank`'s strategy keeps between stages, once a launch
    /// returned, or `None` to keep the one the launch gave it. Ranks as threads end with the
    /// launch, so a world of one becomes a [`SoloWorld`] (its module runs alone after the
    /// stage) and a larger one an [`EndedWorld`] (a sharded module's gathers fail at once,
    /// saying what to call instead). A launcher's process world outlives the launch: every
    /// process can still run a collective forward together.
    pub fn idle_world(&self, rank: usize) -> Option<(Arc<dyn Collective>, Device)> {
        let world: Arc<dyn Collective> = match &self.ranks {
            Ranks::Threads(1) => Arc::new(SoloWorld),
            Ranks::Threads(n) => Arc::new(EndedWorld::new(rank, *n)),
            Ranks::Process { .. } => return None,
        };
        Some((world, self.devices.get(rank)?.clone()))
    }

    /// The launcher that started this process, when each rank is a process.
    pub fn launcher(&self) -> Option<&LaunchEnv> {
        match &self.ranks {
            Ranks::Threads(_) => None,
            Ranks::Process { launch, .. } => Some(launch),
        }
    }

    /// Runs `f` on each of this process's ranks ([`Accelerator::local_ranks`]) with its
    /// environment (device, world) set up; outcomes come back in rank order. A world that
    /// cannot be set up (an NCCL communicator) fails the rank with that error.
    ///
    /// As threads, a rank that errors or panics makes every other rank's pending and later
    /// collectives fail with an error naming it. As a process, a rank that errors or panics
    /// prints an error naming itself and ends the whole job (`MPI_Abort`), so that no other
    /// process waits for it: under a launcher an `Err` never comes back.
    pub fn launch<T, E, F>(&self, f: F) -> Vec<std::result::Result<T, RankError<E>>>
    where
        T: Send,
        E: std::fmt::Display + Send + From<Error>,
        F: Fn(RankEnv) -> std::result::Result<T, E> + Sync,
    {
        let inputs = self.local_ranks().map(|_| ()).collect();
        self.launch_each(inputs, |env, ()| f(env))
    }

    /// [`Accelerator::launch`] with an input of each local rank's own, in rank order:
    /// rank r takes `inputs[r - local_ranks().start]` by value (its module, its strategy),
    /// so that nothing a rank owns is shared behind a lock to reach it.
    ///
    /// # Panics
    /// When `inputs` does not hold one input per local rank.
    pub fn launch_each<I, T, E, F>(
        &self,
        inputs: Vec<I>,
        f: F,
    ) -> Vec<std::result::Result<T, RankError<E>>>
    where
        I: Send,
        T: Send,
        E: std::fmt::Display + Send + From<Error>,
        F: Fn(RankEnv, I) -> std::result::Result<T, E> + Sync,
    {
        assert_eq!(
            inputs.len(),
            self.local_ranks().len(),
            "one input per local rank"
        );
        match &self.ranks {
            Ranks::Threads(n) => {
                let world = match self.timeout {
                    Some(t) => ThreadWorld::with_timeout(*n, t),
                    None => ThreadWorld::new(*n),
                };
                let threads = match self.kind {
                    DeviceKind::Cpu => self.budget.threads(*n),
                    DeviceKind::Cuda => None,
                };
                world.run_each(inputs, |comm, input| {
                    let device = self.devices[comm.rank()].clone();
                    run_within(threads, self.worker_spin, || {
                        f(self.rank_env(Arc::new(comm), device)?, input)
                    })
                })
            }
            Ranks::Process { .. } => {
                let threads = match (self.kind, self.budget) {
                    (DeviceKind::Cpu, ThreadBudget::PerRank(n)) => Some(n),
                    _ => None,
                };
                let input = inputs
                    .into_iter()
                    .next()
                    .expect("one input for this process");
                vec![Ok(run_within(threads, self.worker_spin, || {
                    self.launch_process(&f, input)
                }))]
            }
        }
    }

    fn launch_process<I, T, E, F>(&self, f: &F, input: I) -> T
    where
        T: Send,
        E: std::fmt::Display + Send + From<Error>,
        F: Fn(RankEnv, I) -> std::result::Result<T, E> + Sync,
    {
        let world = MpiWorld::process_world()
            .expect("the accelerator joined the process world when it was made");
        let run = || {
            f(
                self.rank_env(world.clone(), self.devices[0].clone())?,
                input,
            )
        };
        let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(run));
        let failure = match outcome {
            Ok(Ok(value)) => return value,
            Ok(Err(e)) => e.to_string(),
            Err(payload) => format!("panicked: {}", panic_message(&payload)),
        };
        log::error!(
            "rank {} of {} failed: {failure}",
            world.rank(),
            world.world_size()
        );
        world.abort(1)
    }
}

impl Accelerator {
    /// A rank's environment: its device, and the world its collectives use, made from the
    /// host world (`ThreadComm` or `MpiWorld`) the launch set up.
    fn rank_env(&self, host: Arc<dyn Collective>, device: Device) -> Result<RankEnv> {
        let mut world = self.device_world(host, &device)?;
        if let Some(WorldLayer(wrap)) = &self.layer {
            world = wrap(world);
        }
        Ok(RankEnv {
            rank: world.rank(),
            world_size: world.world_size(),
            world,
            device,
        })
    }

    /// NCCL for ranks on distinct GPUs (the `nccl` feature); the host world otherwise.
    fn device_world(
        &self,
        host: Arc<dyn Collective>,
        device: &Device,
    ) -> Result<Arc<dyn Collective>> {
        let distinct_gpus = NcclWorld::ENABLED
            && device.is_cuda()
            && (self.devices.len() < 2 || !self.devices[0].same_device(&self.devices[1]));
        match distinct_gpus {
            true => Ok(Arc::new(NcclWorld::new(host, device)?)),
            false => Ok(host),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_accelerator_leaves_the_process_settings_alone() {
        let before = std::env::var_os("CANDLE_NUM_THREADS");
        let threads = Accelerator::cpu(2)
            .unwrap()
            .with_thread_budget(ThreadBudget::PerRank(1))
            .launch(|_| Ok::<_, Error>(rayon::current_num_threads()));
        let threads: Vec<usize> = threads.into_iter().map(|t| t.unwrap()).collect();
        assert_eq!(threads, [1, 1], "each rank in its budgeted pool");
        assert_eq!(std::env::var_os("CANDLE_NUM_THREADS"), before);
    }
}
