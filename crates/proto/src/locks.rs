//! Locks held for clients: POSIX byte-range (fcntl) locks and flock locks, enforced across
//! every session (docs/protocol.md §4.6).
//!
//! The table does what the Linux kernel's `posix_lock_file` and `flock_lock_inode` do for
//! one machine, with a *holder* = (session, the client's owner id) in place of the
//! kernel's `fl_owner`:
//! - locks of one holder never conflict with each other; a new lock replaces the holder's
//!   locks where it overlaps them (splitting them), and joins adjacent or overlapping
//!   locks of the same kind into one (so a holder's locks are disjoint and canonical);
//! - read locks of different holders share; a write lock excludes every other holder's
//!   lock on any byte it covers;
//! - flock locks (whole-file) and POSIX locks are separate namespaces that never conflict
//!   with each other, as on Linux;
//! - a request never waits: a conflict is reported at once and changes nothing (except
//!   that a conflicting flock conversion drops the old flock lock first, as Linux's does).
//!   Clients that must wait retry.
//!
//! Nothing here is durable: a server restart forgets every lock, and clients take theirs
//! again in the grace period that follows (each keeps a `LockTable` of its own session's
//! locks for that, in `crest-net`). Shared by both ends, so it lives here: the client
//! links no part of the server.

use std::collections::HashMap;

use crate::{LockInfo, LockKind, LOCK_TO_EOF};

/// A session number (the server's `SessionId`; a client's own table uses 0).
pub type SessionId = u64;

/// Most locks kept on one inode (all holders together). A client that splits a file into
/// more ranges than this gets ENOLCK rather than making every lock operation on the file
/// slow for everyone.
pub const MAX_LOCKS_PER_FILE: usize = 16 * 1024;
/// Most locks one session keeps on one inode: a session that splits a file into ranges
/// leaves the others room on it (ENOLCK past this).
pub const MAX_LOCKS_PER_SESSION_FILE: usize = MAX_LOCKS_PER_FILE / 4;

/// The errno of a conflict (`Refusal::Conflict` on the wire).
pub const EAGAIN: i32 = 11;

/// Who holds a lock. The owner id is the client's (the kernel's lock owner) and is unique
/// only within its session.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Holder {
    /// The client's session.
    pub session: SessionId,
    /// The client's owner id.
    pub owner: u64,
}

/// One lock request: a range, a kind, a namespace.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Request {
    /// Who asks.
    pub holder: Holder,
    /// First byte.
    pub start: u64,
    /// Last byte, inclusive (`LOCK_TO_EOF` for the rest of the file).
    pub end: u64,
    /// Read, write or unlock.
    pub kind: LockKind,
    /// A flock lock rather than a POSIX one.
    pub flock: bool,
    /// The requesting process, reported to `test` callers.
    pub pid: u32,
}

/// Why `set` refused a request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Refusal {
    /// Another holder's lock is in the way (EAGAIN).
    Conflict(LockInfo),
    /// The file already carries `MAX_LOCKS_PER_FILE` locks (ENOLCK).
    TooMany,
}

/// A granted lock.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Held {
    holder: Holder,
    start: u64,
    end: u64,
    write: bool,
    flock: bool,
    pid: u32,
}

impl Held {
    fn info(&self) -> LockInfo {
        LockInfo {
            kind: if self.write { LockKind::Write } else { LockKind::Read },
            start: self.start,
            end: self.end,
            pid: self.pid,
        }
    }

    fn overlaps(&self, start: u64, end: u64) -> bool {
        self.start <= end && start <= self.end
    }

    /// True when this lock stands in the way of `holder` taking `write`-or-read on
    /// `start..=end` in namespace `flock`.
    fn blocks(&self, holder: Holder, start: u64, end: u64, write: bool, flock: bool) -> bool {
        self.holder != holder && self.flock == flock && (self.write || write) && self.overlaps(start, end)
    }
}

/// Every lock, by inode.
#[derive(Clone, Debug, Default)]
pub struct LockTable {
    files: HashMap<u64, Vec<Held>>,
}

