//! Shared capabilities and their recall (docs/protocol.md §4).
//!
//! Every reply that carries an inode's state makes its session a *holder* of that inode:
//! the client may cache it. When another session changes the inode, every holder is sent
//! a recall; the change's reply is held back until each of them answers (or a deadline
//! passes, for a client that went silent). A holder stays a holder until it answers (or
//! that deadline passes): until then it may still answer from what it cached, so a
//! second change of the inode recalls it again and waits for it too.
//!
//! Invariant (tests below and in session.rs): a change's response is released only when
//! no other session that held the inode before the change may still answer from what it
//! cached — so once a syscall returns on one client, no other client answers from older
//! state.

use std::collections::{BTreeMap, HashMap, HashSet};

use crest_proto as p;

use crate::SessionId;

// The lease and timing constants both ends keep to.
pub use crest_proto::timing::{
    CLIENT_LEASE_MS, DISCONNECTED_FENCE_MS, DISCONNECTED_HOLDER_MS, EXCLUSIVE_RECALL_MS, GRACE_MS, HEARTBEAT_MS,
    LEASE_MS, RECALL_TIMEOUT_MS,
};

/// A response held back until recalls are answered.
#[derive(Debug)]
struct Wait {
    session: SessionId,
    /// `None` once the changer's session ended (the wait stays, to keep track of who has
    /// answered).
    response: Option<p::Response>,
    /// Sessions that have not answered, and the inodes the recall named to each.
    outstanding: BTreeMap<SessionId, Vec<u64>>,
    deadline_ms: u64,
}

/// An outstanding recall of exclusive rights: requests of other sessions wait for it.
/// The holder has `EXCLUSIVE_RECALL_MS` to answer, renewed by each request of its that
/// works on the recalled inodes (its write-back), up to a lease from the recall: past the
/// deadline it is fenced. A holder that sits on its rights costs the waiters one
/// `EXCLUSIVE_RECALL_MS`; one still shipping its changes gets the time to finish.
#[derive(Debug)]
struct ExclusiveRecall {
    holder: SessionId,
    inodes: Vec<u64>,
    deadline_ms: u64,
    /// The latest the deadline can be moved to.
    limit_ms: u64,
}

impl ExclusiveRecall {
    /// The holder is heard working on it (or hears it again) at `now_ms`: its time to
    /// answer runs from there, within the limit.
    fn renew(&mut self, now_ms: u64) {
        self.deadline_ms = self.deadline_ms.max((now_ms + EXCLUSIVE_RECALL_MS).min(self.limit_ms));
    }
}

/// A recall sent *before* another session's data change runs, to a session that holds the
/// file open: its client may hold pages of a shared writable mapping dirty, and writes
/// them back before it answers (a recall drops the kernel's pages, which writes dirty
/// ones first). Run after the change, that write-back would put the page's old bytes
/// back over the change. Not answered in `RECALL_TIMEOUT_MS`: the change runs anyway.
#[derive(Debug)]
struct FlushRecall {
    holder: SessionId,
    inodes: Vec<u64>,
    deadline_ms: u64,
}

/// Who holds what, and which responses wait.
///
/// Maps whose iteration order decides the order of what is sent are `BTreeMap`s: the
/// core is a step function, and the same inputs must give the same outputs in the same
/// order (the simulator, `crest-sim`, replays a seed exactly).
#[derive(Debug, Default)]
pub struct Caps {
    /// Inode → the sessions that may cache it, each with the latest recall of it the
    /// session has not answered (`None`: not being recalled).
    holders: HashMap<u64, BTreeMap<SessionId, Option<u64>>>,
    waits: BTreeMap<u64, Wait>,
    next_recall: u64,
    /// Exclusive (`X`) rights: the holder answers operations on these inodes itself and
    /// ships them later (docs/protocol.md §4.1). Another session's request that involves
    /// one waits until the holder has flushed and given it up.
    exclusive: HashMap<u64, SessionId>,
    /// Inode → the recall of its exclusive rights under way.
    recalling: HashMap<u64, u64>,
    exclusive_recalls: BTreeMap<u64, ExclusiveRecall>,
    flush_recalls: BTreeMap<u64, FlushRecall>,
    /// Inode → sessions that held it and did not answer its recall in time, with that
    /// recall's id. Their cache has expired, so no change waits for them; but an `Open`
    /// one answered itself before may still be on its way, ahead of its late answer. So
    /// a later change of the inode tells them too (without waiting), and a pin of the
    /// file waits for that answer (`session::parking::Pin`). Gone once the session
    /// answers a later recall (its connection is in order, and a client drops what it
    /// shares when a connection breaks) or loses every right.
    lapsed: HashMap<u64, BTreeMap<SessionId, u64>>,
    /// Holders that came back and heard their exclusive recalls again: their deadlines run
    /// from the next tick (`renew_resent`).
    resent: Vec<SessionId>,
}

