//! Which launcher started this process, read from its environment.
//!
//! Launching is apart from strategy, as in Lightning: either this process runs every rank
//! as a thread (no launcher), or a launcher (`mpirun`, `srun`) started one process per rank
//! and this process is one of them. This module only reads the environment; the world the
//! processes form is set up by [`crate::Accelerator`].

use wick_core::Error;

/// A launcher that starts one process per rank.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Launcher {
    /// Open MPI's `mpirun` / `mpiexec` (`OMPI_COMM_WORLD_*`, or `PMIX_RANK`).
    Mpirun,
    /// SLURM's `srun` (`SLURM_PROCID`, `SLURM_NTASKS`, `SLURM_LOCALID`).
    Srun,
}

impl Launcher {
    /// The launcher's command name, for messages.
    pub fn name(self) -> &'static str {
        match self {
            Launcher::Mpirun => "mpirun",
            Launcher::Srun => "srun",
        }
    }
}

/// This process's place in a world a launcher started, as its environment says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LaunchEnv {
    /// Who started the process.
    pub launcher: Launcher,
    /// This process's rank.
    pub rank: usize,
    /// The number of processes, where the environment says (PMIx alone does not).
    pub world_size: Option<usize>,
    /// This process's rank among those on its host.
    pub local_rank: usize,
}

impl LaunchEnv {
    /// Reads the launcher from this process's environment; `None` when none started it.
    pub fn detect() -> Result<Option<Self>, Error> {
        Self::from_vars(|name| std::env::var(name).ok())
    }

    /// Reads the launcher from the variables `var` returns (the environment, or a test's).
    /// mpirun's variables win over SLURM's: mpirun inside a SLURM allocation sees both.
    pub fn from_vars(var: impl Fn(&str) -> Option<String>) -> Result<Option<Self>, Error> {
        let number = |name: &str| -> Result<Option<usize>, Error> {
            var(name)
                .map(|v| {
                    v.trim().parse::<usize>().map_err(|_| {
                        Error::config(
                            "launcher environment",
                            format!("{name}={v:?} is not a non-negative integer"),
                        )
                    })
                })
                .transpose()
        };
        let found = if let Some(rank) = number("OMPI_COMM_WORLD_RANK")? {
            Some((Launcher::Mpirun, rank, number("OMPI_COMM_WORLD_SIZE")?, {
                number("OMPI_COMM_WORLD_LOCAL_RANK")?
            }))
        } else if let Some(rank) = number("PMIX_RANK")? {
            Some((Launcher::Mpirun, rank, None, None))
        } else if let (Some(rank), Some(size)) = (number("SLURM_PROCID")?, number("SLURM_NTASKS")?)
        {
            Some((Launcher::Srun, rank, Some(size), number("SLURM_LOCALID")?))
        } else {
            None
        };
        let Some((launcher, rank, world_size, local_rank)) = found else {
            return Ok(None);
        };
        if let Some(size) = world_size.filter(|&s| rank >= s) {
            return Err(Error::config(
                "launcher environment",
                format!("{} says rank {rank} of a world of {size}", launcher.name()),
            ));
        }
        Ok(Some(LaunchEnv {
            launcher,
            rank,
            world_size,
            local_rank: local_rank.unwrap_or(0),
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(pairs: &[(&str, &str)]) -> Result<Option<LaunchEnv>, Error> {
        LaunchEnv::from_vars(|name| {
            pairs
                .iter()
                .find(|(k, _)| *k == name)
                .map(|(_, v)| v.to_string())
        })
    }

    #[test]
    fn no_launcher_is_none() {
        assert_eq!(env(&[("HOME", "/root")]).unwrap(), None);
    }

    #[test]
    fn mpirun_and_srun_are_read_and_mpirun_wins() {
        let mpirun = [
            ("OMPI_COMM_WORLD_RANK", "3"),
            ("OMPI_COMM_WORLD_SIZE", "4"),
            ("OMPI_COMM_WORLD_LOCAL_RANK", "1"),
        ];
        let slurm = [
            ("SLURM_PROCID", "0"),
            ("SLURM_NTASKS", "2"),
            ("SLURM_LOCALID", "0"),
        ];
        let want = LaunchEnv {
            launcher: Launcher::Mpirun,
            rank: 3,
            world_size: Some(4),
            local_rank: 1,
        };
        assert_eq!(env(&mpirun).unwrap(), Some(want.clone()));
        let both: Vec<_> = mpirun.iter().chain(&slurm).copied().collect();
        assert_eq!(env(&both).unwrap(), Some(want));
        assert_eq!(
            env(&slurm).unwrap(),
            Some(LaunchEnv {
                launcher: Launcher::Srun,
                rank: 0,
                world_size: Some(2),
                local_rank: 0
            })
        );
        let pmix = env(&[("PMIX_RANK", "1")]).unwrap().unwrap();
        assert_eq!(
            (pmix.launcher, pmix.rank, pmix.world_size),
            (Launcher::Mpirun, 1, None)
        );
    }

    #[test]
    fn bad_values_name_the_variable() {
        let e = env(&[("OMPI_COMM_WORLD_RANK", "x")])
            .unwrap_err()
            .to_string();
        assert!(e.contains("OMPI_COMM_WORLD_RANK=\"x\""), "{e}");
        let e = env(&[("SLURM_PROCID", "5"), ("SLURM_NTASKS", "2")])
            .unwrap_err()
            .to_string();
        assert!(e.contains("srun says rank 5 of a world of 2"), "{e}");
    }
}
