//! crest's client core, sans-I/O: the state a mount keeps and the rules it applies,
//! with no runtime, no FUSE and no socket (FUSE → **client** → net → proto → serve →
//! server → store). The FUSE adapter (`crest-fuse`) and the connection driver
//! (`crest-net`) call into it and do the I/O.
//!
//! It holds:
//! - `conn`: the client's side of a session (`Connection`): calls and their answers,
//!   writeback batching, fencing, the lease, the handshake and what goes again after a
//!   reconnect or a server restart. The driver (`crest-net`) moves its bytes and timers;
//! - `names`: the name and attribute cache, with the rights and tombstones that say what
//!   a mount may answer without a round trip;
//! - `replay`: the acknowledged changes kept for replay after a server restart, and the
//!   plan for the calls pending then;
//! - `held`: the session's own locks and open handles, and the requests that take them
//!   again after a restart;
//! - `lease`: when the client stops trusting its rights without a word from the server;
//! - `batch`: what may join a batch of writeback calls (joined writes, cancelled pairs);
//! - `local`: what a kernel call may answer without a round trip, the cache change it
//!   makes and the writeback it sends behind the answer, and how that writeback settles;
//! - `rights`: the `Rights` hook that keeps the cache in step with the session.
//!
//! The FUSE adapter keeps only what needs the kernel: translating its calls, and telling
//! it what to forget before a recall is answered (which entries and attributes the cache
//! decides: `NameCache::take_kernel_invalidations`).

pub mod batch;
mod changes;
pub mod conn;
pub mod held;
pub mod lease;
pub mod local;
pub mod names;
pub mod replay;
pub mod rights;
mod tombstones;

pub use names::*;
