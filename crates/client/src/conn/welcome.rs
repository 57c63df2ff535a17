//! The answer to a hello: a welcome (resuming the session, after a plain reconnect or a
//! server restart, or starting a new one), or a refusal. After a restart the lost
//! acknowledged changes are replayed, the held locks and rights taken again, and the
//! unanswered calls placed by `plan_restart` (docs/protocol.md §4.5).

use std::collections::{BTreeSet, HashMap, HashSet};

use super::*;
use crate::replay::plan_restart;

impl<R> Connection<R> {
    /// The first message of a handshake.
    pub(super) fn handshake(&mut self, m: ServerMessage) {
        match m {
            ServerMessage::Welcome(w) if (p::OLDEST_PROTOCOL_VERSION..=self.hello_version).contains(&w.version) => {
                self.welcome(w)
            }
            ServerMessage::Welcome(w) => self.fail(ClientError::Refused {
                addr: self.addr.clone(),
                reason: format!(
                    "the server answered in protocol version {}, which this client does not speak",
                    w.version
                ),
            }),
            ServerMessage::Refused { reason, version } => match p::retry_version(self.hello_version, version) {
                // An older server: the connection closes, and the next says hello in its
                // version (the driver reconnects at once).
                Some(v) => {
                    tracing::info!("{} speaks protocol version {version} ({reason}): saying hello in it", self.addr);
                    self.hello_version = v;
                    self.state = State::Away;
                }
                None => self.fail(ClientError::Refused { addr: self.addr.clone(), reason }),
            },
            _ => self.handshake_failed("its first message is not a welcome".into()),
        }
    }

    fn welcome(&mut self, w: p::Welcome) {
        self.lease.heard(self.now);
        if w.fenced {
            self.fenced();
        }
        if self.fsid.is_some_and(|f| f != w.fsid) {
            tracing::error!("{} now serves another file system; failing pending calls", self.addr);
            self.held.clear();
            let err =
                ClientError::Refused { addr: self.addr.clone(), reason: "the server's file system changed".into() };
            for (_, c) in std::mem::take(&mut self.pending) {
                c.reply.send(Err(err.clone()), &mut self.events);
            }
        }
        // Calls written again in their places during the handshake (not resent below).
        let mut rewritten = HashSet::new();
        if self.session.is_some() {
            tracing::info!(resumed = w.resumed, pending = self.pending.len(), "reconnected to {}", self.addr);
            rewritten = self.resume(&w);
        }
        if w.fenced || self.session.is_none() {
            self.positions = 0;
            self.replayed_at = None;
            self.early_below = None;
        }
        self.reconnects += u64::from(self.fsid.is_some());
        self.welcomed = (w.version, w.server_release.clone());
        if self.session.is_none() || w.fenced {
            let release = if w.server_release.is_empty() { "an older crest" } else { w.server_release.as_str() };
            tracing::info!(protocol = w.version, "connected to {} ({release})", self.addr);
        }
        self.session = Some(w.session);
        self.noatime = w.noatime;
        if self.identity.as_ref() != Some(&w.identity) {
            self.identity = Some(w.identity.clone());
            self.events.push_back(Event::Identity(w.identity));
        }
        if self.fsid.is_none() {
            self.fsid = Some(w.fsid);
            self.events.push_back(Event::Ready(Ok(w.fsid)));
        }
        self.state = State::Open;
        // Then everything else still waiting, in id order, with the same ids.
        let ids: Vec<u64> = self.pending.keys().copied().filter(|id| !rewritten.contains(id)).collect();
        for id in ids {
            self.write_call(id);
        }
    }

