//! Which inodes changed through this mount since a fetch was sent (`NameCache`'s epochs).
//!
//! A fetch (lookup, listing, getattr, read-ahead) takes the epoch before it is sent; its
//! reply may describe an inode as it was before a change this mount made or learnt of
//! meanwhile (a create, a writeback answered here, a recall), and must not then be taken
//! in. Refusing every reply when anything at all changed is safe, but a reader whose own
//! reads change access times (a shared file's atime goes to the server, and the held
//! attributes go stale) would then never keep what it fetched ahead: so each change
//! names the inodes it touched, and a reply is refused only for those.
//!
//! Invariants:
//! - `current(e, inos)` is false if any of `inos` changed (`bump`), or everything did
//!   (`bump_all`), after `epoch()` returned `e`;
//! - what is remembered is bounded (`MAX_REMEMBERED`): the oldest changes are forgotten,
//!   and replies to fetches sent before them are then refused whole (`floor`).

use std::collections::{HashMap, VecDeque};

/// A mutation epoch: taken before a fetch, handed back with its reply.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Epoch(pub(crate) u64);

/// Most changes remembered one by one.
const MAX_REMEMBERED: usize = 4096;

/// The changes made since fetches were sent.
#[derive(Debug, Default)]
pub(crate) struct Changes {
    epoch: u64,
    /// Inode → the epoch of its last change.
    last: HashMap<u64, u64>,
    /// The changes remembered, oldest first (an inode changed again appears again).
    order: VecDeque<(u64, u64)>,
    /// Replies to fetches sent before this epoch are refused whole.
    floor: u64,
}

impl Changes {
    /// The epoch to hand back with the reply of a fetch sent now.
    pub(crate) fn epoch(&self) -> Epoch {
        Epoch(self.epoch)
    }

    /// `inos` changed (their attributes, or a directory's names).
    pub(crate) fn bump(&mut self, inos: impl IntoIterator<Item = u64>) {
        self.epoch += 1;
        for ino in inos {
            self.last.insert(ino, self.epoch);
            self.order.push_back((ino, self.epoch));
        }
        while self.order.len() > MAX_REMEMBERED {
            let Some((ino, at)) = self.order.pop_front() else { break };
            if self.last.get(&ino) == Some(&at) {
                self.last.remove(&ino);
            }
            self.floor = self.floor.max(at);
        }
    }

    /// Anything may have changed.
    pub(crate) fn bump_all(&mut self) {
        self.epoch += 1;
        self.floor = self.epoch;
        self.last.clear();
        self.order.clear();
    }

    /// Whether a reply to a fetch sent at `epoch` may be taken in for `inos`: none of them
    /// changed since.
    pub(crate) fn current(&self, epoch: Epoch, inos: impl IntoIterator<Item = u64>) -> bool {
        epoch.0 >= self.floor && inos.into_iter().all(|i| self.last.get(&i).is_none_or(|&at| at <= epoch.0))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_reply_is_refused_for_what_changed_after_its_fetch_only() {
        let mut c = Changes::default();
        c.bump([1]);
        let e = c.epoch();
        assert!(c.current(e, [1, 2]), "1 changed before the fetch");
        c.bump([2]);
        assert!(!c.current(e, [1, 2]) && !c.current(e, [2]));
        assert!(c.current(e, [1, 3]));
        assert!(c.current(c.epoch(), [2]), "a fetch sent after the change");
        c.bump_all();
        assert!(!c.current(e, [1]) && !c.current(e, []), "everything changed");
        assert!(c.current(c.epoch(), [1, 2]));
    }

    #[test]
    fn forgotten_changes_refuse_older_fetches_whole() {
        // Seeded and printed: how many changes, and which inodes.
        let seed: u64 = std::env::var("CREST_CHANGES_SEED").ok().and_then(|s| s.parse().ok()).unwrap_or_else(|| {
            std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(1, |d| d.as_nanos() as u64)
        });
        eprintln!("CREST_CHANGES_SEED={seed}");
        let mut x = seed | 1;
        let mut next = |n: u64| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x % n
        };
        let mut c = Changes::default();
        // A model: every change ever made, with its epoch.
        let mut all: Vec<(u64, u64)> = Vec::new();
        let mut fetches = Vec::new();
        for _ in 0..3 * MAX_REMEMBERED + next(5000) as usize {
            if next(10) == 0 {
                fetches.push(c.epoch());
            }
            let inos: Vec<u64> = (0..next(4)).map(|_| next(3000)).collect();
            c.bump(inos.iter().copied());
            all.extend(inos.iter().map(|&i| (i, c.epoch().0)));
            assert!(c.last.len() <= MAX_REMEMBERED + 4 && c.order.len() <= MAX_REMEMBERED);
        }
        for e in fetches {
            for _ in 0..20 {
                let ino = next(3000);
                let changed_since = all.iter().any(|&(i, at)| i == ino && at > e.0);
                // Never taken in when it changed; refused only when too old to tell.
                assert!(!(changed_since && c.current(e, [ino])), "seed {seed}: {ino} changed after {e:?}");
                if !changed_since && e.0 >= c.floor {
                    assert!(c.current(e, [ino]), "seed {seed}: {ino} refused at {e:?}");
                }
            }
        }
    }
}
