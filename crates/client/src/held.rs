//! The session's own locks and open handles, kept from the server's answers in wire
//! order, to take them all again (with the rights the cache holds) after a server restart.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicU64, Ordering};

use crest_proto as p;
use crest_proto::locks::{self, LockTable};

use crate::replay::Results;

/// The locks this session holds on the server, as the server's answers said: a copy of
/// the server's lock table for this one session (owner ids are the session's own), kept
/// in wire order on the connection thread, and the requests taking them — and the rights
/// the cache holds — again after a restart that are not answered yet.
#[derive(Default)]
pub struct HeldLocks {
    /// This session's locks (it is session 0 in this copy).
    pub table: LockTable,
    /// Open handles (inode, handle) the server answered and no release has followed:
    /// opened again after a restart, so that a file unlinked while open outlives it.
    pub opens: BTreeSet<(u64, u64)>,
    /// Requests re-asserting locks and rights after a restart, by id, until answered.
    pub reasserting: BTreeMap<u64, Vec<p::Op>>,
    /// Handles released (→ the id of the request that released them) while a change made
    /// before the release may still go again after a restart: lost (answered, not
    /// durable), or writeback whose answer has not come (a change's answer may wait on
    /// the server, behind another mount's recall, while a release's goes). Releases are
    /// not replayed, and such a change, sent again, may reach its file only through the
    /// handle (its last name gone): the restart opens it again for it.
    pub released: BTreeMap<(u64, u64), u64>,
    /// Handles whose release is on its way, unanswered. A restart opens them again
    /// before anything else (what is sent before `Replayed` — replays, writeback made
    /// through them — may need them), and their release, sent again behind, closes them.
    pub closing: BTreeSet<(u64, u64)>,
    /// The access (`p::OPEN_*`) each handle above was opened with, asked again when it
    /// is opened again.
    pub access: BTreeMap<(u64, u64), u32>,
}

/// The lock request in `op`, in the copy's terms (this session is session 0 there).
pub fn lock_request(op: &p::Op) -> Option<(u64, locks::Request)> {
    match *op {
        p::Op::SetLock { ino, owner, start, end, kind, flock, pid } => {
            let holder = locks::Holder { session: 0, owner };
            Some((ino, locks::Request { holder, start, end, kind, flock, pid }))
        }
        _ => None,
    }
}

impl HeldLocks {
    /// Brings the copy up to date with the server's answers to `ops`, of request `id`.
    pub fn follow(&mut self, ops: &[p::Op], results: &Results, id: u64) {
        for (op, r) in ops.iter().zip(results) {
            if let Some((ino, req)) = lock_request(op) {
                if let Err(e) = self.table.follow(ino, &req, r.as_ref().map(|_| ()).map_err(|e| e.errno)) {
                    let owner = req.holder.owner;
                    tracing::warn!(ino, owner, "local lock table out of step with the server: {e:?}");
                }
            }
            match *op {
                p::Op::Open { ino, handle, access } if r.is_ok() => {
                    self.opens.insert((ino, handle));
                    self.access.insert((ino, handle), access);
                }
                p::Op::Release { ino, handle } => {
                    self.opens.remove(&(ino, handle));
                    self.closing.remove(&(ino, handle));
                    self.released.insert((ino, handle), id);
                }
                _ => {}
            }
        }
    }

    /// No change made before request `oldest` (the oldest change that may still go again
    /// after a restart; none if `None`) can go again: the handles released before it are
    /// not needed again.
    pub fn forget_released(&mut self, oldest: Option<u64>) {
        match oldest {
            Some(oldest) => self.released.retain(|_, by| *by >= oldest),
            None => self.released.clear(),
        }
        let (opens, closing, released) = (&self.opens, &self.closing, &self.released);
        self.access.retain(|h, _| opens.contains(h) || closing.contains(h) || released.contains_key(h));
    }

    /// The released handles that `changes` (request id, operations), going again after a
    /// restart (replays, writeback), may need: those of files a change made before the
    /// release (or with it, merged) names.
    pub fn closed_before(&self, changes: &[(u64, &[p::Op])]) -> BTreeSet<(u64, u64)> {
        self.released
            .iter()
            .filter(|(&(ino, _), &by)| {
                changes.iter().any(|(id, ops)| *id <= by && ops.iter().any(|op| op.named_inodes().contains(&ino)))
            })
            .map(|(&h, _)| h)
            .collect()
    }

    /// Behind the replays (and writeback): the releases of the handles `closed` that
    /// `reopen` opened again for them, with fresh ids from `next_id`. Until answered they
    /// count as released by these, after the replays (for a restart before the answer).
    pub fn release_again(&mut self, closed: &BTreeSet<(u64, u64)>, next_id: &AtomicU64) -> Vec<p::Request> {
        let ops = closed.iter().map(|&(ino, handle)| p::Op::Release { ino, handle }).collect();
        let requests = self.register(ops, next_id);
        for r in &requests {
            for op in &r.ops {
                if let p::Op::Release { ino, handle } = *op {
                    self.released.insert((ino, handle), r.id);
                }
            }
        }
        requests
    }

