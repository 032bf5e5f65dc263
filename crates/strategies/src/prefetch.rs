//! All-gather prefetch for full sharding: while one unit computes, a background thread
//! gathers the next one (the next in forward, the previous in backward).
//!
//! The background gathers run on a world split from the rank's world, so they never share
//! the foreground's call slots; every rank requests the same units in the same order (the
//! graph is the same), which keeps the background channel in lockstep too.

use candle_core::{DType, Result, Tensor};
use std::collections::HashMap;
use std::sync::mpsc::{channel, Receiver, Sender};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use wick_core::Collective;

struct Job {
    shard: Tensor,
    padded: usize,
    reply: Sender<std::result::Result<Tensor, String>>,
}

/// One rank's prefetch thread and the gathers it has in flight.
pub(crate) struct Prefetcher {
    jobs: Mutex<Option<Sender<Job>>>,
    pending: Mutex<HashMap<usize, Receiver<std::result::Result<Tensor, String>>>>,
    /// Each unit's shard and padded length, by unit index.
    units: Vec<(Tensor, usize)>,
    worker: Mutex<Option<JoinHandle<()>>>,
}

impl Prefetcher {
    /// Starts the thread; it gathers over `channel` in `dtype`.
    pub(crate) fn start(
        channel: Arc<dyn Collective>,
        units: Vec<(Tensor, usize)>,
        dtype: DType,
    ) -> Self {
        let (jobs, inbox) = channel_pair();
        let worker = std::thread::Builder::new()
            .name(format!("wick-prefetch-{}", channel.rank()))
            .spawn(move || {
                for job in inbox {
                    let gathered = gather(channel.as_ref(), &job.shard, job.padded, dtype)
                        .map_err(|e| e.to_string());
                    let _ = job.reply.send(gathered);
                }
            })
            .expect("spawning the prefetch thread");
        Prefetcher {
            jobs: Mutex::new(Some(jobs)),
            pending: Mutex::default(),
            units,
            worker: Mutex::new(Some(worker)),
        }
    }

    /// Starts gathering `unit` in the background, unless it is out of range or already asked for.
    pub(crate) fn request(&self, unit: usize) {
        let Some((shard, padded)) = self.units.get(unit) else {
            return;
        };
        let mut pending = self.pending.lock().unwrap_or_else(|p| p.into_inner());
        if pending.contains_key(&unit) {
            return;
        }
        let (reply, answer) = channel();
        let jobs = self.jobs.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(jobs) = jobs.as_ref() {
            if jobs
                .send(Job {
                    shard: shard.clone(),
                    padded: *padded,
                    reply,
                })
                .is_ok()
            {
                pending.insert(unit, answer);
            }
        }
    }

    /// The gathered buffer of `unit` if it was prefetched (waiting for it if still in flight).
    pub(crate) fn take(&self, unit: usize) -> Option<Result<Tensor>> {
        let answer = self
            .pending
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&unit)?;
        Some(match answer.recv() {
            Ok(Ok(t)) => Ok(t),
            Ok(Err(e)) => Err(candle_core::Error::Msg(e)),
            Err(_) => Err(candle_core::Error::Msg(
                "the prefetch thread stopped".into(),
            )),
        })
    }

    /// Waits for every gather in flight and drops the results (before the shards change).
    pub(crate) fn drain(&self) {
        let pending: Vec<_> = self
            .pending
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .drain()
            .collect();
        for (_, answer) in pending {
            let _ = answer.recv();
        }
    }
}

impl Drop for Prefetcher {
    fn drop(&mut self) {
        self.drain();
        self.jobs.lock().unwrap_or_else(|p| p.into_inner()).take();
        if let Some(worker) = self.worker.lock().unwrap_or_else(|p| p.into_inner()).take() {
            let _ = worker.join();
        }
    }
}

fn channel_pair() -> (Sender<Job>, Receiver<Job>) {
    channel()
}

/// The full flat buffer of a unit: every rank's shard, in `dtype`.
pub(crate) fn gather(
    world: &dyn Collective,
    shard: &Tensor,
    padded: usize,
    dtype: DType,
) -> Result<Tensor> {
    let full = Tensor::zeros(padded, dtype, shard.device())?;
    let shard = shard.contiguous()?.to_dtype(dtype)?;
    world
        .all_gather_into(&shard, &full)
        .map_err(candle_core::Error::wrap)?;
    Ok(full)
}
