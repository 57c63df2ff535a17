//! After a restart: welcoming sessions back, their replays and re-asserted rights, and
//! the grace period that holds other work until they are back.

use super::*;

/// Destroys the files unlinked while open that nobody holds open any more.
pub(super) fn reclaim_orphans(store: &mut Store) {
    if let Err(e) = store.reclaim_orphans() {
        tracing::error!("cannot reclaim unlinked files: {e}");
    }
}

/// Holds every orphan open (a store handle each) for the grace period: see
/// `Server::grace_orphans`.
pub(super) fn hold_orphans(store: &mut Store) -> Vec<u64> {
    let orphans = match store.orphans() {
        Ok(o) => o,
        Err(e) => {
            tracing::error!("cannot list unlinked files: {e}");
            return Vec::new();
        }
    };
    orphans.into_iter().filter(|&ino| store.open_handle(ino).is_ok()).collect()
}

impl Server {
    pub(super) fn welcome(
        &self,
        id: SessionId,
        resumed: bool,
        durable_seq: Option<u64>,
        durable_holes: Vec<u64>,
        fenced: bool,
        identity: p::IdentityMap,
    ) -> p::ServerMessage {
        let (secret, version) = self.sessions.get(&id).map_or((0, p::PROTOCOL_VERSION), |s| (s.secret, s.protocol));
        p::ServerMessage::Welcome(p::Welcome {
            version,
            session: p::SessionToken { id, secret },
            resumed,
            durable_seq,
            durable_holes,
            fsid: self.store.fsid(),
            fenced,
            noatime: self.dataset_noatime(id),
            identity,
            server_release: self.release.clone(),
        })
    }

    /// `session`'s client has sent every request it replays after the restart.
    pub fn replayed(&mut self, session: SessionId, now: p::Time) {
        self.confirm_resume(session);
        if self.replaying.remove(&session) {
            self.end_grace_if_replayed(now);
        }
    }

    /// Ends the grace period once every restored session has said `Replayed` and every
    /// replay parked meanwhile (behind another session's re-asserted rights, or a flush)
    /// has run: until then the new work that waits for it may find the state without
    /// a change its caller was told was done.
    pub(super) fn end_grace_if_replayed(&mut self, now: p::Time) {
        if self.grace && self.replaying.is_empty() && self.parked_in_replay.is_empty() {
            tracing::info!("every restored session has replayed: grace over");
            self.end_grace(now);
        }
    }

    /// `Op::Reassert`: rights a restored session's client held before the restart, given
    /// back while it replays — when nobody's new work runs yet (docs/protocol.md §4.5).
    pub(super) fn reassert(&mut self, session: SessionId, ino: u64, exclusive: bool) -> Result<Reply, p::OpError> {
        if !self.replaying.contains(&session) {
            return Err(errno(22, format!("session {session} re-asserts rights on inode {ino} outside a replay")));
        }
        match self.caps.reassert(session, ino, exclusive) {
            Ok(()) => Ok(Reply::Done),
            Err(other) => Err(errno(16, format!("inode {ino} is held by session {other}; rights not given back"))),
        }
    }

    /// A message from `session` after its hello: its client has the welcome.
    pub(super) fn confirm_resume(&mut self, session: SessionId) {
        if let Some(s) = self.sessions.get_mut(&session) {
            if s.restart_unconfirmed {
                s.restart_unconfirmed = false;
                s.holes.clear();
            }
        }
    }

    /// In the grace period, holds open (a store handle each) the files a change may
    /// remove the last name of: a restored session that held one open before the restart
    /// has not necessarily opened it again yet (its replays and writeback may come
    /// first, and other sessions' too). If the change orphans it, it is held with the
    /// orphans the image kept, until the grace period ends (`grace_orphans`).
    pub(super) fn hold_for_grace(&mut self, victims: &[u64]) -> Vec<u64> {
        if !self.grace {
            return Vec::new();
        }
        victims.iter().copied().filter(|&ino| self.store.open_handle(ino).is_ok()).collect()
    }

