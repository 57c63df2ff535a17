//! Leases and fencing: when a session is heard from, when its connection goes, and what
//! `tick` takes from sessions that fell silent (past `caps::LEASE_MS`), stayed
//! disconnected (past `caps::DISCONNECTED_FENCE_MS`), sat on an exclusive recall past its
//! deadline, or were restored after a restart and never resumed. A fenced session loses its
//! rights, locks, open files and waiting requests, and its later requests are refused.

use super::*;

/// How long a session restored from its record after a restart waits for its client to
/// come back before its record is dropped.
pub const RESTORED_SESSION_GRACE_MS: u64 = 15 * 60 * 1000;

impl Server {
    /// `session` said something at `now_ms`: its lease runs from here.
    pub fn heard(&mut self, session: SessionId, now_ms: u64) {
        let last = self.last_heard.entry(session).or_insert(now_ms);
        *last = (*last).max(now_ms);
    }

    /// `session`'s connection is gone (it may come back and resume). After
    /// `DISCONNECTED_HOLDER_MS` it no longer holds anything: changes stop waiting for it.
    pub fn disconnected(&mut self, session: SessionId, now_ms: u64) {
        // A fenced or ended session's connection closing leaves nothing to track.
        if !self.sessions.contains_key(&session) {
            return;
        }
        self.disconnected.insert(session, now_ms);
        self.shared_lapsed.remove(&session);
    }

    /// The server itself stood still for `gap_ms` until `now_ms` (one long operation: a
    /// fallocate of gigabytes writes its zeros on the store's thread). What clients sent
    /// meanwhile waits unread, so the stall must not count against their leases or recall
    /// deadlines: every such clock moves on by it. The driver, which sees the wall clock,
    /// says so before the next `tick`.
    pub fn forgive_stall(&mut self, now_ms: u64, gap_ms: u64) {
        tracing::warn!(stall_ms = gap_ms, "the server stood still; leases and recall deadlines move on by as much");
        for at in self.last_heard.values_mut().chain(self.disconnected.values_mut()) {
            *at = at.saturating_add(gap_ms).min(now_ms);
        }
        if let Some(until) = &mut self.grace_until {
            *until = until.saturating_add(gap_ms);
        }
        self.caps.postpone_deadlines(gap_ms);
    }

    /// Takes everything back from sessions that went silent past their lease (or whose
    /// connections stayed gone): rights, locks, open files, waiting requests. Their later
    /// requests are refused, so nothing they answered themselves can land after others
    /// moved on. However many there are, their fencing costs one commit.
    pub(super) fn fence(&mut self, sessions: &[(SessionId, &str)]) {
        let mut marked = 0;
        for &(id, why) in sessions {
            tracing::warn!(session = id, "session fenced: {why}");
            self.activity.fences += 1;
            let secret = self.sessions.get(&id).map(|s| s.secret);
            self.end_session(id);
            self.fenced.insert(id);
            if let Some(secret) = secret {
                match self.store.put_session_record(id, &encode_fenced_marker(secret)) {
                    Ok(()) => {
                        self.fenced_markers.insert(id, None);
                        marked += 1;
                    }
                    Err(e) => tracing::error!(session = id, "cannot record the fencing: {e}"),
                }
            }
        }
        // The records' replacement by the markers is made durable at once, before
        // anything the fencing releases is sent: after a restart within the commit
        // interval a fenced session would otherwise be restored, and its client would take
        // back locks and replay changes that others have moved past.
        if marked > 0 {
            if let Err(e) = self.store.commit() {
                tracing::error!(sessions = marked, "cannot commit the end of fenced sessions: {e}");
            }
        }
        self.note_commits();
    }

