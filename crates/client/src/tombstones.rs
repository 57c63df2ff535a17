//! Recalls remembered for a while (`TOMBSTONE_LIFETIME`): a grant or attributes in a reply
//! to a request sent before the recall of what it names came are stale (`NameCache`).
//!
//! A mount working beside others in a big directory is recalled thousands of inodes a
//! second, each leaving a tombstone, so the cost per recall must not grow with how many
//! are remembered: they are kept in the order they were made, and the expired ones are
//! taken from the front as new ones come (amortised O(1) each).

use std::collections::{HashMap, VecDeque};
use std::time::{Duration, Instant};

/// How long a recall is remembered against a grant that raced with it (far longer than a
/// response can be held back by the server: `RECALL_TIMEOUT_MS`, 2 s).
pub const TOMBSTONE_LIFETIME: Duration = Duration::from_secs(10);

#[derive(Debug, Default)]
pub(crate) struct Tombstones {
    /// Inode → its latest recall.
    at: HashMap<u64, Instant>,
    /// Every recall still remembered, oldest first; an inode recalled again has an older
    /// pair here too, which no longer matches `at` and goes without touching it.
    order: VecDeque<(Instant, u64)>,
    /// Pairs looked at by `purge` (tests: its work stays linear in the recalls).
    #[cfg(test)]
    pub(crate) examined: usize,
}

impl Tombstones {
    /// `ino` was recalled at `now`.
    pub(crate) fn insert(&mut self, ino: u64, now: Instant) {
        self.purge(now);
        self.at.insert(ino, now);
        self.order.push_back((now, ino));
    }

    /// True when `ino` was recalled at or after `sent` (and that is still remembered).
    pub(crate) fn since(&self, ino: u64, sent: Instant) -> bool {
        self.at.get(&ino).is_some_and(|&at| at >= sent)
    }

    /// Inodes whose recall is remembered.
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.at.len()
    }

    /// Forgets recalls older than the lifetime. Stops at the first younger one: times come
    /// from the caller and are not promised to be monotonic, so one out of order only
    /// keeps those behind it a little longer.
    fn purge(&mut self, now: Instant) {
        while let Some(&(t, ino)) = self.order.front() {
            #[cfg(test)]
            {
                self.examined += 1;
            }
            if now.saturating_duration_since(t) < TOMBSTONE_LIFETIME {
                break;
            }
            self.order.pop_front();
            if self.at.get(&ino) == Some(&t) {
                self.at.remove(&ino);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_recall_is_remembered_for_its_lifetime_and_then_forgotten() {
        let t0 = Instant::now();
        let mut t = Tombstones::default();
        t.insert(7, t0);
        assert!(t.since(7, t0), "a request sent at the recall's instant is stale");
        assert!(!t.since(7, t0 + Duration::from_millis(1)), "one sent after it is not");
        assert!(!t.since(8, t0), "another inode has no tombstone");
        // Recalled again later: the newer time counts, and the older pair going does not
        // take the tombstone with it.
        let t1 = t0 + Duration::from_secs(6);
        t.insert(7, t1);
        t.insert(9, t0 + TOMBSTONE_LIFETIME + Duration::from_secs(1));
        assert!(t.since(7, t1), "the second recall of 7 outlives the first one's lifetime");
        assert_eq!(t.len(), 2);
        t.insert(10, t1 + TOMBSTONE_LIFETIME);
        assert!(!t.since(7, t0), "7 is forgotten a lifetime after its last recall");
        assert_eq!(t.len(), 2, "only 9 and 10 are left");
    }

    #[test]
    fn remembering_many_recalls_costs_linear_work() {
        // Every insert within one lifetime: nothing can go, and each insert must still look
        // at no more than the front. (Scanning every tombstone once there were a few
        // thousand made each recall O(n) and a busy shared directory quadratic.)
        let t0 = Instant::now();
        let mut t = Tombstones::default();
        let n = 50_000u64;
        for i in 0..n {
            t.insert(i % 20_000, t0 + Duration::from_micros(i));
        }
        assert_eq!(t.len(), 20_000);
        assert!(t.examined <= 2 * n as usize, "examined {} pairs for {n} recalls", t.examined);
        // A lifetime later, one insert drops them all (and their duplicates), once.
        let before = t.examined;
        t.insert(1, t0 + TOMBSTONE_LIFETIME + Duration::from_secs(1));
        assert_eq!(t.len(), 1);
        assert!(t.examined - before <= n as usize + 1);
    }
}
