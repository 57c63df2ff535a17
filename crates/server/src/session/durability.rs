//! When changes become durable: a changing request is one store unit with its
//! session's record; the server commits when a request builds on another session's change
//! not yet durable (`Server::unsettled`), when a late change's place is below what its
//! session already calls durable, and after `COMMIT_AFTER_WRITTEN_BYTES` of file data;
//! after each commit every session's `durable` catches up with what it ran.

use super::*;

/// Bytes of file data written since the last commit that make the server commit: bounds
/// both what a crash can lose and what clients keep for replay.
pub const COMMIT_AFTER_WRITTEN_BYTES: u64 = 64 << 20;
/// Stands for the inode-number counter among inodes changed (no inode has number 0):
/// creates and `AllocInodes` change it.
const ALLOCATOR: u64 = 0;

/// The inodes a request involves for `Server::unsettled`: every one it names, and the
/// inode-number counter (`ALLOCATOR`) when it allocates.
pub(super) fn settle_inodes(ops: &[Op]) -> Vec<u64> {
    let mut involved: Vec<u64> = ops.iter().flat_map(op_inodes).collect();
    if ops.iter().any(|op| matches!(op, Op::Create { .. } | Op::Symlink { .. } | Op::AllocInodes { .. })) {
        involved.push(ALLOCATOR);
    }
    involved
}

impl Server {
    /// Opens the store unit of `session`'s change `id` and returns its `seq` (0 for a
    /// session not known). A changing request is one unit with its session record: after
    /// a crash it is wholly durable (and the record says so) or wholly gone.
    pub(super) fn begin_change(&mut self, session: SessionId, id: u64) -> u64 {
        // A session's first change: its record goes to disk first, alone, so a
        // restart restores the session and the grace period waits for its client
        // to replay this change (were the record lost with it, nobody would wait).
        self.record_session(session, "a changing session");
        self.store.begin_unit();
        let mut seq = 0;
        if let Some(s) = self.sessions.get_mut(&session) {
            seq = s.take_place(id);
            s.recorded = true;
            // The inode generations this change draws follow from its request id, which
            // its replay after a restart that lost it keeps (its place may differ: the
            // replays go in the order the changes ran): its files come back with the
            // generations the client was first told (a file handle taken meanwhile stays
            // good), and no other change of the session draws the same. (Not from the
            // session's secret: generations are published to every client, and the seed
            // could be worked back from them.)
            self.store.seed_randomness(generation_seed(self.store.fsid(), session, id));
            let record = encode_record(&s.record());
            if let Err(e) = self.store.put_session_record(session, &record) {
                tracing::error!(session, "cannot record the session: {e}");
            }
        }
        seq
    }

    /// Closes the unit of `session`'s change `seq` whose ops gave `results` (`fsyncs`
    /// marks the fsyncs among them), committing if it came late or enough data waits.
    pub(super) fn end_change(
        &mut self,
        session: SessionId,
        seq: u64,
        results: &mut [Result<Reply, p::OpError>],
        fsyncs: &[bool],
    ) {
        // A change that waited (parked) while later ones ran and were committed:
        // its place is below what this session's answers call durable, so it is
        // made durable before it is answered too.
        let late = self.sessions.get(&session).is_some_and(|s| seq != 0 && seq <= s.durable);
        // Grants the change made or used go into the record within the same unit: a
        // restart then knows exactly which numbers the session may still use.
        if let Some(s) = self.sessions.get_mut(&session).filter(|s| s.grants_changed) {
            s.grants_changed = false;
            if let Err(e) = self.store.put_session_record(session, &encode_record(&s.record())) {
                tracing::error!(session, "cannot record the session: {e}");
            }
        }
        if let Err(e) = self.store.end_unit() {
            // The commit an fsync asked for failed: the fsync fails.
            tracing::error!(session, "commit failed: {e}");
            for (r, _) in results.iter_mut().zip(fsyncs).filter(|(_, f)| **f) {
                *r = Err(error_out(&e));
            }
        }
        // (A grant drawn from the inode pool: `inodes.rs`.)
        let pooled = std::mem::take(&mut self.commit_after_change);
        if late || pooled || self.written_since_commit >= COMMIT_AFTER_WRITTEN_BYTES {
            if let Err(e) = self.store.commit() {
                tracing::error!(session, late, pooled, written = self.written_since_commit, "commit failed: {e}");
            }
        }
    }

    /// After `session`'s request that involved `inodes` ran: if it changed something, or
    /// granted exclusive rights (`grants`: an acquire, under whose rights its client
    /// answers changes itself from what the reply carried), and one of them holds another
    /// session's change not yet durable, commits before it is answered; then counts what
    /// the request left not durable as `session`'s.
    pub(super) fn settle(&mut self, session: SessionId, mutates: bool, grants: bool, inodes: &[u64]) {
        let builds_on_other =
            (mutates || grants) && inodes.iter().any(|i| self.unsettled.get(i).is_some_and(|&s| s != session));
        if builds_on_other {
            self.settling_commits += 1;
            if let Err(e) = self.store.commit() {
                tracing::error!(
                    session,
                    "commit before answering a request that builds on another session's change failed: {e}"
                );
            }
        }
        self.note_commits();
        if mutates && self.store.is_dirty() {
            for &ino in inodes {
                self.unsettled.insert(ino, session);
            }
        }
    }

    /// After a commit, every change applied so far is durable.
    pub(super) fn note_commits(&mut self) {
        let generation = self.store.generation();
        if generation != self.seen_generation {
            self.seen_generation = generation;
            self.unsettled.clear();
            self.written_since_commit = 0;
            for s in self.sessions.values_mut() {
                s.durable = s.top;
            }
        }
    }
}

/// The seed of the inode generations request `id` of session `session` draws, on the
/// file system `fsid`.
fn generation_seed(fsid: [u8; 16], session: SessionId, id: u64) -> u64 {
    let lo = u64::from_le_bytes(fsid[..8].try_into().unwrap_or_default());
    let hi = u64::from_le_bytes(fsid[8..].try_into().unwrap_or_default());
    lo ^ hi.rotate_left(29) ^ session.wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ id.wrapping_mul(0xbf58_476d_1ce4_e5b9)
}