    /// A resumed (or forgotten) session: what goes again, in which order. Returns the
    /// calls already written.
    fn resume(&mut self, w: &p::Welcome) -> HashSet<u64> {
        let mut rewritten = HashSet::new();
        // After a restart, replay what did not survive it, oldest first. A server that
        // forgot the session entirely knows nothing durable of it.
        let through = match (w.resumed, w.durable_seq, w.fenced) {
            (_, _, true) => None, // nothing of the old session may land now
            (true, None, _) => None,
            (true, Some(d), _) => Some(d),
            (false, _, _) => Some(0),
        };
        // A restart that restored the session: the rights held are taken again while it
        // replays, before anyone's new work runs (§4.5). A server that forgot the session
        // gives nothing back.
        let restored = w.resumed && w.durable_seq.is_some() && !w.fenced;
        let mut late: Vec<u64> = Vec::new();
        let mut release_again = Vec::new();
        if let Some(through) = through {
            // The handles first: a replayed change of a file unlinked while open must
            // find it open (and so must writeback made before the handle's release, going
            // again before `Replayed`). But a file a lost change made exists again only
            // once that change is replayed: its handles go right after it.
            let lost = self.log.take_lost(through, &w.durable_holes);
            let made: BTreeSet<u64> = lost.iter().flat_map(|e| made_by(&e.ops, &e.results)).collect();
            let writeback = self.pending.values().filter(|c| restored && c.reply.answered_already());
            let again: Vec<(u64, &[p::Op])> =
                lost.iter().map(|e| (e.id, &e.ops[..])).chain(writeback.map(|c| (c.id, &c.ops[..]))).collect();
            let closed = self.held.closed_before(&again);
            for r in self.held.reopen(&made, &closed, &self.ids) {
                self.write(&ClientMessage::Request(r));
            }
            // (The changes kept without their answers before the rights: what they
            // touched is not held any more, and not asked back.)
            late = self.replay_lost(through, &w.durable_holes, lost, &closed);
            // The handles opened again only for them close again behind the replays and
            // the writeback.
            release_again = self.held.release_again(&closed, &self.ids);
            let rights_held = match self.rights() {
                Some(r) if restored => r.restored(self.now),
                Some(r) => {
                    r.reset(self.now);
                    Vec::new()
                }
                None => Vec::new(),
            };
            // After a restart the server holds everyone's new work until every restored
            // session has said its replays are all sent. The locks it held go with the
            // replays: nobody else can take them meanwhile.
            for r in self.held.reassert(&rights_held, &self.ids) {
                self.write(&ClientMessage::Request(r));
            }
        } else if !w.fenced {
            late = self.resend(&mut rewritten);
        }
        if restored {
            // Writeback was answered already, under exclusive rights: like a replay it
            // goes before `Replayed`, so that it runs ahead of the new work other clients
            // have waiting — also when those rights were dropped meanwhile (a lease that
            // ran out while away), and the server could not recall them first. Nobody else
            // can have built on what it touches (they were held), and an unanswered call
            // it overtakes had not returned.
            //
            // An open not answered yet goes after `Replayed` as new work: its answer
            // must show the replays of every session, and the server holds the file for
            // it from its arrival (the file may be kept only by it: the old server may
            // have run it before it died, and another mount unlinked the file since).
            let unwritten = self.pending.values().filter(|c| c.pos.is_none() && !late.contains(&c.id));
            let mut early: Vec<u64> = late
                .iter()
                .copied()
                .filter(|id| self.pending.get(id).is_some_and(|c| c.reply.answered_already()))
                .collect();
            early.extend(unwritten.filter(|c| c.reply.answered_already()).map(|c| c.id));
            for id in early {
                self.write_call(id);
                rewritten.insert(id);
            }
            late.retain(|id| !rewritten.contains(id));
        }
        for r in release_again {
            self.write(&ClientMessage::Request(r));
        }
        // Said again after every reconnect of a resumed session: the first `Replayed` may
        // have been lost with the connection even when its replays and re-asserts were
        // answered, and new work sent before it would be taken for replays and run inside
        // the grace period. The server ignores it from a session not replaying.
        if w.resumed && !w.fenced {
            if restored {
                self.replayed_at = Some(self.positions);
                self.early_below = Some(self.pending.keys().next_back().map_or(0, |&id| id + 1));
            }
            self.write(&ClientMessage::Replayed);
        }
        for id in late {
            self.write_call(id);
            rewritten.insert(id);
        }
        rewritten
    }