/// Something the server sends.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Outgoing {
    /// A response to one of `session`'s requests.
    Response {
        /// To whom.
        session: SessionId,
        /// What.
        response: p::Response,
    },
    /// A response whose one result, `Reply::Data`, is still empty: the shell runs `read`
    /// (`PlannedRead::run`, else `Server::read_again`) and puts its bytes in before the
    /// response goes out, in its place among the session's messages (`session/elsewhere.rs`).
    Read {
        /// To whom.
        session: SessionId,
        /// What, but for the data.
        response: p::Response,
        /// The read to run.
        read: crate::session::PlannedRead,
    },
    /// A message `session` did not ask for (a recall).
    Notify {
        /// To whom.
        session: SessionId,
        /// What.
        notify: p::Notify,
    },
}

impl Caps {
    /// `session` may now cache these inodes.
    ///
    /// A recall of the inode still unanswered does not matter any more: the reply that
    /// carries this grant follows the recall on the session's connection, so its client
    /// drops the old state before it takes in the new one.
    pub fn grant(&mut self, session: SessionId, inodes: impl IntoIterator<Item = u64>) {
        for ino in inodes {
            self.holders.entry(ino).or_default().insert(session, None);
        }
    }

    /// `session` changed these inodes; `response` answers it. Returns what to send now:
    /// the response itself if nobody else held them, else recalls (and the response
    /// later, from `recall_done` or `expire`).
    pub fn changed(&mut self, session: SessionId, inodes: &[u64], response: p::Response, now_ms: u64) -> Vec<Outgoing> {
        let mut targets: BTreeMap<SessionId, Vec<u64>> = BTreeMap::new();
        for &ino in inodes {
            for &t in self.holders.get(&ino).into_iter().flat_map(BTreeMap::keys) {
                let v = targets.entry(t).or_default();
                if t != session && !v.contains(&ino) {
                    v.push(ino);
                }
            }
        }
        targets.retain(|_, v| !v.is_empty());
        let mut told: BTreeMap<SessionId, Vec<u64>> = BTreeMap::new();
        for &ino in inodes {
            for &t in self.lapsed.get(&ino).into_iter().flat_map(BTreeMap::keys) {
                let v = told.entry(t).or_default();
                if t != session && !v.contains(&ino) && !targets.get(&t).is_some_and(|h| h.contains(&ino)) {
                    v.push(ino);
                }
            }
        }
        told.retain(|_, v| !v.is_empty());
        if targets.is_empty() && told.is_empty() {
            return vec![Outgoing::Response { session, response }];
        }
        self.next_recall += 1;
        let recall_id = self.next_recall;
        let mut out = Vec::with_capacity(targets.len() + told.len());
        for (&t, inodes) in &targets {
            for ino in inodes {
                self.holders.entry(*ino).or_default().insert(t, Some(recall_id));
            }
        }
        let mut notices = targets.clone();
        for (t, inodes) in told {
            notices.entry(t).or_default().extend(inodes);
        }
        for (t, inodes) in notices {
            out.push(Outgoing::Notify { session: t, notify: p::Notify::Recall { recall_id, inodes } });
        }
        if targets.is_empty() {
            out.push(Outgoing::Response { session, response });
            return out;
        }
        let deadline_ms = now_ms + RECALL_TIMEOUT_MS;
        self.waits.insert(recall_id, Wait { session, response: Some(response), outstanding: targets, deadline_ms });
        out
    }

    /// True while some session other than `session` may cache `ino`.
    pub fn held_elsewhere(&self, session: SessionId, ino: u64) -> bool {
        self.holders.get(&ino).is_some_and(|h| h.keys().any(|&s| s != session))
    }