impl LockTable {
    /// The lock of another holder that would conflict with `holder` taking `kind` on
    /// `start..=end` of `ino` (F_GETLK) — of several, the one that starts first (then ends
    /// first, then by holder), so that the answer does not depend on the order the locks
    /// were taken in, which a server restart changes; `None` when the request would be
    /// granted (and always for `Unlock`).
    pub fn test(
        &self,
        ino: u64,
        holder: Holder,
        start: u64,
        end: u64,
        kind: LockKind,
        flock: bool,
    ) -> Option<LockInfo> {
        let write = match kind {
            LockKind::Read => false,
            LockKind::Write => true,
            LockKind::Unlock => return None,
        };
        self.files
            .get(&ino)?
            .iter()
            .filter(|l| l.blocks(holder, start, end, write, flock))
            .min_by_key(|l| (l.start, l.end, l.holder.session, l.holder.owner))
            .map(Held::info)
    }

    /// Takes, converts or drops a lock on `ino`. Callers check `start <= end`.
    pub fn set(&mut self, ino: u64, req: &Request) -> Result<(), Refusal> {
        let write = match req.kind {
            LockKind::Read => Some(false),
            LockKind::Write => Some(true),
            LockKind::Unlock => None,
        };
        let current = self.files.get(&ino).map_or(&[][..], Vec::as_slice);
        // One look at the file's locks finds a conflict, the holder's locks in this
        // namespace that the request cuts or touches, and how many the session has here.
        // The touched ones are cut, joined with the new lock where neighbours are of one
        // kind, and replaced; the holder's others are disjoint from them and were joined
        // before: they stay where they are, so a lock costs a look at the file's locks,
        // not a copy of them.
        let touches = |l: &Held| {
            l.holder == req.holder
                && l.flock == req.flock
                && (l.overlaps(req.start, req.end)
                    || l.end.checked_add(1) == Some(req.start)
                    || req.end.checked_add(1) == Some(l.start))
        };
        let (mut hit, mut ours, mut conflict) = (Vec::new(), 0, None);
        for (i, l) in current.iter().enumerate() {
            if write.is_some_and(|w| l.blocks(req.holder, req.start, req.end, w, req.flock)) {
                conflict = Some(l.info());
                break;
            }
            ours += usize::from(l.holder.session == req.holder.session);
            if touches(l) {
                hit.push(i);
            }
        }
        if let Some(info) = conflict {
            if req.flock {
                // Linux converts a flock lock by dropping the old one first, even when the
                // new one then cannot be had: two shared holders that both try to upgrade
                // do not deadlock.
                self.drop_where(ino, |l| l.holder == req.holder && l.flock);
            }
            return Err(Refusal::Conflict(info));
        }
        let mut mine = Vec::with_capacity(hit.len() * 2 + 1);
        for &l in hit.iter().map(|&i| &current[i]) {
            if !l.overlaps(req.start, req.end) {
                mine.push(l);
                continue;
            }
            // No underflow or overflow: each branch runs only when the lock reaches past
            // the cut on that side.
            if l.start < req.start {
                mine.push(Held { end: req.start - 1, ..l });
            }
            if l.end > req.end {
                mine.push(Held { start: req.end + 1, ..l });
            }
        }
        if let Some(write) = write {
            mine.push(Held {
                holder: req.holder,
                start: req.start,
                end: req.end,
                write,
                flock: req.flock,
                pid: req.pid,
            });
        }
        // Every join involves the new lock: the joined lock takes its pid.
        mine.sort_unstable_by_key(|l| l.start);
        let mut joined: Vec<Held> = Vec::with_capacity(mine.len());
        for l in mine {
            match joined.last_mut() {
                Some(last) if last.write == l.write && last.end.checked_add(1) == Some(l.start) => {
                    last.end = l.end;
                    last.pid = req.pid;
                }
                _ => joined.push(l),
            }
        }
        let before = current.len();
        let after = before - hit.len() + joined.len();
        let ours_after = ours - hit.len() + joined.len();
        // Only a request that makes the file carry more locks is refused: the unlock of a
        // whole file (at close, at release) always goes through.
        if (after > MAX_LOCKS_PER_FILE || ours_after > MAX_LOCKS_PER_SESSION_FILE) && after > before {
            return Err(Refusal::TooMany);
        }
        if after == 0 {
            self.files.remove(&ino);
            return Ok(());
        }
        let locks = self.files.entry(ino).or_default();
        for &i in hit.iter().rev() {
            locks.swap_remove(i);
        }
        locks.extend(joined);
        Ok(())
    }