    /// After a server restart: the requests that open every held handle again, and the
    /// handles `closed` (by releases being replayed), but those of files in `later` (made
    /// by lost changes: `reopen_files` opens them right after their replay), with fresh
    /// ids from `next_id`. They go first, before the replays: a replayed change of a file
    /// unlinked while open must find it open, and the server holds such files only for the
    /// grace period. Re-asserts of an earlier restart still unanswered are superseded: the
    /// copy holds what they would take.
    pub fn reopen(
        &mut self,
        later: &BTreeSet<u64>,
        closed: &BTreeSet<(u64, u64)>,
        next_id: &AtomicU64,
    ) -> Vec<p::Request> {
        self.reasserting.clear();
        let ops: Vec<p::Op> = self
            .opens
            .iter()
            .chain(&self.closing)
            .chain(closed)
            .collect::<BTreeSet<_>>()
            .into_iter()
            .filter(|(ino, _)| !later.contains(ino))
            .map(|&(ino, handle)| self.reopen_op(ino, handle))
            .collect();
        self.register(ops, next_id)
    }

    /// The requests that open again the held handles of files `inos`, and the handles
    /// `closed` of them, which a replay just made again (a later replayed change may need
    /// them open).
    pub fn reopen_files(
        &mut self,
        inos: &[u64],
        closed: &BTreeSet<(u64, u64)>,
        next_id: &AtomicU64,
    ) -> Vec<p::Request> {
        let ops: Vec<p::Op> = self
            .opens
            .iter()
            .chain(&self.closing)
            .chain(closed)
            .collect::<BTreeSet<_>>()
            .into_iter()
            .filter(|(ino, _)| inos.contains(ino))
            .map(|&(ino, handle)| self.reopen_op(ino, handle))
            .collect();
        self.register(ops, next_id)
    }

    /// Every re-assert not yet answered, in the order a restart sends them: re-opens of
    /// files other than `later`'s (before the replays), re-opens of `later`'s files (made
    /// by changes being replayed: each after its file's replay), the rest (behind the
    /// replays).
    pub fn resend(&self, later: &BTreeSet<u64>) -> [Vec<p::Request>; 3] {
        let mut out: [Vec<p::Request>; 3] = Default::default();
        for (&id, ops) in &self.reasserting {
            let opens = ops.iter().all(|op| matches!(op, p::Op::Open { .. }));
            let of_later = ops.iter().any(|op| matches!(op, p::Op::Open { ino, .. } if later.contains(ino)));
            let slot = match (opens, of_later) {
                (true, false) => 0,
                (true, true) => 1,
                _ => 2,
            };
            out[slot].push(p::Request { id, ops: ops.clone(), time: None, caller: p::Caller::ROOT });
        }
        out
    }

    /// After a server restart (or after it forgot the session), behind the replays: the
    /// requests that take every held lock again, and the `rights` the cache held (when
    /// the server restored the session), with fresh ids from `next_id`.
    pub fn reassert(&mut self, rights: &[(u64, bool)], next_id: &AtomicU64) -> Vec<p::Request> {
        let mut ops: Vec<p::Op> = self
            .table
            .entries()
            .into_iter()
            .map(|(ino, r)| p::Op::SetLock {
                ino,
                owner: r.holder.owner,
                start: r.start,
                end: r.end,
                kind: r.kind,
                flock: r.flock,
                pid: r.pid,
            })
            .collect();
        if !ops.is_empty() {
            tracing::warn!("{} lock(s) held: taking them again after the server restarted", ops.len());
        }
        if !rights.is_empty() {
            tracing::warn!("the server restarted: re-asserting rights on {} inode(s) this mount held", rights.len());
        }
        ops.extend(rights.iter().map(|&(ino, exclusive)| p::Op::Reassert { ino, exclusive }));
        self.register(ops, next_id)
    }

    /// The `Open` that takes `handle` of `ino` again, with the access it had.
    fn reopen_op(&self, ino: u64, handle: u64) -> p::Op {
        let access = self.access.get(&(ino, handle)).copied().unwrap_or(0);
        p::Op::Open { ino, handle, access }
    }

