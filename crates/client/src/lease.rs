//! The client's side of its lease (docs/protocol.md §4.4): a client that has heard nothing
//! from the server for `CLIENT_LEASE_MS` drops every right it holds, before the server can
//! have fenced it and let other clients change what it held. Time is passed in: the
//! connection core (`conn`) calls `heard` on every byte it takes in and `check` whenever
//! it is woken, which its driver does at `deadline` at the latest.

use std::time::{Duration, Instant};

use crest_proto::timing::{CLIENT_LEASE_MS, DISCONNECTED_FENCE_MS};

/// How long the client trusts its rights without a word from the server.
pub const CLIENT_LEASE: Duration = Duration::from_millis(CLIENT_LEASE_MS);

/// How late a driver may wake the core past the lease's deadline (crest-net wakes it on
/// time; the simulator every 250 ms): rights go at most this long after `CLIENT_LEASE`
/// (2.5 s + 0.25 s), still inside the server's fencing delay.
pub const LEASE_CHECK: Duration = Duration::from_millis(250);
const _: () = assert!(CLIENT_LEASE_MS + LEASE_CHECK.as_millis() as u64 <= DISCONNECTED_FENCE_MS);

/// When the server was last heard from, and whether the rights were dropped for it.
#[derive(Debug)]
pub struct Lease {
    last_heard: Instant,
    expired: bool,
}

impl Lease {
    /// A lease that starts at `now` (a new connection attempt counts as a word).
    pub fn new(now: Instant) -> Lease {
        Lease { last_heard: now, expired: false }
    }

    /// The server said something at `now`.
    pub fn heard(&mut self, now: Instant) {
        self.last_heard = self.last_heard.max(now);
        self.expired = false;
    }

    /// When `check` next has something to say (none: the rights are dropped already and
    /// nothing was heard since).
    pub fn deadline(&self) -> Option<Instant> {
        (!self.expired).then(|| self.last_heard + CLIENT_LEASE)
    }

    /// True once, when the lease has run out by `now`: the caller drops every right.
    pub fn check(&mut self, now: Instant) -> bool {
        if self.expired || now.saturating_duration_since(self.last_heard) < CLIENT_LEASE {
            return false;
        }
        self.expired = true;
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rights_go_once_when_the_server_is_silent_for_the_lease() {
        let t0 = Instant::now();
        let at = |ms: u64| t0 + Duration::from_millis(ms);
        let mut l = Lease::new(t0);
        assert!(!l.check(at(CLIENT_LEASE_MS - 1)));
        l.heard(at(1_000));
        assert!(!l.check(at(CLIENT_LEASE_MS + 999)), "a word renews it");
        assert!(l.check(at(CLIENT_LEASE_MS + 1_000)), "silent for the lease: drop the rights");
        assert!(!l.check(at(CLIENT_LEASE_MS + 5_000)), "told once");
        l.heard(at(9_000));
        assert!(!l.check(at(9_000 + CLIENT_LEASE_MS - 1)));
        assert!(l.check(at(9_000 + CLIENT_LEASE_MS)), "and again after the next silence");
        // A late word from before the last one does not move the lease back.
        l.heard(at(20_000));
        l.heard(at(19_000));
        assert!(!l.check(at(20_000 + CLIENT_LEASE_MS - 1)));
    }
}