    /// Brings a client's copy of its own session's locks up to date with the server's
    /// answer to `req` on `ino` (`Err(errno)` for a refusal): a grant is applied as the
    /// server applied it, and a refused flock conversion (EAGAIN) dropped the old flock
    /// lock there too. Other refusals changed nothing. Applied in the order the server
    /// answered, this keeps the copy equal to the server's locks of that session. An
    /// error says the copy disagreed with the server (it found no conflict among this
    /// session's own locks): the caller reports it rather than guess.
    pub fn follow(&mut self, ino: u64, req: &Request, answer: Result<(), i32>) -> Result<(), Refusal> {
        match answer {
            Ok(()) => self.set(ino, req),
            Err(EAGAIN) if req.flock && req.kind != LockKind::Unlock => {
                self.drop_where(ino, |l| l.holder == req.holder && l.flock);
                Ok(())
            }
            Err(_) => Ok(()),
        }
    }

    /// Drops the locks of `ino` that `pred` picks.
    fn drop_where(&mut self, ino: u64, pred: impl Fn(&Held) -> bool) {
        if let Some(locks) = self.files.get_mut(&ino) {
            locks.retain(|l| !pred(l));
            if locks.is_empty() {
                self.files.remove(&ino);
            }
        }
    }

    /// Drops every lock of `session` (it ended, or its client is gone); returns how many.
    pub fn release_session(&mut self, session: SessionId) -> usize {
        let mut dropped = 0;
        self.files.retain(|_, locks| {
            let before = locks.len();
            locks.retain(|l| l.holder.session != session);
            dropped += before - locks.len();
            !locks.is_empty()
        });
        dropped
    }

    /// The locks `holder` has on `ino` in one namespace, in order: (start, end, kind).
    pub fn held(&self, ino: u64, holder: Holder, flock: bool) -> Vec<(u64, u64, LockKind)> {
        let mut v: Vec<(u64, u64, LockKind)> = self
            .files
            .get(&ino)
            .into_iter()
            .flatten()
            .filter(|l| l.holder == holder && l.flock == flock)
            .map(|l| (l.start, l.end, l.info().kind))
            .collect();
        v.sort_unstable_by_key(|&(s, _, _)| s);
        v
    }

    /// Every lock in the table as the request that would take it again, by inode and
    /// then by holder and start (a deterministic order). A client keeps a table of its own
    /// session's locks and, after a server restart, re-asserts what this lists
    /// (docs/protocol.md §4.5): the holder's locks are disjoint and joined, so taking them
    /// one by one rebuilds exactly the same set.
    pub fn entries(&self) -> Vec<(u64, Request)> {
        let mut v: Vec<(u64, Request)> = self
            .files
            .iter()
            .flat_map(|(&ino, locks)| {
                locks.iter().map(move |l| {
                    let kind = if l.write { LockKind::Write } else { LockKind::Read };
                    let req =
                        Request { holder: l.holder, start: l.start, end: l.end, kind, flock: l.flock, pid: l.pid };
                    (ino, req)
                })
            })
            .collect();
        v.sort_unstable_by_key(|(ino, r)| (*ino, r.holder.session, r.holder.owner, r.flock, r.start));
        v
    }

    /// How many locks the table holds in all.
    pub fn len(&self) -> usize {
        self.files.values().map(Vec::len).sum()
    }

    /// True when no lock is held at all.
    pub fn is_empty(&self) -> bool {
        self.files.is_empty()
    }
}

/// Says that `LOCK_TO_EOF` covers every byte offset (ends are inclusive).
const _: () = assert!(LOCK_TO_EOF == u64::MAX);

#[cfg(test)]
mod tests {
    use super::*;
    use LockKind::{Read, Unlock, Write};

    const F: u64 = 7;
    const A: Holder = Holder { session: 1, owner: 10 };
    const A2: Holder = Holder { session: 1, owner: 11 };
    const B: Holder = Holder { session: 2, owner: 10 };

    fn req(holder: Holder, start: u64, end: u64, kind: LockKind) -> Request {
        Request { holder, start, end, kind, flock: false, pid: holder.owner as u32 }
    }

    fn set(t: &mut LockTable, holder: Holder, start: u64, end: u64, kind: LockKind) -> Result<(), Refusal> {
        t.set(F, &req(holder, start, end, kind))
    }

    #[test]
    fn unlock_in_the_middle_splits() {
        let mut t = LockTable::default();
        set(&mut t, A, 0, 99, Write).expect("lock");
        set(&mut t, A, 40, 59, Unlock).expect("unlock");
        assert_eq!(t.held(F, A, false), vec![(0, 39, Write), (60, 99, Write)]);
        set(&mut t, B, 40, 59, Write).expect("the hole is free");
        assert!(set(&mut t, B, 39, 40, Write).is_err());
        // Unlocking what is not held, or past the end, is fine and changes nothing.
        set(&mut t, A, 1000, LOCK_TO_EOF, Unlock).expect("unlock nothing");
        assert_eq!(t.held(F, A, false), vec![(0, 39, Write), (60, 99, Write)]);
    }