    /// True while some session other than `session` held `ino` and has not answered
    /// since a recall of it timed out (`lapsed`): it may have opened it without asking.
    pub fn lapsed_elsewhere(&self, session: SessionId, ino: u64) -> bool {
        self.lapsed.get(&ino).is_some_and(|l| l.keys().any(|&s| s != session))
    }

    /// `session` answered recall `recall_id`.
    pub fn recall_done(&mut self, session: SessionId, recall_id: u64) -> Vec<Outgoing> {
        self.lapsed.retain(|_, l| {
            if l.get(&session).is_some_and(|&r| r < recall_id) {
                l.remove(&session);
            }
            !l.is_empty()
        });
        if self.exclusive_recalls.get(&recall_id).is_some_and(|r| r.holder == session) {
            self.finish_exclusive_recall(recall_id);
            return Vec::new();
        }
        if self.flush_recalls.get(&recall_id).is_some_and(|r| r.holder == session) {
            if let Some(r) = self.flush_recalls.remove(&recall_id) {
                self.unhold(session, &r.inodes, recall_id);
            }
            return Vec::new();
        }
        let Some(w) = self.waits.get_mut(&recall_id) else { return Vec::new() };
        let Some(inodes) = w.outstanding.remove(&session) else { return Vec::new() };
        let done = w.outstanding.is_empty();
        // It dropped these (and, its connection being in order, everything recalled
        // before): it holds them no more, unless a later recall of one is unanswered.
        self.unhold(session, &inodes, recall_id);
        if !done {
            return Vec::new();
        }
        self.waits.remove(&recall_id).and_then(release).into_iter().collect()
    }

    /// `session` is no longer a holder of `inodes` as far as recall `recall_id` goes.
    fn unhold(&mut self, session: SessionId, inodes: &[u64], recall_id: u64) {
        for ino in inodes {
            if let Some(h) = self.holders.get_mut(ino) {
                if h.get(&session).is_some_and(|r| r.is_some_and(|r| r <= recall_id)) {
                    h.remove(&session);
                }
                if h.is_empty() {
                    self.holders.remove(ino);
                }
            }
        }
    }

    /// Sends flush recalls (`FlushRecall`) to `targets`: session → the inodes it holds
    /// open that another session's change is about to write. Returns the recall ids to
    /// wait for and queues the notices in `out`.
    pub fn recall_for_flush(
        &mut self,
        targets: BTreeMap<SessionId, Vec<u64>>,
        now_ms: u64,
        out: &mut Vec<Outgoing>,
    ) -> HashSet<u64> {
        let mut wait = HashSet::new();
        for (holder, inodes) in targets {
            self.next_recall += 1;
            let id = self.next_recall;
            for &ino in &inodes {
                if let Some(r) = self.holders.get_mut(&ino).and_then(|h| h.get_mut(&holder)) {
                    *r = Some(id);
                }
            }
            out.push(Outgoing::Notify {
                session: holder,
                notify: p::Notify::Recall { recall_id: id, inodes: inodes.clone() },
            });
            self.flush_recalls.insert(id, FlushRecall { holder, inodes, deadline_ms: now_ms + RECALL_TIMEOUT_MS });
            wait.insert(id);
        }
        wait
    }

    /// Every deadline moves on by `ms` (the server stood still that long).
    pub fn postpone_deadlines(&mut self, ms: u64) {
        for w in self.waits.values_mut() {
            w.deadline_ms = w.deadline_ms.saturating_add(ms);
        }
        for r in self.exclusive_recalls.values_mut() {
            r.deadline_ms = r.deadline_ms.saturating_add(ms);
            r.limit_ms = r.limit_ms.saturating_add(ms);
        }
        for r in self.flush_recalls.values_mut() {
            r.deadline_ms = r.deadline_ms.saturating_add(ms);
        }
    }

    /// True while `session` holds `ino` exclusively (also while that is being recalled:
    /// the writeback it sends meanwhile must run before its answer is taken).
    pub fn holds_exclusive(&self, session: SessionId, ino: u64) -> bool {
        self.exclusive.get(&ino) == Some(&session)
    }