    /// Keeps `ops` as re-assert requests until answered, in requests of the largest size.
    fn register(&mut self, ops: Vec<p::Op>, next_id: &AtomicU64) -> Vec<p::Request> {
        // Requests within the server's bounds (`p::request_refusal`): so many operations,
        // so many locks.
        let mut chunks: Vec<Vec<p::Op>> = Vec::new();
        let mut locks = 0;
        for op in ops {
            let lock = matches!(op, p::Op::SetLock { .. });
            let full = chunks
                .last()
                .is_none_or(|c| c.len() == p::MAX_OPS_PER_REQUEST || (lock && locks == p::MAX_LOCK_OPS_PER_REQUEST));
            if full {
                chunks.push(Vec::new());
                locks = 0;
            }
            locks += usize::from(lock);
            if let Some(c) = chunks.last_mut() {
                c.push(op);
            }
        }
        let mut out = Vec::new();
        for chunk in chunks {
            let id = next_id.fetch_add(1, Ordering::Relaxed);
            self.reasserting.insert(id, chunk.clone());
            out.push(p::Request { id, ops: chunk, time: None, caller: p::Caller::ROOT });
        }
        out
    }

    /// A release of `handle` of `ino` is on its way: the handle is not held (it is
    /// `closing`), and an unanswered re-open of it must not go again after it (the
    /// server would hold the file open for ever).
    pub fn releasing(&mut self, ino: u64, handle: u64) {
        if self.opens.remove(&(ino, handle)) {
            self.closing.insert((ino, handle));
        }
        self.reasserting.retain(|_, ops| {
            ops.retain(|op| !matches!(*op, p::Op::Open { ino: i, handle: h, .. } if (i, h) == (ino, handle)));
            !ops.is_empty()
        });
    }

    /// The inodes whose rights re-asserts not yet answered ask back, taken out of them:
    /// their answer is lost with the connection (`Connection::lost`).
    pub fn unconfirmed_rights(&mut self) -> Vec<u64> {
        let mut inodes = Vec::new();
        self.reasserting.retain(|_, ops| {
            ops.retain(|op| match *op {
                p::Op::Reassert { ino, .. } => {
                    inodes.push(ino);
                    false
                }
                _ => true,
            });
            !ops.is_empty()
        });
        inodes
    }

    /// The answer to request `id`, if it was a re-assert: the inodes whose rights the
    /// server refused to give back. A lock the server refused is lost: another client got
    /// it while this one was away past the grace period. The process that took it still
    /// thinks it holds it; nothing can tell it, so this says so loudly and forgets the lock.
    pub fn answered(&mut self, id: u64, results: &Results) -> Vec<u64> {
        let Some(ops) = self.reasserting.remove(&id) else { return Vec::new() };
        let mut refused = Vec::new();
        for (op, r) in ops.iter().zip(results) {
            if let p::Op::Release { ino, handle } = *op {
                // (The replays it followed may be lost to another restart.)
                self.released.insert((ino, handle), id);
                continue;
            }
            if let (p::Op::Reassert { ino, .. }, Err(e)) = (op, r) {
                tracing::info!(ino, "rights not given back after the restart: {}", e.message);
                refused.push(*ino);
                continue;
            }
            if let (p::Op::Open { ino, handle, .. }, Err(e)) = (op, r) {
                // Reclaimed anyway (this session was away past the grace period): its
                // descriptor's calls fail from now on.
                tracing::warn!(ino, "an open file is gone after the server restarted: {}", e.message);
                self.opens.remove(&(*ino, *handle));
                continue;
            }
            let (Some((ino, req)), Err(e)) = (lock_request(op), r) else { continue };
            tracing::error!(
                ino,
                owner = req.holder.owner,
                pid = req.pid,
                start = req.start,
                end = req.end,
                kind = ?req.kind,
                flock = req.flock,
                "LOCK LOST: the server restarted and refused to give this lock back ({}, errno {}); \
                 the process still believes it holds it",
                e.message,
                e.errno
            );
            let unlock = locks::Request { kind: p::LockKind::Unlock, ..req };
            if let Err(e) = self.table.set(ino, &unlock) {
                tracing::warn!(ino, "cannot drop a lost lock from the local table: {e:?}");
            }
        }
        refused
    }