    pub(super) fn end_grace(&mut self, now: p::Time) {
        self.grace = false;
        self.replaying.clear();
        self.grace_just_ended = true;
        // Every client that could still hold an unlinked file open has opened it again
        // (`Op::Open` before `Replayed`) or was fenced: what nobody holds goes now.
        let held = std::mem::take(&mut self.grace_orphans);
        self.unpin(held);
        reclaim_orphans(&mut self.store);
        let answered = std::mem::take(&mut self.grace_answered);
        let parked = std::mem::take(&mut self.grace_parked);
        for (session, req) in self.grace_order(parked, &answered) {
            self.handle(session, req, now);
        }
    }

    /// The order the requests held for the grace period run in: each session's in the
    /// order they came, but none before the requests still to run of a session in
    /// `answered` that involve an inode it involves — those came, in wire order, before
    /// that session's answer to a recall, which let the other one through (its writeback
    /// of an inode it held exclusively, then the answer that gives the inode up). A
    /// session held back holds back its later requests too. (A cycle, which no wire
    /// order can make, falls back to the order they came in.)
    fn grace_order(
        &mut self,
        parked: VecDeque<(SessionId, p::Request)>,
        answered: &BTreeSet<SessionId>,
    ) -> Vec<(SessionId, p::Request)> {
        if answered.is_empty() {
            return parked.into_iter().collect();
        }
        let mut queue: Vec<(SessionId, p::Request, Vec<u64>)> = parked
            .into_iter()
            .map(|(s, r)| {
                let involved = self.involved(&r, None);
                (s, r, involved)
            })
            .collect();
        let mut order = Vec::with_capacity(queue.len());
        loop {
            let before = queue.len();
            let mut held_back = BTreeSet::new();
            let mut next = Vec::new();
            for i in 0..queue.len() {
                let (session, _, involved) = &queue[i];
                let waits = held_back.contains(session)
                    || queue[i + 1..].iter().any(|(other, _, theirs)| {
                        other != session
                            && answered.contains(other)
                            && !held_back.contains(other)
                            && theirs.iter().any(|ino| involved.contains(ino))
                    });
                if waits {
                    held_back.insert(*session);
                    next.push(i);
                }
            }
            let mut kept = Vec::with_capacity(next.len());
            for (i, item) in std::mem::take(&mut queue).into_iter().enumerate() {
                if next.binary_search(&i).is_ok() {
                    kept.push(item);
                } else {
                    order.push((item.0, item.1));
                }
            }
            queue = kept;
            if queue.is_empty() {
                return order;
            }
            if queue.len() == before {
                order.extend(queue.into_iter().map(|(s, r, _)| (s, r)));
                return order;
            }
        }
    }

    /// Ends the grace period when no restored session is left to replay (one that ended
    /// leaves that to the next tick) and no replay waits parked, or when it runs out (its
    /// end is set by the first tick after a restart), fencing those still away. (Replays
    /// still parked then keep their session's new work behind them.)
    pub(super) fn tick_grace(&mut self, now_ms: u64) {
        if !self.grace {
            return;
        }
        let until = *self.grace_until.get_or_insert(now_ms + crate::caps::GRACE_MS);
        if self.replaying.is_empty() {
            if self.parked_in_replay.is_empty() || now_ms >= until {
                self.end_grace(time_of_millis(now_ms));
            }
        } else if now_ms >= until {
            tracing::warn!(
                sessions = ?self.replaying,
                "grace period over; clients of these sessions did not come back to replay"
            );
            // Those still away are fenced, as a session silent past its lease is: what
            // they answered themselves and had not shipped (or had acknowledged and not
            // replayed) must not land after others have moved on without it. Their
            // clients are told when they come back (the fenced marker).
            let mut away: Vec<SessionId> = self
                .replaying
                .iter()
                .copied()
                .filter(|id| {
                    self.disconnected.contains_key(id)
                        || self.sessions.get(id).is_some_and(|s| s.awaiting_resume.is_some())
                })
                .collect();
            away.sort_unstable();
            let why = "did not come back within the grace period after a restart";
            self.fence(&away.into_iter().map(|id| (id, why)).collect::<Vec<_>>());
            self.end_grace(time_of_millis(now_ms));
        }
    }
}