    /// A plain reconnect of the same session: what may not have arrived goes again,
    /// changes in their places (a repeat is answered from the reply cache), into
    /// `rewritten`. Returns the calls to go after `Replayed`, in order.
    fn resend(&mut self, rewritten: &mut HashSet<u64>) -> Vec<u64> {
        // New work placed after a restart's `Replayed` goes after it again.
        let before = |p: u64| self.replayed_at.is_none_or(|r| p <= r);
        let mut again: Vec<(u64, p::Request)> = self.log.replaying.iter().map(|e| (e.pos, e.request())).collect();
        let mut after: Vec<(u64, u64)> = Vec::new();
        for c in self.pending.values() {
            match c.pos {
                Some(p) if before(p) => {
                    again.push((p, c.request()));
                    rewritten.insert(c.id);
                }
                Some(p) => after.push((p, c.id)),
                None => {}
            }
        }
        // An open answered here and sent behind goes again where it was: before the
        // changes made after it (its process holds the file; an unlink of it sent
        // later must find it open), after those made before it (a create of it) —
        // after `Replayed` too when the next change goes there.
        // (Only where a later change goes again here and no earlier change is still
        // to be placed: that goes after these.)
        let unplaced = |id: u64| {
            self.pending.values().any(|w| w.pos.is_none() && w.id < id && w.ops.iter().any(p::Op::is_mutation))
        };
        let next_change = |id: u64| {
            let placed = again.iter().map(|(p, r)| (*p, r.id)).chain(after.iter().copied());
            placed.filter(|&(_, i)| i > id).map(|(p, _)| p).min()
        };
        let early: Vec<u64> = self
            .pending
            .values()
            .filter(|c| c.pos.is_none() && c.reply.answered_already() && self.early_below.is_some_and(|b| c.id < b))
            .map(|c| c.id)
            .collect();
        let behind: Vec<(u64, u64)> = self
            .pending
            .values()
            .filter(|c| c.pos.is_none() && c.reply.answered_already() && !unplaced(c.id) && !early.contains(&c.id))
            .filter(|c| c.ops.iter().all(|o| matches!(o, p::Op::Open { .. })))
            .filter_map(|c| Some((c.id, next_change(c.id)?)))
            .collect();
        // (Changes by place; an open just before the change it came before.)
        let mut again: Vec<(u64, bool, u64, p::Request)> = again.into_iter().map(|(p, r)| (p, true, r.id, r)).collect();
        let mut after: Vec<(u64, bool, u64)> = after.into_iter().map(|(p, id)| (p, true, id)).collect();
        for (id, next) in behind {
            if before(next) {
                again.push((next, false, id, self.pending[&id].request()));
                rewritten.insert(id);
            } else {
                after.push((next, false, id));
            }
        }
        after.sort_unstable();
        let late = after.into_iter().map(|(_, _, id)| id).collect();
        again.sort_by_key(|(p, change, id, _)| (*p, *change, *id));
        let again: Vec<(u64, p::Request)> = again.into_iter().map(|(p, _, _, r)| (p, r)).collect();
        // In the order a restart sent them (`resume`'s other branch): handles, the
        // replays each followed by the handles of what it made, the rest.
        let made: BTreeSet<u64> = self.log.replaying.iter().flat_map(|e| made_by(&e.ops, &e.results)).collect();
        let [first, mut after_made, rest] = self.held.resend(&made);
        for r in first {
            self.write(&ClientMessage::Request(r));
        }
        let replays: HashMap<u64, Vec<u64>> =
            self.log.replaying.iter().map(|e| (e.id, made_by(&e.ops, &e.results))).collect();
        for (_, req) in again {
            let inos = replays.get(&req.id).cloned().unwrap_or_default();
            self.write(&ClientMessage::Request(req));
            let (now, later): (Vec<_>, Vec<_>) = after_made
                .into_iter()
                .partition(|r| r.ops.iter().any(|op| matches!(op, p::Op::Open { ino, .. } if inos.contains(ino))));
            after_made = later;
            for r in now {
                self.write(&ClientMessage::Request(r));
            }
        }
        for r in after_made.into_iter().chain(rest) {
            self.write(&ClientMessage::Request(r));
        }
        // Before `Replayed` again, where the restart put them (`resume`).
        for id in early {
            self.write_call(id);
            rewritten.insert(id);
        }
        late
    }