    #[test]
    fn adjacent_and_overlapping_locks_of_one_kind_join() {
        let mut t = LockTable::default();
        set(&mut t, A, 0, 9, Read).expect("lock");
        set(&mut t, A, 10, 19, Read).expect("adjacent");
        assert_eq!(t.held(F, A, false), vec![(0, 19, Read)]);
        set(&mut t, A, 15, 30, Read).expect("overlapping");
        set(&mut t, A, 40, 49, Read).expect("apart");
        assert_eq!(t.held(F, A, false), vec![(0, 30, Read), (40, 49, Read)]);
        set(&mut t, A, 31, 39, Read).expect("the gap");
        assert_eq!(t.held(F, A, false), vec![(0, 49, Read)]);
        // A write lock inside the same range makes three; taking it back joins them again.
        set(&mut t, A, 20, 29, Write).expect("upgrade part");
        assert_eq!(t.held(F, A, false), vec![(0, 19, Read), (20, 29, Write), (30, 49, Read)]);
        set(&mut t, A, 20, 29, Read).expect("downgrade part");
        assert_eq!(t.held(F, A, false), vec![(0, 49, Read)]);
        assert_eq!(t.len(), 1);
    }

    #[test]
    fn upgrade_waits_for_other_readers_and_a_refusal_changes_nothing() {
        let mut t = LockTable::default();
        set(&mut t, A, 0, 99, Read).expect("a reads");
        set(&mut t, B, 50, 50, Read).expect("b reads too: read locks share");
        let before = (t.held(F, A, false), t.held(F, B, false));
        let got = set(&mut t, A, 0, 99, Write);
        assert_eq!(got, Err(Refusal::Conflict(LockInfo { kind: Read, start: 50, end: 50, pid: 10 })));
        assert_eq!((t.held(F, A, false), t.held(F, B, false)), before, "nothing changed");
        set(&mut t, A, 0, 49, Write).expect("upgrade where b does not read");
        assert_eq!(t.held(F, A, false), vec![(0, 49, Write), (50, 99, Read)]);
        set(&mut t, B, 50, 50, Unlock).expect("b unlocks");
        set(&mut t, A, 0, 99, Write).expect("now the whole upgrade");
        assert_eq!(t.held(F, A, false), vec![(0, 99, Write)]);
    }

    #[test]
    fn downgrade_lets_readers_in() {
        let mut t = LockTable::default();
        set(&mut t, A, 0, LOCK_TO_EOF, Write).expect("lock");
        assert!(set(&mut t, B, 5, 5, Read).is_err());
        set(&mut t, A, 0, LOCK_TO_EOF, Read).expect("downgrade");
        set(&mut t, B, 5, 5, Read).expect("b reads");
        assert!(set(&mut t, B, 5, 5, Write).is_err(), "a still reads there");
        assert_eq!(t.held(F, A, false), vec![(0, LOCK_TO_EOF, Read)]);
    }

    #[test]
    fn conflicts() {
        let mut t = LockTable::default();
        set(&mut t, A, 100, LOCK_TO_EOF, Write).expect("to the end of the file");
        // Another owner of the same session, and the same owner id in another session,
        // are other holders.
        for h in [A2, B] {
            assert!(set(&mut t, h, 1 << 62, 1 << 62, Read).is_err(), "{h:?}");
            assert!(set(&mut t, h, 99, 100, Read).is_err(), "{h:?}");
            set(&mut t, h, 0, 99, Read).expect("below the lock");
            set(&mut t, h, 0, 99, Unlock).expect("unlock");
        }
        // The holder itself never conflicts with its own locks.
        set(&mut t, A, 0, 200, Read).expect("own");
        assert_eq!(t.held(F, A, false), vec![(0, 200, Read), (201, LOCK_TO_EOF, Write)]);
        // test names the first conflicting lock, or none.
        assert_eq!(t.test(F, B, 150, 150, Read, false), None, "read over read");
        assert_eq!(
            t.test(F, B, 150, 300, Read, false),
            Some(LockInfo { kind: Write, start: 201, end: LOCK_TO_EOF, pid: 10 })
        );
        assert_eq!(t.test(F, B, 0, 0, Write, false).map(|i| i.kind), Some(Read));
        assert_eq!(t.test(F, A, 0, LOCK_TO_EOF, Write, false), None, "own locks");
        assert_eq!(t.test(F, B, 0, LOCK_TO_EOF, Unlock, false), None);
        assert_eq!(t.test(F + 1, B, 0, LOCK_TO_EOF, Write, false), None, "another file");
    }

