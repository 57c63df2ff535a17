//! Requests that wait: behind another session's exclusive rights (parked until its recall
//! is answered), behind other openers' write-back (flush recalls), and the inodes a change
//! removed while others cached them (pinned until their recall is answered).

use super::*;

/// Parked requests run at a time once free to (`Server::run_parked`).
pub const PARKED_SLICE: usize = 64;
/// Bytes of data the reads and writes of one slice of parked requests may move together
/// (the first request of a slice runs whatever it moves): a slice of big reads costs
/// what a few of them do, not what 64 do.
pub const PARKED_SLICE_BYTES: u64 = 4 << 20;

/// The bytes of file data `req` reads or writes: what running it costs, as
/// `PARKED_SLICE_BYTES` counts it.
fn data_bytes(req: &p::Request) -> u64 {
    req.ops
        .iter()
        .map(|op| match op {
            Op::Read { len, .. } => u64::from(*len),
            Op::Write { data, .. } | Op::Append { data, .. } | Op::WriteBack { data, .. } => data.len() as u64,
            _ => 0,
        })
        .fold(0, u64::saturating_add)
}

/// Files a change removed the last name of while other sessions cached them: held open
/// for the opens those sessions may have answered themselves and sent behind, until each
/// has answered the change's recall (its `Open` is ahead of that answer on its
/// connection), late or not, or is gone (fenced, ended: its opens will never run). Not
/// the recall timeout: the change stops waiting then, the file does not.
#[derive(Debug, Default)]
pub(super) struct Pin {
    pub(super) inodes: Vec<u64>,
    pub(super) owed: BTreeSet<SessionId>,
}

impl Server {
    /// The files whose last name `req` may remove (unlinks and renames over them).
    pub(super) fn victims(&mut self, req: &p::Request) -> Vec<u64> {
        let mut out = Vec::new();
        for op in &req.ops {
            // Files only: a directory's opens (opendir) are sent behind too, but an empty
            // directory kept for another mount's open descriptor shows nothing but its
            // attributes, and a removed directory must stay gone for lookups in it.
            let (parent, name) = match op {
                Op::Unlink { parent, name } => (*parent, name),
                Op::Rename { new_parent, new_name, flags, .. } if flags & p::RENAME_EXCHANGE == 0 => {
                    (*new_parent, new_name)
                }
                _ => continue,
            };
            match self.store.lookup(parent, name) {
                Ok(i) if i.kind != s::FileKind::Directory && i.nlink == 1 => out.push(i.ino),
                _ => {}
            }
        }
        out
    }

    /// Holds open each of `victims` that a session other than `session` may cache. Such a
    /// session may have opened it without asking (a client answers an open of what it
    /// caches itself and sends the `Open` behind): the `Open` reaches the server before
    /// that session's answer to the change's recall, so the file must outlive the recall,
    /// not the change, for that descriptor to keep working (`release_pins`).
    pub(super) fn pin(&mut self, session: SessionId, victims: &[u64]) -> Vec<u64> {
        let mut pins = Vec::new();
        for &ino in victims {
            let elsewhere = self.caps.held_elsewhere(session, ino) || self.caps.lapsed_elsewhere(session, ino);
            if elsewhere && self.store.open_handle(ino).is_ok() {
                pins.push(ino);
            }
        }
        pins
    }

    /// Keeps `pins`, the files a change removed while other sessions cached them, until
    /// every session the change's recall (in `out`, what the change sends) went to has
    /// answered it (`release_pins`); with no recall they are let go at once. Those
    /// sessions get a durable record, as the sessions holding an orphan open do
    /// (`record_openers`): each may hold the file open already, its `Open` on its way, so
    /// a restarted server must wait for it (and keep the file for it) too.
    pub(super) fn hold_pins(&mut self, pins: Vec<u64>, out: &[Outgoing]) {
        let recall = out.iter().find_map(|o| match o {
            Outgoing::Notify { notify: p::Notify::Recall { recall_id, .. }, .. } => Some(*recall_id),
            _ => None,
        });
        match recall {
            Some(id) => {
                let owed: BTreeSet<SessionId> = out
                    .iter()
                    .filter_map(|o| match o {
                        Outgoing::Notify { session, notify: p::Notify::Recall { recall_id, .. } }
                            if *recall_id == id =>
                        {
                            Some(*session)
                        }
                        _ => None,
                    })
                    .collect();
                for &s in &owed {
                    self.record_session(s, "a session that may hold an unlinked file open");
                }
                let pin = self.pins.entry(id).or_default();
                pin.owed.extend(owed);
                pin.inodes.extend(pins);
            }
            None => self.unpin(pins),
        }
    }

    /// Sessions holding one of `orphans` (files unlinked while open) open get a durable
    /// record: a restarted server then waits for their clients to open them again before
    /// it reclaims what nobody holds.
    pub(super) fn record_openers(&mut self, orphans: &[u64]) {
        if orphans.is_empty() {
            return;
        }
        let mut openers: Vec<SessionId> = self
            .sessions
            .iter()
            .filter(|(_, s)| !s.recorded && orphans.iter().any(|i| s.open.contains_key(i)))
            .map(|(id, _)| *id)
            .collect();
        openers.sort_unstable();
        for id in openers {
            self.record_session(id, "a holder of an unlinked open file");
        }
    }

