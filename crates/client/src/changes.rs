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

    mod through_the_name_cache {
        use crate::names::NameCache;
        use crest_proto as p;
        use std::time::{Duration, Instant};

        fn attr(ino: u64, size: u64) -> p::Attr {
            let kind = if ino < 10 { p::FileType::Directory } else { p::FileType::Regular };
            p::Attr { size_bytes: size, ..crate::names::tests::attr(ino, kind) }
        }

        fn item(name: &str, ino: u64) -> p::DirItem {
            p::DirItem { attr: attr(ino, 1), ..crate::names::tests::item(name, ino) }
        }

        /// Directory 1 holds a → 10, b → 11; directory 2 is empty; 99 is held too.
        fn cache(now: Instant) -> NameCache {
            let mut c = NameCache::new(Duration::from_secs(60));
            c.absorb_listing(1, &[item("a", 10), item("b", 11)], c.epoch(), now);
            c.absorb_listing(2, &[], c.epoch(), now);
            for i in [1, 2, 99] {
                c.hold_attr(&attr(i, 1), c.epoch(), now);
            }
            c
        }

        #[test]
        fn each_change_refuses_replies_about_what_it_touched_and_only_that() {
            let now = Instant::now();
            type Change = fn(&mut NameCache, Instant);
            let changes: [(&str, Change, &[u64]); 10] = [
                ("create", |c, now| c.added(1, b"c", &attr(12, 1), now), &[1, 12]),
                ("unlink", |c, _| c.unlinked(1, b"a", Some(10)), &[1, 10]),
                ("remove", |c, _| c.removed(1, b"b"), &[1, 11]),
                ("rename", |c, now| c.renamed(1, b"a", 2, b"x", &attr(10, 1), None, now), &[1, 2, 10]),
                ("rename over", |c, now| c.renamed(1, b"a", 1, b"b", &attr(10, 1), None, now), &[1, 10, 11]),
                ("writeback", |c, now| c.set_attr(&attr(11, 5), now), &[11]),
                ("answered", |c, _| c.attr_changed(&attr(11, 5)), &[11]),
                ("recall", |c, _| c.recalled(10), &[10]),
                ("stale", |c, _| c.attr_stale(10), &[10]),
                ("remove unknown", |c, _| c.removed(1, b"zz"), &[1, 2, 10, 11, 12, 99]),
            ];
            for (what, change, touched) in changes {
                let mut c = cache(now);
                let e = c.epoch();
                change(&mut c, now);
                for ino in [1, 2, 10, 11, 12, 99] {
                    c.hold_attr(&attr(ino, 777), e, now);
                    let taken = c.attr(ino, now).is_some_and(|a| a.size_bytes == 777);
                    assert_eq!(taken, !touched.contains(&ino), "{what}: reply about {ino}");
                }
            }
            let mut c = cache(now);
            let e = c.epoch();
            c.clear();
            c.hold_attr(&attr(99, 777), e, now);
            assert!(c.attr(99, now).is_none_or(|a| a.size_bytes != 777), "clear: everything");
        }

        #[test]
        fn a_stretch_is_refused_when_its_directory_changed_and_leaves_out_changed_inodes() {
            let now = Instant::now();
            let mut c = cache(now);
            let e = c.epoch();
            c.set_attr(&attr(21, 5), now);
            c.added(4, b"new", &attr(30, 1), now);
            let leaf = |items| p::DirLeaf { hash_lo: 0, hash_hi: u64::MAX, items };
            c.absorb_leaf(3, &leaf(vec![item("p", 20), item("q", 21)]), e, now);
            assert!(matches!(c.lookup(3, b"p", now), Some(crate::Cached::Found(a)) if a.ino == 20));
            assert!(
                matches!(c.lookup(3, b"q", now), Some(crate::Cached::Found(a)) if a.size_bytes == 5),
                "21 changed since: the stretch's older attributes of it are left out"
            );
            assert!(matches!(c.lookup(3, b"nope", now), Some(crate::Cached::Absent)));
            c.absorb_leaf(4, &leaf(vec![item("r", 22)]), e, now);
            assert!(c.lookup(4, b"r", now).is_none() && c.lookup(4, b"nope", now).is_none(), "4 changed since");
        }
    }

    #[test]
    fn forgotten_changes_refuse_older_fetches_whole() {
        // Seeded and printed: how many changes, and which inodes.
        let seed: u64 =
            std::env::var("CREST_CHANGES_SEED").ok().and_then(|s| s.parse().ok()).unwrap_or_else(crest_rng::next_u64);
        eprintln!("CREST_CHANGES_SEED={seed}");
        let mut rng = crest_rng::Stream::from_seed_u64(seed);
        let mut next = |n: u64| rng.below(n);
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
