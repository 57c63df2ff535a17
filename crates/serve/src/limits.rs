//! What one peer may hold: connections not yet through their hello, per address (so a
//! flood of idle or slow handshakes from one place leaves room for everyone else), and
//! connections per client identity (certificate). A connection over a limit is closed at
//! once; a session whose connection stays silent past `IDLE_TIMEOUT` is disconnected
//! (clients send a heartbeat every second).

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crest_tls::Fingerprint;

/// Connections from one address that have not said hello (or joined) yet.
pub const MAX_UNAUTHENTICATED_PER_ADDRESS: usize = 64;
/// Connections of one client certificate at once (a mount holds one).
pub const MAX_CONNECTIONS_PER_IDENTITY: usize = crest_server::MAX_SESSIONS_PER_IDENTITY;
/// A session's connection silent this long is closed.
pub const IDLE_TIMEOUT: Duration = Duration::from_secs(60);

/// What a count is kept for.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Key {
    /// Connections from an address before their hello.
    Address(IpAddr),
    /// Connections of a certificate.
    Identity(Fingerprint),
}

/// Live counts, shared by the connections.
#[derive(Clone, Default)]
pub struct Counters {
    counts: Arc<Mutex<HashMap<Key, usize>>>,
}

/// One counted connection; the count drops with it.
pub struct Slot {
    counts: Arc<Mutex<HashMap<Key, usize>>>,
    key: Key,
}

impl Counters {
    /// A slot under `key`, unless `max` are taken.
    pub fn take(&self, key: Key, max: usize) -> Option<Slot> {
        let mut counts = self.counts.lock().unwrap_or_else(|e| e.into_inner());
        let n = counts.entry(key).or_insert(0);
        if *n >= max {
            return None;
        }
        *n += 1;
        Some(Slot { counts: self.counts.clone(), key })
    }

    /// How many slots `key` holds.
    pub fn held(&self, key: Key) -> usize {
        self.counts.lock().unwrap_or_else(|e| e.into_inner()).get(&key).copied().unwrap_or(0)
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        let mut counts = self.counts.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(n) = counts.get_mut(&self.key) {
            *n -= 1;
            if *n == 0 {
                counts.remove(&self.key);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slots_are_counted_and_given_back() {
        let c = Counters::default();
        let k = Key::Address(IpAddr::from([10, 0, 0, 1]));
        let other = Key::Address(IpAddr::from([10, 0, 0, 2]));
        let held: Vec<Slot> = (0..3).map(|_| c.take(k, 3).expect("room")).collect();
        assert!(c.take(k, 3).is_none(), "full");
        assert!(c.take(other, 3).is_some(), "another address has its own room");
        drop(held);
        assert_eq!(c.held(k), 0);
        assert!(c.take(k, 3).is_some());
    }
}
