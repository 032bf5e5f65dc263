//! Ranks as threads of one process: the world (`world.rs`), what its ranks share
//! (`shared.rs`), one rank's collectives (`comm.rs`) and the barrier between calls.

mod barrier;
mod comm;
mod shared;
mod world;

pub use comm::ThreadComm;
pub(crate) use world::panic_message;
pub use world::{RankError, ThreadWorld};