    #[test]
    fn flock_and_posix_locks_do_not_meet() {
        let mut t = LockTable::default();
        let flock = |holder: Holder, kind| Request { flock: true, ..req(holder, 0, LOCK_TO_EOF, kind) };
        t.set(F, &flock(A, Write)).expect("flock");
        set(&mut t, B, 0, LOCK_TO_EOF, Write).expect("a POSIX lock beside it");
        assert_eq!(t.set(F, &flock(B, Read)).map_err(|_| ()), Err(()), "flock against flock");
        assert!(t.test(F, B, 0, 0, Read, true).is_some());
        assert!(t.test(F, A2, 0, 0, Read, false).is_some(), "b's POSIX lock");
        // A POSIX unlock leaves the same holder's flock lock alone.
        set(&mut t, A, 0, LOCK_TO_EOF, Unlock).expect("posix unlock");
        assert_eq!(t.held(F, A, true), vec![(0, LOCK_TO_EOF, Write)]);
        t.set(F, &flock(A, Unlock)).expect("flock unlock");
        assert!(t.held(F, A, true).is_empty());
        t.set(F, &flock(B, Read)).expect("now b");
    }

    #[test]
    fn a_refused_flock_conversion_drops_the_old_lock() {
        let mut t = LockTable::default();
        let flock = |holder: Holder, kind| Request { flock: true, ..req(holder, 0, LOCK_TO_EOF, kind) };
        t.set(F, &flock(A, Read)).expect("a shares");
        t.set(F, &flock(B, Read)).expect("b shares");
        assert!(t.set(F, &flock(A, Write)).is_err(), "b reads");
        assert!(t.held(F, A, true).is_empty(), "as on Linux, a's shared lock is gone");
        t.set(F, &flock(B, Write)).expect("so b's upgrade goes through");
        // POSIX conversions are atomic: a refused one keeps the old lock.
        set(&mut t, A, 0, 9, Read).expect("a reads");
        set(&mut t, B, 0, 9, Read).expect("b reads");
        assert!(set(&mut t, A, 0, 9, Write).is_err());
        assert_eq!(t.held(F, A, false), vec![(0, 9, Read)]);
    }

    #[test]
    fn a_session_that_goes_drops_its_locks() {
        let mut t = LockTable::default();
        set(&mut t, A, 0, 9, Write).expect("a");
        set(&mut t, A2, 20, 29, Read).expect("a2");
        t.set(F + 1, &req(A, 0, 0, Read)).expect("another file");
        set(&mut t, B, 40, 49, Write).expect("b");
        assert_eq!(t.release_session(A.session), 3);
        assert_eq!(t.len(), 1);
        set(&mut t, B, 0, 39, Write).expect("free now");
        assert_eq!(t.release_session(B.session), 1);
        assert!(t.is_empty());
    }

    #[test]
    fn too_many_locks_on_one_file_are_refused_and_one_session_takes_a_share_only() {
        let mut t = LockTable::default();
        let share = MAX_LOCKS_PER_SESSION_FILE as u64;
        let sessions = (MAX_LOCKS_PER_FILE / MAX_LOCKS_PER_SESSION_FILE) as u64;
        for s in 0..sessions {
            // Two owners of one session count together.
            let (h1, h2) = (Holder { session: 10 + s, owner: 1 }, Holder { session: 10 + s, owner: 2 });
            for i in 0..share {
                let h = if i < share / 2 { h1 } else { h2 };
                set(&mut t, h, 2 * (s * share + i), 2 * (s * share + i), Write).expect("room");
            }
            let over = 2 * (sessions * share + s);
            assert_eq!(set(&mut t, h1, over, over, Write), Err(Refusal::TooMany), "past its share");
            if s + 1 < sessions {
                set(&mut t, B, over, over, Read).expect("another session still has room");
                set(&mut t, B, over, over, Unlock).expect("unlocked");
            }
        }
        assert_eq!(set(&mut t, B, u64::MAX - 1, u64::MAX - 1, Read), Err(Refusal::TooMany));
        let a = Holder { session: 10, owner: 1 };
        set(&mut t, a, 0, 2, Write).expect("joining keeps the count down");
        for s in 0..sessions {
            for owner in [1, 2] {
                set(&mut t, Holder { session: 10 + s, owner }, 0, LOCK_TO_EOF, Unlock).expect("unlock everything");
            }
        }
        assert!(t.is_empty());
    }