    /// Lets go of the inodes held open for changes whose recalls are all answered (or
    /// given up on).
    pub(super) fn release_pins(&mut self) {
        let done: Vec<u64> = self.pins.iter().filter(|(_, p)| p.owed.is_empty()).map(|(id, _)| *id).collect();
        for id in done {
            if let Some(pin) = self.pins.remove(&id) {
                self.unpin(pin.inodes);
            }
        }
    }

    /// True for an inode kept only by pins (or, after a restart, held for the grace
    /// period): gone for everything but an open that was already on its way (the one
    /// reason it is kept), or a restored session's re-open.
    pub(super) fn only_pinned(&self, ino: u64) -> bool {
        self.is_pinned(ino) && !self.sessions.values().any(|s| s.open.contains_key(&ino))
    }

    pub(super) fn unpin(&mut self, inodes: Vec<u64>) {
        for ino in inodes {
            if let Err(e) = self.store.release_handle(ino) {
                tracing::warn!(ino, "cannot release a removed inode: {e}");
            }
        }
    }

    /// Parks `req` behind a change of its own session that waits and was already
    /// answered (`Request::time`: a writeback, or a replay) if both name an inode: its
    /// callers were told that change is done, so nothing the session sends after it
    /// about the same files may run before it.
    pub(super) fn park_behind_own_writeback(&mut self, session: SessionId, req: &p::Request) -> bool {
        let names: HashSet<u64> = req.ops.iter().flat_map(Op::named_inodes).collect();
        let waiting: HashSet<u64> = self
            .parked
            .iter()
            .filter(|p| p.session == session && p.req.time.is_some() && p.req.ops.iter().any(Op::is_mutation))
            .filter(|p| p.req.ops.iter().flat_map(Op::named_inodes).any(|i| names.contains(&i)))
            .flat_map(|p| p.waiting.iter().copied())
            .collect();
        self.park(session, req, waiting, "request waits behind its session's writeback")
    }

    /// Parks new work of a session behind its own replays still parked: the client sent
    /// it after them and may build on what they change (a directory a replayed create
    /// makes, then listed). It waits for what they wait for, and runs after them. So does
    /// a replay (`in_replay`) behind those that took a place before it: they ran before
    /// it the first time, and it must come out as it did then (what it answered may show
    /// their effects, or they its).
    pub(super) fn park_behind_own_replays(&mut self, session: SessionId, req: &p::Request, in_replay: bool) -> bool {
        let place = |id: u64| self.sessions.get(&session).and_then(|s| s.reserved.get(&id).copied());
        let mine = place(req.id);
        let waiting: HashSet<u64> = self
            .parked
            .iter()
            .filter(|p| p.session == session && self.parked_in_replay.contains(&(session, p.req.id)))
            .filter(|p| !in_replay || matches!((place(p.req.id), mine), (Some(theirs), Some(mine)) if theirs < mine))
            .flat_map(|p| p.waiting.iter().copied())
            .collect();
        self.park(session, req, waiting, "new work waits behind its session's parked replays")
    }

    /// Parks `req` if other sessions hold any of `inodes` exclusively (recalling them).
    pub(super) fn park_if_exclusive(
        &mut self,
        session: SessionId,
        req: &p::Request,
        inodes: &[u64],
        now_ms: u64,
    ) -> bool {
        // An acquire grants X again on what it names: if this session's own X on one is
        // being recalled, it waits for the answer, else that answer (sent before the
        // client saw the grant) would end here the rights the client then holds.
        let acquires = req.ops.iter().any(|op| matches!(op, Op::Acquire { .. }));
        let own = if acquires { self.caps.own_exclusive_recalls(session, inodes) } else { HashSet::new() };
        if own.is_empty() && inodes.iter().all(|&i| self.caps.exclusive_elsewhere(session, i).is_none()) {
            return false;
        }
        let mut out = Vec::new();
        let mut waiting = self.caps.recall_exclusive(session, inodes, now_ms, &mut out);
        waiting.extend(own);
        self.outbox.extend(out);
        self.park(session, req, waiting, "request waits for exclusive rights to be recalled")
    }

    /// Parks `req` until the recalls `waiting` are answered; false (not parked) if there
    /// are none.
    fn park(&mut self, session: SessionId, req: &p::Request, waiting: HashSet<u64>, why: &str) -> bool {
        if waiting.is_empty() {
            return false;
        }
        tracing::debug!(session, id = req.id, "{why}");
        self.parked.push_back(Parked { session, req: req.clone(), waiting });
        true
    }