    /// Drops the durable markers of fenced sessions `RESTORED_SESSION_GRACE_MS` after the
    /// first tick that saw them.
    pub(super) fn drop_stale_fenced_markers(&mut self, now_ms: u64) {
        let mut stale_markers: Vec<SessionId> = Vec::new();
        for (id, deadline) in &mut self.fenced_markers {
            if now_ms >= *deadline.get_or_insert(now_ms + RESTORED_SESSION_GRACE_MS) {
                stale_markers.push(*id);
            }
        }
        stale_markers.sort_unstable();
        for id in stale_markers {
            self.fenced_markers.remove(&id);
            if let Err(e) = self.store.delete_session_record(id) {
                tracing::warn!(session = id, "cannot drop a fenced session's marker: {e}");
            }
            self.end_grants(id);
        }
    }

    /// Ends the restored sessions whose clients did not come back within
    /// `RESTORED_SESSION_GRACE_MS` of the first tick after the restart.
    pub(super) fn drop_unresumed(&mut self, now_ms: u64) {
        let mut expired = Vec::new();
        for (id, s) in &mut self.sessions {
            if let Some(deadline) = &mut s.awaiting_resume {
                let at = *deadline.get_or_insert(now_ms + RESTORED_SESSION_GRACE_MS);
                if now_ms >= at {
                    expired.push(*id);
                }
            }
        }
        // Sessions are kept in a hash map: sort, so that what this sends comes out in
        // the same order every time (a simulator seed must replay exactly).
        expired.sort_unstable();
        for id in expired {
            tracing::warn!(session = id, "client did not come back after the restart; its session is dropped");
            self.end_session(id);
        }
    }

    /// Fences the sessions whose lease lapsed.
    pub(super) fn fence_lapsed(&mut self, now_ms: u64) {
        // Leases: silent past LEASE_MS, or disconnected past DISCONNECTED_FENCE_MS, or
        // holding exclusive rights a recall asked for past its deadline
        // (`caps::ExclusiveRecall`): fenced. (Sessions
        // restored after a restart are not counted until their client comes back.)
        let mut fence: Vec<(SessionId, &str)> = Vec::new();
        for (&id, &at) in &self.last_heard {
            if let Some(&gone) = self.disconnected.get(&id) {
                if now_ms >= gone + crate::caps::DISCONNECTED_FENCE_MS {
                    fence.push((id, "disconnected past the fencing delay"));
                    continue;
                }
            }
            if now_ms >= at + crate::caps::LEASE_MS {
                fence.push((id, "silent past its lease"));
            }
        }
        // (A holder whose connection is gone has the fencing delay to come back; it hears
        // the recall again then, and has its time to answer from there.)
        self.caps.renew_resent(now_ms);
        for id in self.caps.late_exclusive_holders(now_ms) {
            if !self.disconnected.contains_key(&id) {
                fence.push((id, "did not return exclusive rights in time"));
            }
        }
        fence.sort_unstable();
        fence.dedup_by_key(|f| f.0);
        fence.retain(|&(id, _)| {
            let known = self.sessions.contains_key(&id);
            if !known {
                self.last_heard.remove(&id);
            }
            known
        });
        self.fence(&fence);
    }

    /// Sessions disconnected past `caps::DISCONNECTED_HOLDER_MS` no longer hold shared
    /// rights: changes stop waiting for them.
    pub(super) fn lapse_disconnected(&mut self, now_ms: u64) {
        // Each disconnection lapses once: the ones already done are kept (until the
        // session is fenced, ends or reconnects) so that a tick does not do them again.
        self.shared_lapsed.retain(|s| self.disconnected.contains_key(s));
        let mut gone: Vec<SessionId> = self
            .disconnected
            .iter()
            .filter(|(s, &at)| now_ms >= at + crate::caps::DISCONNECTED_HOLDER_MS && !self.shared_lapsed.contains(s))
            .map(|(s, _)| *s)
            .collect();
        if gone.is_empty() {
            return;
        }
        gone.sort_unstable();
        self.shared_lapsed.extend(&gone);
        // Their shared rights lapse (their caches have expired by now); their locks and
        // exclusive rights wait for the fencing delay, in case they come back.
        let out = self.caps.forget_shared(&gone);
        self.outbox.extend(out);
    }
}
