//! The session's own locks, kept from the server's answers in wire order, to take them
//! all again after a server restart.

use super::*;

/// The locks this session holds on the server, as the server's answers said: a copy of
/// the server's lock table for this one session (owner ids are the session's own), kept
/// in wire order on the connection thread, and the requests taking them — and the rights
/// the cache holds — again after a restart that are not answered yet.
#[derive(Default)]
pub(super) struct HeldLocks {
    pub(super) table: LockTable,
    /// Open handles (inode, handle) the server answered and no release has followed:
    /// opened again after a restart, so that a file unlinked while open outlives it.
    pub(super) opens: BTreeSet<(u64, u64)>,
    /// Requests re-asserting locks and rights after a restart, by id, until answered.
    pub(super) reasserting: BTreeMap<u64, Vec<p::Op>>,
}

/// The lock request in `op`, in the copy's terms (this session is session 0 there).
pub(super) fn lock_request(op: &p::Op) -> Option<(u64, locks::Request)> {
    match *op {
        p::Op::SetLock { ino, owner, start, end, kind, flock, pid } => {
            let holder = locks::Holder { session: 0, owner };
            Some((ino, locks::Request { holder, start, end, kind, flock, pid }))
        }
        _ => None,
    }
}

impl HeldLocks {
    /// Brings the copy up to date with the server's answers to `ops`.
    pub(super) fn follow(&mut self, ops: &[p::Op], results: &Results) {
        for (op, r) in ops.iter().zip(results) {
            if let Some((ino, req)) = lock_request(op) {
                if let Err(e) = self.table.follow(ino, &req, r.as_ref().map(|_| ()).map_err(|e| e.errno)) {
                    let owner = req.holder.owner;
                    tracing::warn!(ino, owner, "local lock table out of step with the server: {e:?}");
                }
            }
            match *op {
                p::Op::Open { ino, handle } if r.is_ok() => {
                    self.opens.insert((ino, handle));
                }
                p::Op::Release { ino, handle } => {
                    self.opens.remove(&(ino, handle));
                }
                _ => {}
            }
        }
    }

    /// After a server restart (or after it forgot the session): frames for requests that
    /// take every held lock again, and the `rights` the cache held (when the server
    /// restored the session), with fresh ids. Re-asserts of an earlier restart still
    /// unanswered are superseded: the copy holds what they would take.
    pub(super) fn reassert(&mut self, rights: &[(u64, bool)], next_id: &AtomicU64, out: &mut Vec<u8>) {
        self.reasserting.clear();
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
        ops.extend(self.opens.iter().map(|&(ino, handle)| p::Op::Open { ino, handle }));
        for chunk in ops.chunks(p::MAX_OPS_PER_REQUEST) {
            let id = next_id.fetch_add(1, Ordering::Relaxed);
            self.reasserting.insert(id, chunk.to_vec());
        }
        self.resend(out);
    }

    /// Frames for every re-assert not yet answered (after a plain reconnect: the server
    /// may not have seen them; taking a held lock again is harmless).
    pub(super) fn resend(&self, out: &mut Vec<u8>) {
        for (&id, ops) in &self.reasserting {
            write_frame(out, &ClientMessage::Request(p::Request { id, ops: ops.clone(), time: None }));
        }
    }

    /// The answer to request `id`, if it was a re-assert: the inodes whose rights the
    /// server refused to give back. A lock the server refused is lost: another client got
    /// it while this one was away past the grace period. The process that took it still
    /// thinks it holds it; nothing can tell it, so this says so loudly and forgets the lock.
    pub(super) fn answered(&mut self, id: u64, results: &Results) -> Vec<u64> {
        let Some(ops) = self.reasserting.remove(&id) else { return Vec::new() };
        let mut refused = Vec::new();
        for (op, r) in ops.iter().zip(results) {
            if let (p::Op::Reassert { ino, .. }, Err(e)) = (op, r) {
                tracing::info!(ino, "rights not given back after the restart: {}", e.message);
                refused.push(*ino);
                continue;
            }
            if let (p::Op::Open { ino, handle }, Err(e)) = (op, r) {
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
    pub(super) fn clear(&mut self) {
        *self = HeldLocks::default();
    }
}