    /// The session is gone (fenced, or another file system): so is every lock.
    pub fn clear(&mut self) {
        *self = HeldLocks::default();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lock(ino: u64, start: u64, end: u64) -> p::Op {
        p::Op::SetLock { ino, owner: 7, start, end, kind: p::LockKind::Write, flock: false, pid: 42 }
    }

    #[test]
    fn what_the_server_granted_is_taken_again_and_a_refused_lock_is_forgotten() {
        let mut h = HeldLocks::default();
        let ok: Results = vec![Ok(p::Reply::Done), Ok(p::Reply::Done), Ok(p::Reply::Done)];
        h.follow(
            &[lock(5, 0, 9), lock(6, 10, 19), p::Op::Open { ino: 5, handle: 3, access: p::OPEN_READ | p::OPEN_WRITE }],
            &ok,
            0,
        );
        // A refused lock was never held; a released handle is not opened again.
        let refused: Results = vec![Err(p::OpError { errno: 11, message: "held elsewhere".into() })];
        h.follow(&[lock(8, 0, 1)], &refused, 0);
        h.follow(
            &[
                p::Op::Open { ino: 9, handle: 4, access: p::OPEN_READ | p::OPEN_WRITE },
                p::Op::Release { ino: 9, handle: 4 },
            ],
            &ok,
            0,
        );
        let ids = AtomicU64::new(100);
        let mut reqs = h.reopen(&BTreeSet::new(), &BTreeSet::new(), &ids);
        reqs.extend(h.reassert(&[(1, true)], &ids));
        let ops: Vec<Vec<p::Op>> = reqs.iter().map(|r| r.ops.clone()).collect();
        assert_eq!(
            ops,
            vec![
                vec![p::Op::Open { ino: 5, handle: 3, access: p::OPEN_READ | p::OPEN_WRITE }],
                vec![lock(5, 0, 9), lock(6, 10, 19), p::Op::Reassert { ino: 1, exclusive: true }],
            ],
            "the handles first (before the replays), then the locks and the rights"
        );
        let all = |h: &HeldLocks| -> Vec<p::Request> { h.resend(&BTreeSet::new()).into_iter().flatten().collect() };
        assert_eq!(all(&h), reqs, "unanswered re-asserts go again after a reconnect");
        // The server gives back all but the lock on 6 and the rights on 1.
        assert!(h.answered(reqs[0].id, &vec![Ok(p::Reply::Done)]).is_empty());
        let answer: Results = vec![
            Ok(p::Reply::Done),
            Err(p::OpError { errno: 11, message: "taken meanwhile".into() }),
            Err(p::OpError { errno: 16, message: "held elsewhere".into() }),
        ];
        assert_eq!(h.answered(reqs[1].id, &answer), vec![1], "rights refused");
        let held: Vec<u64> = h.table.entries().into_iter().map(|(ino, _)| ino).collect();
        assert_eq!(held, vec![5], "the lock the server refused is forgotten");
        assert!(all(&h).is_empty(), "answered");
    }

    #[test]
    fn a_handle_released_while_its_reopen_is_unanswered_is_not_opened_again() {
        let mut h = HeldLocks::default();
        let ok: Results = vec![Ok(p::Reply::Done), Ok(p::Reply::Done)];
        h.follow(
            &[
                p::Op::Open { ino: 5, handle: 3, access: p::OPEN_READ | p::OPEN_WRITE },
                p::Op::Open { ino: 6, handle: 4, access: p::OPEN_READ | p::OPEN_WRITE },
            ],
            &ok,
            0,
        );
        let ids = AtomicU64::new(100);
        let reqs = h.reopen(&BTreeSet::new(), &BTreeSet::new(), &ids);
        assert_eq!(reqs.len(), 1);
        // The process closes 5 before the server answered the re-open (it waits, parked).
        h.releasing(5, 3);
        let again: Vec<p::Op> = h.resend(&BTreeSet::new()).into_iter().flatten().flat_map(|r| r.ops).collect();
        assert_eq!(
            again,
            vec![p::Op::Open { ino: 6, handle: 4, access: p::OPEN_READ | p::OPEN_WRITE }],
            "after a reconnect, only 6 is opened again"
        );
        h.releasing(6, 4);
        assert!(h.resend(&BTreeSet::new()).iter().all(Vec::is_empty));
        assert!(h.opens.is_empty());
    }

    #[test]
    fn locks_taken_again_go_in_requests_the_server_accepts() {
        let seed = crest_rng::next_u64() | 1;
        eprintln!("seed {seed}");
        let mut x = seed;
        let mut next = || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        };
        let mut h = HeldLocks::default();
        // Locks on many files, several ranges each, and rights besides.
        let n = 1 + next() % 3000;
        for i in 0..n {
            let op = lock(1 + next() % 40, 4 * i, 4 * i + 1);
            h.follow(&[op], &vec![Ok(p::Reply::Done)], 0);
        }
        let rights: Vec<(u64, bool)> = (0..next() % 2000).map(|i| (1000 + i, i % 2 == 0)).collect();
        let held = h.table.len();
        let reqs = h.reassert(&rights, &AtomicU64::new(1));
        for r in &reqs {
            assert_eq!(p::request_refusal(&r.ops), None, "{} ops", r.ops.len());
        }
        let locks = reqs.iter().flat_map(|r| &r.ops).filter(|op| matches!(op, p::Op::SetLock { .. })).count();
        let reasserts = reqs.iter().flat_map(|r| &r.ops).filter(|op| matches!(op, p::Op::Reassert { .. })).count();
        assert_eq!((locks, reasserts), (held, rights.len()), "every one, once");
    }
}