    /// True while `session` is asked to give up what it has of `ino` (a recall it has not
    /// answered): what it sends about `ino` meanwhile is what its answer waits for.
    pub fn being_recalled(&self, session: SessionId, ino: u64) -> bool {
        self.holders.get(&ino).and_then(|h| h.get(&session)).is_some_and(Option::is_some)
            || self.flush_recalls.values().any(|r| r.holder == session && r.inodes.contains(&ino))
            || self.exclusive_recalls.values().any(|r| r.holder == session && r.inodes.contains(&ino))
    }

    /// Releases responses whose holders did not answer in time.
    pub fn expire(&mut self, now_ms: u64) -> Vec<Outgoing> {
        self.flush_recalls.retain(|id, r| {
            let late = now_ms >= r.deadline_ms;
            if late {
                tracing::warn!(
                    recall_id = id,
                    session = r.holder,
                    "flush recall not answered in {RECALL_TIMEOUT_MS} ms"
                );
            }
            !late
        });
        let late: Vec<u64> = self.waits.iter().filter(|(_, w)| now_ms >= w.deadline_ms).map(|(id, _)| *id).collect();
        let mut out = Vec::new();
        for id in late {
            if let Some(w) = self.waits.remove(&id) {
                tracing::warn!(
                    recall_id = id,
                    sessions = ?w.outstanding.keys().collect::<Vec<_>>(),
                    "recall not answered in {RECALL_TIMEOUT_MS} ms; releasing the change's reply"
                );
                // What they cached before the change has expired on their side by now.
                for (t, inodes) in &w.outstanding {
                    self.unhold(*t, inodes, id);
                    for &ino in inodes {
                        self.lapsed.entry(ino).or_default().insert(*t, id);
                    }
                }
                out.extend(release(w));
            }
        }
        out
    }

    /// Sessions whose connections have been gone longer than their clients trust their
    /// shared caches: they hold no shared rights, and no change waits for them.
    /// (Exclusive rights stay until each is fenced: its client may still write them back
    /// after a blip.) One look at every held inode for all of them: hundreds of sessions
    /// dropped together lapse in one pass, not one each.
    pub fn forget_shared(&mut self, sessions: &[SessionId]) -> Vec<Outgoing> {
        let gone: HashSet<SessionId> = sessions.iter().copied().collect();
        self.holders.retain(|_, h| {
            h.retain(|s, _| !gone.contains(s));
            !h.is_empty()
        });
        let mut out = Vec::new();
        let ids: Vec<u64> = self.waits.keys().copied().collect();
        for &session in sessions {
            for &id in &ids {
                out.extend(self.recall_done(session, id));
            }
        }
        out
    }

    /// Inode `ino` is gone (freed): nobody holds it.
    pub fn forget_inode(&mut self, ino: u64) {
        self.holders.remove(&ino);
    }

    /// A session lost all its rights (fenced or ended): it holds nothing, and nobody
    /// waits for it.
    pub fn forget_holder(&mut self, session: SessionId) -> Vec<Outgoing> {
        self.holders.retain(|_, h| {
            h.remove(&session);
            !h.is_empty()
        });
        self.lapsed.retain(|_, l| {
            l.remove(&session);
            !l.is_empty()
        });
        let mine: Vec<u64> =
            self.exclusive_recalls.iter().filter(|(_, r)| r.holder == session).map(|(id, _)| *id).collect();
        for id in mine {
            self.finish_exclusive_recall(id);
        }
        self.flush_recalls.retain(|_, r| r.holder != session);
        // (A fenced session's client starts a new session and drops every right it held:
        // nothing is left to recall from it.)
        self.exclusive.retain(|_, h| *h != session);
        let mut out = Vec::new();
        let ids: Vec<u64> = self.waits.keys().copied().collect();
        for id in ids {
            out.extend(self.recall_done(session, id));
        }
        out
    }

    /// A session ended: as `forget_holder`, and its own parked responses go too.
    pub fn forget_session(&mut self, session: SessionId) -> Vec<Outgoing> {
        let out = self.forget_holder(session);
        for w in self.waits.values_mut().filter(|w| w.session == session) {
            w.response = None;
        }
        out
    }

