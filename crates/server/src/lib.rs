//! The server core: the step between the wire and the store on the data path
//! (net → proto → serve → **server** → store). It owns the `Store`, keeps one session
//! per client mount with a reply cache, and turns protocol operations into store calls.
//! It does no I/O and reads no clock: the async shell (`crest-serve`) hands it decoded
//! messages and the time, and sends back what it returns.
//!
//! Invariants:
//! - a request id that a session already completed is answered from the reply cache,
//!   never applied twice (exactly-once for retried creates, renames, unlinks);
//! - each session's reply cache knows its last `REPLY_CACHE_ENTRIES` changes (clients
//!   never have more requests than that in flight) and keeps their responses whole up to
//!   `REPLY_CACHE_BYTES`: a retry of an older one is answered EIO, never applied again;
//! - a response fits in one frame: a reply that would not is refused with E2BIG;
//! - every store error becomes an errno plus a message at this edge;
//! - a session's locks (`locks`) and rights go when it ends or is fenced (silent
//!   `caps::LEASE_MS`, disconnected `caps::DISCONNECTED_FENCE_MS`, or sitting on an
//!   exclusive recall a lease long): a dead client never blocks others for longer, and a
//!   fenced session's later requests are refused.

mod acl;
pub mod authz;
pub mod caps;
pub mod contention;
pub mod convert;
pub mod objects;
pub use crest_proto::locks;
pub mod session;
mod space;

pub use caps::Outgoing;
pub use session::{
    AdminStart, Applied, PlannedRead, Server, SessionId, WriteSums, MAX_SESSIONS_PER_IDENTITY, MAX_UNUSED_GRANTED,
    REPLY_CACHE_BYTES, REPLY_CACHE_ENTRIES,
};

/// Entry points for the fuzz targets (fuzz/): decoders of what the disk holds.
#[doc(hidden)]
pub mod fuzzing {
    /// Decodes `b` as a session record; a decoded one must encode back to the same bytes
    /// (one written by this version) and name no hole at or above its `seq`.
    pub fn session_record(b: &[u8]) -> bool {
        crate::session::fuzz_record(b)
    }
}
