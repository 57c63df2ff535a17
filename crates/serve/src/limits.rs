//! What one peer may hold: connections not yet through their hello, per address (so a
//! flood of idle or slow handshakes from one place leaves room for everyone else), and
//! connections per client identity (certificate). A connection over a limit is closed at
//! once; a session whose connection stays silent past `IDLE_TIMEOUT` is disconnected
//! (clients send a heartbeat every second).

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

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

/// Log lines about refused or failed connections: at most `REFUSALS_SHOWN` a window of
/// `REFUSALS_WINDOW`, then one line saying how many were left out. Anyone who reaches the
/// port can be refused as fast as they connect; the log must not grow as fast.
pub struct Quiet {
    state: Mutex<QuietState>,
}

struct QuietState {
    window_start: Option<Instant>,
    shown: u32,
    left_out: u64,
}

/// Refusals logged in one window.
pub const REFUSALS_SHOWN: u32 = 20;
/// The window.
pub const REFUSALS_WINDOW: Duration = Duration::from_secs(10);

/// What the caller is to log.
#[derive(Debug, PartialEq, Eq)]
pub enum Shown {
    /// This line, after a line saying that `0` were left out since the last one shown
    /// (none when 0).
    Line(u64),
    /// Nothing: counted, to be told later.
    LeftOut,
}

impl Quiet {
    /// A limiter with nothing shown yet.
    pub const fn new() -> Quiet {
        Quiet { state: Mutex::new(QuietState { window_start: None, shown: 0, left_out: 0 }) }
    }

    /// Whether a line at `now` is shown.
    pub fn line(&self, now: Instant) -> Shown {
        let mut s = self.state.lock().unwrap_or_else(|e| e.into_inner());
        if s.window_start.is_none_or(|start| now.saturating_duration_since(start) >= REFUSALS_WINDOW) {
            s.window_start = Some(now);
            s.shown = 0;
        }
        if s.shown >= REFUSALS_SHOWN {
            s.left_out += 1;
            return Shown::LeftOut;
        }
        s.shown += 1;
        Shown::Line(std::mem::take(&mut s.left_out))
    }
}

impl Default for Quiet {
    fn default() -> Quiet {
        Quiet::new()
    }
}

/// The limiter of the server's refusal lines.
pub static REFUSALS: Quiet = Quiet::new();

/// Logs a refusal (`tracing::warn!`) unless too many were logged lately.
macro_rules! refusal {
    ($($arg:tt)*) => {
        match $crate::limits::REFUSALS.line(std::time::Instant::now()) {
            $crate::limits::Shown::LeftOut => {}
            $crate::limits::Shown::Line(left_out) => {
                if left_out > 0 {
                    tracing::warn!("{left_out} more refused or failed connections were not logged");
                }
                tracing::warn!($($arg)*);
            }
        }
    };
}
pub(crate) use refusal;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refusal_lines_are_bounded_per_window_and_the_rest_counted() {
        let q = Quiet::new();
        let t0 = Instant::now();
        for i in 0..REFUSALS_SHOWN {
            assert_eq!(q.line(t0 + Duration::from_millis(u64::from(i))), Shown::Line(0));
        }
        for _ in 0..1000 {
            assert_eq!(q.line(t0 + Duration::from_secs(1)), Shown::LeftOut);
        }
        assert_eq!(q.line(t0 + REFUSALS_WINDOW), Shown::Line(1000), "the next window says how many were left out");
        assert_eq!(q.line(t0 + REFUSALS_WINDOW), Shown::Line(0));
    }

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