    /// After a restart that kept changes through `through` (except `holes`): every
    /// acknowledged change the server lost goes again, in the order they ran (their
    /// answers' order), before anything new. An unanswered one whose place the server
    /// kept was applied and is durable: not sent again (it would run twice). Any other
    /// unanswered one ran, if at all, after them: returned, to go as new work after
    /// `Replayed` (run earlier, it could take what another client's replay needs).
    fn replay_lost(
        &mut self,
        through: u64,
        holes: &[u64],
        lost: Vec<Unstable>,
        closed: &BTreeSet<(u64, u64)>,
    ) -> Vec<u64> {
        let placed: Vec<(u64, u64)> = self.pending.values().filter_map(|c| c.pos.map(|p| (c.id, p))).collect();
        let plan = plan_restart(through, holes, &placed);
        for id in plan.kept {
            if let Some(c) = self.pending.remove(&id) {
                tracing::warn!(id, "{} restarted after applying a change, before answering it", self.addr);
                if let Some(r) = self.rights() {
                    r.reply_lost(&c.ops, self.now);
                }
                self.reply_lost(c);
            }
        }
        let mut unsure = Vec::new();
        for &id in &plan.late {
            if let Some(c) = self.pending.get_mut(&id) {
                c.pos = None;
                // It may have run before the crash took it back, and its effects reached
                // this cache meanwhile in other replies (a listing's attributes): what it
                // touches is not sure until it runs again.
                if !c.reply.answered_already() && c.ops.iter().any(p::Op::is_mutation) {
                    unsure.push(c.ops.clone());
                }
            }
        }
        if let Some(r) = self.rights() {
            for ops in &unsure {
                r.reply_lost(ops, self.now);
            }
        }
        if !lost.is_empty() {
            tracing::warn!("{} restarted: sending again {} change(s) it lost", self.addr, lost.len());
        }
        self.positions = through;
        for mut e in lost {
            self.positions += 1;
            e.pos = self.positions;
            e.answered = self.log.next_answer();
            self.write(&ClientMessage::Request(e.request()));
            let made = made_by(&e.ops, &e.results);
            self.log.replaying.push(e);
            for r in self.held.reopen_files(&made, closed, &self.ids) {
                self.write(&ClientMessage::Request(r));
            }
        }
        plan.late
    }

    /// Answers a change the server applied and kept but never answered: writeback
    /// (already answered to its caller) as done, and an fsync too (it was kept: its commit
    /// happened); any other waiting caller with `ReplyLost` (its result is gone).
    fn reply_lost(&mut self, c: Call<R>) {
        let all_fsync = c.ops.iter().all(|o| matches!(o, p::Op::Fsync { .. } | p::Op::At { .. }));
        let r = match c.reply {
            Answer::Wait(_) if !all_fsync => Err(ClientError::ReplyLost { addr: self.addr.clone() }),
            _ => Ok(vec![Ok(p::Reply::Done); c.ops.len()]),
        };
        c.reply.send(r, &mut self.events);
    }
}

/// True when a replayed request did what it did the first time: the same operations
/// succeeded or failed with the same errno, naming the same inodes. (Times and inode
/// generations are the server's to choose again.)
pub(super) fn same_outcome(first: &Results, again: &Results) -> bool {
    let ino = |r: &p::Reply| match r {
        p::Reply::Attr(a) | p::Reply::Entry(a) => Some(a.ino),
        _ => None,
    };
    first.len() == again.len()
        && first.iter().zip(again).all(|(a, b)| match (a, b) {
            (Ok(a), Ok(b)) => ino(a) == ino(b),
            (Err(a), Err(b)) => a.errno == b.errno,
            _ => false,
        })
}

/// The inodes the changes `ops` made, as their answers `results` named them.
fn made_by(ops: &[p::Op], results: &Results) -> Vec<u64> {
    ops.iter()
        .zip(results)
        .filter(|(op, _)| op.creates())
        .filter_map(|(_, r)| match r {
            Ok(p::Reply::Entry(a)) => Some(a.ino),
            _ => None,
        })
        .collect()
}