    /// The model: per holder and namespace, the state of bytes 0..=63, and one more slot
    /// standing for every byte from 64 on (ranges end below 64 or at `LOCK_TO_EOF`).
    const SLOTS: usize = 65;
    type Bytes = [Option<bool>; SLOTS];

    fn slots(start: u64, end: u64) -> std::ops::RangeInclusive<usize> {
        start as usize..=if end == LOCK_TO_EOF { SLOTS - 1 } else { end as usize }
    }

    /// Maximal runs of one kind, as the table must keep them.
    fn runs(b: &Bytes) -> Vec<(u64, u64, LockKind)> {
        let mut out: Vec<(u64, u64, LockKind)> = Vec::new();
        let mut i = 0;
        while i < SLOTS {
            let Some(w) = b[i] else {
                i += 1;
                continue;
            };
            let mut j = i;
            while j + 1 < SLOTS && b[j + 1] == Some(w) {
                j += 1;
            }
            let end = if j == SLOTS - 1 { LOCK_TO_EOF } else { j as u64 };
            out.push((i as u64, end, if w { Write } else { Read }));
            i = j + 1;
        }
        out
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(512))]
        #[test]
        fn the_table_agrees_with_a_byte_by_byte_model(
            ops in proptest::collection::vec(
                (0usize..3, proptest::bool::ANY, 0u8..3, 0u64..64, 0u64..64, proptest::bool::weighted(0.2)),
                1..60,
            )
        ) {
            let holders = [A, A2, B];
            let mut model: HashMap<(usize, bool), Bytes> = HashMap::new();
            let mut t = LockTable::default();
            // Session 1's client's copy, kept by the answers alone (as crest-net does).
            let mut copy = LockTable::default();
            for (h, flock, kind, start, len, to_eof) in ops {
                let end = if to_eof { LOCK_TO_EOF } else { (start + len).min(63) };
                let kind = [Read, Write, Unlock][kind as usize];
                let write = kind == Write;
                let conflict = kind != Unlock && (0..3).filter(|&o| o != h).any(|o| {
                    model.get(&(o, flock)).is_some_and(|b| slots(start, end).any(|i| b[i].is_some_and(|w| w || write)))
                });
                let r = Request { holder: holders[h], start, end, kind, flock, pid: h as u32 };
                let tested = t.test(F, r.holder, start, end, kind, flock);
                proptest::prop_assert_eq!(tested.is_some(), conflict);
                let got = t.set(F, &r);
                proptest::prop_assert_eq!(got.is_err(), conflict, "{:?}", r);
                if r.holder.session == 1 {
                    let answer = match got {
                        Ok(()) => Ok(()),
                        Err(Refusal::Conflict(_)) => Err(EAGAIN),
                        Err(Refusal::TooMany) => Err(37),
                    };
                    copy.follow(F, &r, answer).expect("the copy follows the server");
                }
                if let Err(Refusal::Conflict(c)) = got {
                    proptest::prop_assert!(c.start <= end && start <= c.end && (write || c.kind == Write));
                    if flock {
                        model.remove(&(h, true));
                    }
                } else {
                    let b = model.entry((h, flock)).or_insert([None; SLOTS]);
                    for i in slots(start, end) {
                        b[i] = if kind == Unlock { None } else { Some(write) };
                    }
                }
                for (o, holder) in holders.iter().enumerate() {
                    for ns in [false, true] {
                        let want = model.get(&(o, ns)).map(runs).unwrap_or_default();
                        proptest::prop_assert_eq!(t.held(F, *holder, ns), want, "holder {} flock {}", o, ns);
                    }
                }
            }
            // The copy is session 1's part of the table, and taking its entries again in a
            // fresh table (a server restart) rebuilds exactly that.
            let mine: Vec<(u64, Request)> = t.entries().into_iter().filter(|(_, r)| r.holder.session == 1).collect();
            proptest::prop_assert_eq!(copy.entries(), mine.clone());
            let mut again = LockTable::default();
            for (ino, r) in &mine {
                proptest::prop_assert_eq!(again.set(*ino, r), Ok(()));
            }
            proptest::prop_assert_eq!(again.entries(), mine);
        }
    }
}
