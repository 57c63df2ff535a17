//! crest's deterministic simulators. Both run the real server core (`crest_server::Server`
//! over a `Store` on a `MemDisk`) and the real client core (`crest_client::conn::Connection`)
//! of every client, on virtual time, every choice drawn from one seed, so a seed replays
//! exactly (`cargo run --release -p crest-sim -- coherence|crash SEED`).
//!
//! - `coherence`: several caching clients under network faults, client crashes and
//!   server crashes just after a commit; every answer checked against a reference model
//!   of the file system, coherence across clients included.
//! - `crash`: clients without caches and a server that crashes anywhere, also between
//!   commits; every answer checked against a server that never crashed.

pub mod coherence;
pub mod crash;