    /// `session` is back on a new connection: every recall it has not answered is sent
    /// again (the first notice may have been lost with the old connection): recalls of
    /// what it cached that changes still wait for, and recalls of its exclusive rights
    /// under way, whose deadlines run again from the next tick. (Exclusive rights are
    /// never taken back without an answer: a holder that does not answer in time is
    /// fenced, and a fenced session cannot resume.) A holder that hears a recall twice
    /// answers twice; the second answer changes nothing.
    pub fn resumed(&mut self, session: SessionId) -> Vec<Outgoing> {
        if self.exclusive_recalls.values().any(|r| r.holder == session) {
            self.resent.push(session);
        }
        let shared = self.waits.iter().filter_map(|(id, w)| w.outstanding.get(&session).map(|inodes| (*id, inodes)));
        let pending =
            self.exclusive_recalls.iter().filter(|(_, r)| r.holder == session).map(|(id, r)| (*id, &r.inodes));
        let flush = self.flush_recalls.iter().filter(|(_, r)| r.holder == session).map(|(id, r)| (*id, &r.inodes));
        let mut out: Vec<(u64, Vec<u64>)> =
            shared.chain(pending).chain(flush).map(|(id, inodes)| (id, inodes.clone())).collect();
        out.sort_unstable();
        out.into_iter()
            .map(|(recall_id, inodes)| Outgoing::Notify { session, notify: p::Notify::Recall { recall_id, inodes } })
            .collect()
    }

    /// `session` created `ino`: nobody else can know it yet, so it is the session's alone
    /// (the client applies the same rule to its own successful creates).
    pub fn grant_exclusive(&mut self, session: SessionId, ino: u64) {
        self.exclusive.insert(ino, session);
    }

    /// After a restart, `session` says it held `ino` before — exclusively when `exclusive`
    /// — and gets it back unless another session holds what conflicts: exclusive rights
    /// on it, or (for exclusive rights) any. Returns the session in the way.
    pub fn reassert(&mut self, session: SessionId, ino: u64, exclusive: bool) -> Result<(), SessionId> {
        if let Some(other) = self.exclusive_elsewhere(session, ino) {
            return Err(other);
        }
        if exclusive {
            if let Some(&other) = self.holders.get(&ino).and_then(|h| h.keys().find(|&&s| s != session)) {
                return Err(other);
            }
            self.exclusive.insert(ino, session);
        }
        self.holders.entry(ino).or_default().insert(session, None);
        Ok(())
    }

    /// Every inode some session holds exclusively.
    pub fn exclusive_inodes(&self) -> Vec<u64> {
        let mut v: Vec<u64> = self.exclusive.keys().copied().collect();
        v.sort_unstable(); // recalls go out in a deterministic order
        v
    }

    /// The inode is gone (rmdir): nobody holds it any more.
    pub fn drop_exclusive(&mut self, ino: u64) {
        self.exclusive.remove(&ino);
    }

    /// The session that holds `ino` exclusively, if it is not `session`.
    pub fn exclusive_elsewhere(&self, session: SessionId, ino: u64) -> Option<SessionId> {
        self.exclusive.get(&ino).copied().filter(|&h| h != session)
    }

    /// Recalls every exclusive right on `inodes` held by a session other than `session`
    /// (reusing recalls already under way). Returns the recall ids to wait for (empty:
    /// nothing to wait for) and queues the recall notices in `out`.
    pub fn recall_exclusive(
        &mut self,
        session: SessionId,
        inodes: &[u64],
        now_ms: u64,
        out: &mut Vec<Outgoing>,
    ) -> HashSet<u64> {
        let mut wait = HashSet::new();
        let mut fresh: BTreeMap<SessionId, Vec<u64>> = BTreeMap::new();
        for &ino in inodes {
            let Some(holder) = self.exclusive_elsewhere(session, ino) else { continue };
            match self.recalling.get(&ino) {
                Some(&id) => {
                    wait.insert(id);
                }
                None => {
                    let v = fresh.entry(holder).or_default();
                    if !v.contains(&ino) {
                        v.push(ino);
                    }
                }
            }
        }
        for (holder, inodes) in fresh {
            self.next_recall += 1;
            let id = self.next_recall;
            for &ino in &inodes {
                self.recalling.insert(ino, id);
                // Its answer ends its rights only on what it cached before this recall.
                if let Some(r) = self.holders.get_mut(&ino).and_then(|h| h.get_mut(&holder)) {
                    *r = Some(id);
                }
            }
            out.push(Outgoing::Notify {
                session: holder,
                notify: p::Notify::Recall { recall_id: id, inodes: inodes.clone() },
            });
            let (deadline_ms, limit_ms) = (now_ms + EXCLUSIVE_RECALL_MS, now_ms + LEASE_MS);
            self.exclusive_recalls.insert(id, ExclusiveRecall { holder, inodes, deadline_ms, limit_ms });
            wait.insert(id);
        }
        wait
    }