    /// Parks a change of file data until every other session that holds the file open has
    /// answered a flush recall (`caps::FlushRecall`: pages it mapped shared and dirtied
    /// are written back before the change, not over it). The writeback of a file the
    /// session holds exclusively runs at once, and so does its kernel's write-back
    /// (`Op::WriteBack`) of a file it is asked to give up (part of its answer), and any
    /// writeback of changes its client answered itself (`Request::time`): answered under
    /// exclusive rights, when no other session could have dirtied the pages, and already
    /// returned to its caller, whose next requests must find it done — it may arrive
    /// after the rights are gone (a restart that gave them back to nobody). A request
    /// waits so once (`flushed`).
    pub(super) fn park_for_flush(
        &mut self,
        session: SessionId,
        req: &p::Request,
        write_backs: &[u64],
        now_ms: u64,
    ) -> bool {
        if self.flushed.remove(&(session, req.id)) || req.time.is_some() {
            return false;
        }
        let mut targets: BTreeMap<SessionId, Vec<u64>> = BTreeMap::new();
        for op in &req.ops {
            let ino = match op {
                Op::Write { ino, .. }
                | Op::MapObject { ino, .. }
                | Op::Append { ino, .. }
                | Op::Fallocate { ino, .. } => *ino,
                Op::SetAttr { ino, set } if set.size_bytes.is_some() => *ino,
                _ => continue,
            };
            // Never kept waiting: the writeback of what the session holds exclusively (no
            // other session can have dirtied the file's pages since it got the rights: its
            // read would have recalled them; and held back, that writeback could fall
            // behind the session's later changes, or its answer to a recall), and its
            // kernel's write-back of cached pages while it is being recalled (part of its
            // answer).
            if self.caps.holds_exclusive(session, ino)
                || (write_backs.contains(&ino) && self.caps.being_recalled(session, ino))
            {
                continue;
            }
            let openers = self.sessions.iter().filter(|(_, s)| s.open.contains_key(&ino)).map(|(id, _)| *id);
            for id in openers {
                if id != session {
                    let v = targets.entry(id).or_default();
                    if !v.contains(&ino) {
                        v.push(ino);
                    }
                }
            }
        }
        if targets.is_empty() {
            return false;
        }
        let mut out = Vec::new();
        let waiting = self.caps.recall_for_flush(targets, now_ms, &mut out);
        self.outbox.extend(out);
        tracing::debug!(session, id = req.id, "change of file data waits for other openers to write back");
        self.flushed.insert((session, req.id));
        self.parked.push_back(Parked { session, req: req.clone(), waiting });
        true
    }

    /// Runs parked requests whose recalls are all answered, oldest first, at most
    /// `PARKED_SLICE` of them and about `PARKED_SLICE_BYTES` of their data: when a holder lets go of what thousands of requests waited
    /// for, they run a slice at a time between other sessions' work (the driver calls
    /// again while `has_parked_ready`), not in one long stall of the store.
    pub(super) fn run_parked(&mut self, now: p::Time) {
        let mut ready = Vec::new();
        let mut still = VecDeque::with_capacity(self.parked.len());
        let (mut more, mut bytes) = (false, 0u64);
        for p in std::mem::take(&mut self.parked) {
            if p.waiting.iter().any(|&id| self.caps.recall_pending(id)) {
                still.push_back(p);
            } else if !more && ready.len() < PARKED_SLICE && (ready.is_empty() || bytes < PARKED_SLICE_BYTES) {
                bytes = bytes.saturating_add(data_bytes(&p.req));
                ready.push(p);
            } else {
                more = true;
                still.push_back(p);
            }
        }
        self.parked = still;
        // (This slice is older than what it leaves: it does not wait behind that.)
        self.parked_ready = false;
        for p in ready {
            if self.sessions.contains_key(&p.session) {
                self.handle(p.session, p.req, now);
            }
        }
        self.parked_ready = more;
        // (The last replay parked in the grace period may have run.)
        self.end_grace_if_replayed(now);
    }

    /// Parks `req` behind its session's parked requests that are free to run but wait
    /// for their slice (`run_parked`): its client may have sent it after them because
    /// they were sent, and they run first, as they would have had they all run at once.
    pub(super) fn park_behind_own_ready(&mut self, session: SessionId, req: &p::Request) -> bool {
        if !self.parked_ready {
            return false;
        }
        let waiting: HashSet<u64> = self
            .parked
            .iter()
            .filter(|p| p.session == session && !p.waiting.iter().any(|&id| self.caps.recall_pending(id)))
            .flat_map(|p| p.waiting.iter().copied())
            .collect();
        self.park(session, req, waiting, "request waits behind its session's parked requests")
    }

    /// Every inode a request names (and the victims of its unlinks and renames): what
    /// must not be held exclusively by another session while it runs.
    /// With `by` (the session, and now), an acquire of a directory shared with other
    /// sessions (`Contention`) involves nothing: it is refused when it runs, and must not
    /// first recall anything.
    pub(super) fn involved(&mut self, req: &p::Request, by: Option<(SessionId, u64)>) -> Vec<u64> {
        let mut v = Vec::new();
        for op in &req.ops {
            if let (Op::Acquire { ino }, Some((session, now_ms))) = (op, by) {
                if self.contention.shared(*ino, session, now_ms) {
                    continue;
                }
            }
            v.extend(op_inodes(op));
            if matches!(op, Op::Unlink { .. } | Op::Rmdir { .. } | Op::Rename { .. } | Op::Acquire { .. }) {
                v.extend(self.touches(op));
            }
        }
        v
    }
}
