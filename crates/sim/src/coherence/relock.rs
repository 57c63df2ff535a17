//! Locks across a server restart. The restarted server knows no lock: it holds exactly
//! what the restored sessions re-assert, each from its client's copy of its own locks
//! (`HeldLocks`). That copy follows the answers the client received, so a lock request
//! the old server ran but whose answer died with it is not in it (its client sends it
//! again, as new work, after `Replayed`). The model does as the server: at a crash its
//! lock table empties, and the re-asserts fill it again (`Checker::on_applied`).
//!
//! What each client must re-assert is checked: the model's locks at the crash with every
//! unanswered lock request undone (its holder's locks on that file as they were before
//! it ran). A session that re-asserts more or less than that, once it has said
//! `Replayed` and its re-asserts have all run, fails the run. When a second crash comes before a session has said it, the
//! answers to its re-asserts may or may not have reached it, and what it must claim the
//! next time is not known: that session is not checked in that life.

use std::collections::{BTreeMap, BTreeSet};

use crest_proto::locks::{Holder, LockTable};
use crest_proto::{self as p, Op};

use super::checker::Checker;
use super::SessionId;

/// One lock as a session claims it: (inode, owner, flock, start, end, write).
pub(crate) type Claim = (u64, u64, bool, u64, u64, bool);

/// How to undo one lock request that ran: its holder's locks on the file in its
/// namespace, as they were before.
#[derive(Clone, Debug)]
pub(crate) struct Undo {
    ino: u64,
    holder: Holder,
    flock: bool,
    before: Vec<(u64, u64, p::LockKind)>,
}

/// What restored sessions must re-assert after the last restart, and what they did.
#[derive(Default)]
pub(crate) struct Relock {
    /// Lock requests run in this server life, by request: how to undo each.
    undo: BTreeMap<(SessionId, u64), Vec<Undo>>,
    /// Sessions restored by the last restart whose re-asserts have not all run yet.
    claims: BTreeMap<SessionId, Claims>,
}

/// One restored session's re-asserts of locks.
#[derive(Default)]
struct Claims {
    /// The locks it must claim (`None`: not known).
    want: Option<BTreeSet<Claim>>,
    /// Those claimed so far.
    seen: BTreeSet<Claim>,
    /// It said `Replayed`: every re-assert has been sent.
    replayed: bool,
    /// Its re-assert requests with locks sent and not run yet (a re-assert queued behind
    /// replays that wait for recalls runs after `Replayed` arrives).
    running: BTreeSet<u64>,
}

fn claim(ino: u64, holder: Holder, flock: bool, start: u64, end: u64, kind: p::LockKind) -> Claim {
    (ino, holder.owner, flock, start, end, kind == p::LockKind::Write)
}

impl Relock {
    /// Request `key` is about to run `ops` on `locks`: remembers how to undo its lock
    /// requests (the first run in this life; the reply cache answers any other).
    pub(crate) fn before_run(&mut self, key: (SessionId, u64), ops: &[Op], locks: &LockTable) {
        if self.undo.contains_key(&key) {
            return;
        }
        let mut undo: Vec<Undo> = Vec::new();
        for op in ops {
            if let Op::SetLock { ino, owner, flock, .. } = *op {
                let holder = Holder { session: key.0, owner };
                if !undo.iter().any(|u| u.ino == ino && u.holder == holder && u.flock == flock) {
                    undo.push(Undo { ino, holder, flock, before: locks.held(ino, holder, flock) });
                }
            }
        }
        if !undo.is_empty() {
            self.undo.insert(key, undo);
        }
    }

    /// The client of `session` sent re-assert request `id`.
    pub(crate) fn sent(&mut self, session: SessionId, id: u64, ops: &[Op]) {
        if let Some(c) = self.claims.get_mut(&session) {
            if ops.iter().any(|op| matches!(op, Op::SetLock { .. })) {
                c.running.insert(id);
            }
        }
    }

    /// Re-assert request `id` of `session` ran: what it claims. `Err` as `settle`.
    pub(crate) fn reasserted(&mut self, session: SessionId, id: u64, ops: &[Op]) -> Result<(), String> {
        let Some(c) = self.claims.get_mut(&session) else { return Ok(()) };
        for op in ops {
            if let Op::SetLock { ino, owner, flock, start, end, kind, .. } = *op {
                c.seen.insert(claim(ino, Holder { session, owner }, flock, start, end, kind));
            }
        }
        c.running.remove(&id);
        self.settle(session)
    }

    /// The server died. `locks` is the model's table, which empties (the restarted server
    /// knows no lock); `unanswered` says which requests' answers have not reached their
    /// clients; `restored` the sessions the new server knows.
    pub(crate) fn crash(
        &mut self,
        locks: &mut LockTable,
        unanswered: impl Fn((SessionId, u64)) -> bool,
        restored: BTreeSet<SessionId>,
    ) {
        let mut held: BTreeMap<SessionId, BTreeSet<Claim>> = BTreeMap::new();
        for (ino, r) in std::mem::take(locks).entries() {
            held.entry(r.holder.session).or_default().insert(claim(ino, r.holder, r.flock, r.start, r.end, r.kind));
        }
        for (key, undo) in std::mem::take(&mut self.undo) {
            if !unanswered(key) {
                continue;
            }
            let mine = held.entry(key.0).or_default();
            for u in undo {
                mine.retain(|&(ino, owner, flock, ..)| (ino, owner, flock) != (u.ino, u.holder.owner, u.flock));
                mine.extend(u.before.iter().map(|&(s, e, k)| claim(u.ino, u.holder, u.flock, s, e, k)));
            }
        }
        let unsure = std::mem::take(&mut self.claims);
        self.claims = restored
            .into_iter()
            .map(|s| {
                let want = (!unsure.contains_key(&s)).then(|| held.remove(&s).unwrap_or_default());
                (s, Claims { want, ..Claims::default() })
            })
            .collect();
    }

    /// Session `session` says its replays (and re-asserts) are all sent. `Err` as `settle`.
    pub(crate) fn replayed(&mut self, session: SessionId) -> Result<(), String> {
        let Some(c) = self.claims.get_mut(&session) else { return Ok(()) };
        c.replayed = true;
        self.settle(session)
    }

    /// Once every re-assert of `session` has been sent and has run: `Err` when it claimed
    /// other locks than it held.
    fn settle(&mut self, session: SessionId) -> Result<(), String> {
        if self.claims.get(&session).is_none_or(|c| !c.replayed || !c.running.is_empty()) {
            return Ok(());
        }
        let Some(Claims { want, seen, .. }) = self.claims.remove(&session) else { return Ok(()) };
        match want {
            Some(want) if want != seen => Err(format!(
                "session {session} re-asserted the locks {:?} but held {:?} (missing {:?}, extra {:?})",
                seen,
                want,
                want.difference(&seen).collect::<Vec<_>>(),
                seen.difference(&want).collect::<Vec<_>>()
            )),
            _ => Ok(()),
        }
    }
}

impl Checker {
    /// The server died: its locks with it (`Relock::crash`). `unanswered` and
    /// `restored` as there.
    pub(crate) fn locks_lost(&mut self, unanswered: impl Fn((SessionId, u64)) -> bool, restored: BTreeSet<SessionId>) {
        let model = self.model.as_mut().expect("model");
        self.relock.crash(&mut model.locks, unanswered, restored);
    }
}