    /// Recalls under way of `session`'s own exclusive rights on any of `inodes`. A
    /// request that would grant those rights again (an acquire) waits for them: its
    /// client sees the recall before the grant and holds the inode again, while the
    /// recall's answer, coming after the grant, would end the rights here.
    pub fn own_exclusive_recalls(&self, session: SessionId, inodes: &[u64]) -> HashSet<u64> {
        inodes
            .iter()
            .filter(|&i| self.exclusive.get(i) == Some(&session))
            .filter_map(|i| self.recalling.get(i).copied())
            .filter(|id| self.exclusive_recalls.get(id).is_some_and(|r| r.holder == session))
            .collect()
    }

    /// True while an exclusive recall is outstanding (to any session).
    pub fn recalling_exclusive(&self) -> bool {
        !self.exclusive_recalls.is_empty()
    }

    /// True while exclusive or flush recall `id` is outstanding (parked requests wait).
    pub fn recall_pending(&self, id: u64) -> bool {
        self.exclusive_recalls.contains_key(&id) || self.flush_recalls.contains_key(&id)
    }

    /// Ends an exclusive recall: the holder flushed (everything it did before answering
    /// arrived before the answer on its connection) and dropped its copies, or it was
    /// fenced. Either way it holds `X` on those inodes no more, nor `S` unless it read
    /// them again after the recall was sent.
    fn finish_exclusive_recall(&mut self, id: u64) -> bool {
        let Some(r) = self.exclusive_recalls.remove(&id) else { return false };
        for &ino in &r.inodes {
            if self.exclusive.get(&ino) == Some(&r.holder) {
                self.exclusive.remove(&ino);
            }
            if self.recalling.get(&ino) == Some(&id) {
                self.recalling.remove(&ino);
            }
        }
        // A holder that read an inode again after the recall was sent keeps it (the
        // reply came after the recall on its connection: what it holds now is current).
        self.unhold(r.holder, &r.inodes, id);
        true
    }

    /// `session` sent a request working on `inodes` at `now_ms`: the deadlines of its
    /// exclusive recalls naming any of them move on (it is shipping what it changed under
    /// them), never past their limit.
    pub fn recall_progress(&mut self, session: SessionId, inodes: &[u64], now_ms: u64) {
        for r in self.exclusive_recalls.values_mut() {
            if r.holder == session && r.inodes.iter().any(|i| inodes.contains(i)) {
                r.renew(now_ms);
            }
        }
    }

    /// The exclusive recalls sent again to holders that came back (`resumed`) are given
    /// `EXCLUSIVE_RECALL_MS` from `now_ms` to answer, within their limit.
    pub fn renew_resent(&mut self, now_ms: u64) {
        for session in std::mem::take(&mut self.resent) {
            for r in self.exclusive_recalls.values_mut().filter(|r| r.holder == session) {
                r.renew(now_ms);
            }
        }
    }

    /// Holders of exclusive recalls unanswered in time (`ExclusiveRecall`): they are to
    /// be fenced (a live client answers at once; one that cannot must not write back later).
    pub fn late_exclusive_holders(&self, now_ms: u64) -> Vec<SessionId> {
        let mut v: Vec<SessionId> =
            self.exclusive_recalls.values().filter(|r| now_ms >= r.deadline_ms).map(|r| r.holder).collect();
        v.sort_unstable();
        v.dedup();
        v
    }

    /// Is `session`'s response to request `id` held back behind recalls?
    pub fn holds_response(&self, session: SessionId, id: u64) -> bool {
        self.waits.values().any(|w| w.session == session && w.response.as_ref().is_some_and(|r| r.id == id))
    }

    /// Responses waiting (for tests and status).
    pub fn waiting(&self) -> usize {
        self.waits.values().filter(|w| w.response.is_some()).count()
    }

    /// How many inodes each session holds: (shared rights, exclusive rights), for status.
    /// (A walk over every right held: status is asked for rarely.)
    pub fn held_per_session(&self) -> HashMap<SessionId, (u64, u64)> {
        let mut held: HashMap<SessionId, (u64, u64)> = HashMap::new();
        for holders in self.holders.values() {
            for s in holders.keys() {
                held.entry(*s).or_default().0 += 1;
            }
        }
        for s in self.exclusive.values() {
            held.entry(*s).or_default().1 += 1;
        }
        held
    }

    /// Sessions that may cache `ino` (for tests).
    pub fn holders_of(&self, ino: u64) -> Vec<SessionId> {
        self.holders.get(&ino).map(|h| h.keys().copied().collect()).unwrap_or_default()
    }
}

fn release(w: Wait) -> Option<Outgoing> {
    w.response.map(|response| Outgoing::Response { session: w.session, response })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn resp(id: u64) -> p::Response {
        p::Response { id, results: Vec::new(), seq: 0, durable: 0, time: None }
    }

    #[test]
    fn a_change_nobody_else_holds_is_answered_at_once() {
        let mut c = Caps::default();
        c.grant(1, [10, 11]);
        let out = c.changed(1, &[10], resp(5), 0);
        assert_eq!(out, vec![Outgoing::Response { session: 1, response: resp(5) }]);
        assert_eq!(c.holders_of(10), vec![1], "the changer keeps its rights");
    }

    #[test]
    fn holders_are_recalled_and_the_reply_waits_for_all_of_them() {
        let mut c = Caps::default();
        c.grant(1, [10]);
        c.grant(2, [10, 20]);
        c.grant(3, [20]);
        let out = c.changed(1, &[10, 20], resp(7), 100);
        assert_eq!(out.len(), 2, "one recall per other holder: {out:?}");
        let id = match &out[0] {
            Outgoing::Notify { notify: p::Notify::Recall { recall_id, .. }, .. } => *recall_id,
            o => panic!("{o:?}"),
        };
        for o in &out {
            if let Outgoing::Notify { session: 2, notify: p::Notify::Recall { inodes, .. } } = o {
                assert_eq!(inodes, &vec![10, 20]);
            }
        }
        assert_eq!((c.holders_of(10), c.holders_of(20)), (vec![1, 2], vec![2, 3]), "holders until they answer");
        assert!(c.recall_done(2, id).is_empty(), "3 has not answered yet");
        assert_eq!((c.holders_of(10), c.holders_of(20)), (vec![1], vec![3]));
        assert!(c.recall_done(2, id).is_empty(), "a repeated answer changes nothing");
        assert_eq!(c.recall_done(3, id), vec![Outgoing::Response { session: 1, response: resp(7) }]);
        assert_eq!(c.waiting(), 0);
        assert!(c.holders_of(20).is_empty());
    }

    #[test]
    fn a_silent_holder_delays_the_reply_only_until_the_deadline() {
        let mut c = Caps::default();
        c.grant(2, [10]);
        let out = c.changed(1, &[10], resp(1), 1_000);
        assert!(matches!(out[0], Outgoing::Notify { session: 2, .. }));
        assert!(c.expire(1_000 + RECALL_TIMEOUT_MS - 1).is_empty());
        assert_eq!(c.expire(1_000 + RECALL_TIMEOUT_MS), vec![Outgoing::Response { session: 1, response: resp(1) }]);
    }

    #[test]
    fn an_ended_session_releases_what_waits_for_it_and_its_own_waits_go() {
        let mut c = Caps::default();
        c.grant(2, [10]);
        c.grant(1, [20]);
        c.changed(1, &[10], resp(1), 0);
        c.changed(2, &[20], resp(2), 0);
        let out = c.forget_session(2);
        assert_eq!(out, vec![Outgoing::Response { session: 1, response: resp(1) }]);
        assert_eq!(c.waiting(), 0, "session 2's own held reply is dropped with it");
        assert!(c.holders_of(10).is_empty());
    }

    #[test]
    fn a_holder_that_has_not_answered_its_recall_is_waited_for_by_the_next_change_too() {
        // 2 holds 10; 1 changes it and 2's recall is on its way (slow, or lost with 2's
        // connection). Then 3 changes 10: until 2 has answered, it may still answer from
        // what it cached, so 3's reply waits for it.
        let mut c = Caps::default();
        c.grant(2, [10]);
        let out = c.changed(1, &[10], resp(1), 0);
        let [Outgoing::Notify { session: 2, notify: p::Notify::Recall { recall_id: first, .. } }] = out[..] else {
            panic!("{out:?}")
        };
        let out = c.changed(3, &[10], resp(2), 10);
        let [Outgoing::Notify { session: 2, notify: p::Notify::Recall { recall_id: second, .. } }] = out[..] else {
            panic!("3's change must recall 2 again and wait: {out:?}")
        };
        // 2 answers both, in order: each change's reply goes once 2 has dropped 10.
        assert_eq!(c.recall_done(2, first), vec![Outgoing::Response { session: 1, response: resp(1) }]);
        assert_eq!(c.holders_of(10), vec![2], "2 has not answered the second recall yet");
        assert_eq!(c.recall_done(2, second), vec![Outgoing::Response { session: 3, response: resp(2) }]);
        assert!(c.holders_of(10).is_empty());
        // A holder that stays silent past its recall's deadline has let its cache expire:
        // later changes stop waiting for it, but still tell it (an open it answered
        // itself may be on its way: pins wait for its answer), until it answers.
        c.grant(2, [10]);
        c.changed(1, &[10], resp(3), 100);
        assert_eq!(c.expire(100 + RECALL_TIMEOUT_MS), vec![Outgoing::Response { session: 1, response: resp(3) }]);
        let out = c.changed(3, &[10], resp(4), 200 + RECALL_TIMEOUT_MS);
        let [Outgoing::Notify { session: 2, notify: p::Notify::Recall { recall_id: told, .. } }, Outgoing::Response { session: 3, .. }] =
            out[..]
        else {
            panic!("{out:?}")
        };
        assert!(c.lapsed_elsewhere(3, 10));
        assert_eq!(c.recall_done(2, told), vec![], "nothing waited for it");
        assert!(!c.lapsed_elsewhere(3, 10), "its answer ends it");
        // A holder that fetched again after its recall was sent holds the new state: its
        // answer to the old recall does not end that.
        c.grant(2, [10]);
        let out = c.changed(1, &[10], resp(5), 300);
        let [Outgoing::Notify { notify: p::Notify::Recall { recall_id: old, .. }, .. }] = out[..] else {
            panic!("{out:?}")
        };
        c.grant(2, [10]);
        c.recall_done(2, old);
        assert_eq!(c.holders_of(10), vec![2]);
    }

    #[test]
    fn a_holder_that_read_again_after_its_exclusive_recall_was_sent_stays_a_holder() {
        // 1 made 10 and holds it exclusively; 2 needs it, so it is recalled from 1. Before
        // 1 answers, 1 reads 10 again: that reply follows the recall on 1's connection, so
        // 1 caches what it carries. 1's answer must not end that: 3's next change of 10
        // recalls 1 again.
        let mut c = Caps::default();
        c.grant(1, [10]);
        c.grant_exclusive(1, 10);
        let mut out = Vec::new();
        let wait = c.recall_exclusive(2, &[10], 0, &mut out);
        let id = *wait.iter().next().expect("a recall");
        c.grant(1, [10]);
        c.recall_done(1, id);
        assert_eq!(c.holders_of(10), vec![1]);
        assert_eq!(c.exclusive_elsewhere(2, 10), None, "the exclusive right is gone all the same");
        let out = c.changed(3, &[10], resp(1), 10);
        assert!(matches!(out[..], [Outgoing::Notify { session: 1, .. }]), "{out:?}");
        // Without the second read, the answer ends 1's rights on 10.
        let mut c = Caps::default();
        c.grant(1, [10]);
        c.grant_exclusive(1, 10);
        let wait = c.recall_exclusive(2, &[10], 0, &mut Vec::new());
        c.recall_done(1, *wait.iter().next().expect("a recall"));
        assert!(c.holders_of(10).is_empty());
    }
}
