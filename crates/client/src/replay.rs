//! What a restarted server may have lost: acknowledged changes not yet durable, kept for
//! replay (`ReplayLog`), and the order in which they and the unanswered calls go again
//! (`plan_restart`, docs/protocol.md §4.5). Pure bookkeeping: the connection driver feeds
//! it answers and welcomes and sends what it returns.

use std::collections::BTreeMap;

use crest_proto as p;

/// The answers to one request's operations, in order.
pub type Results = Vec<Result<p::Reply, p::OpError>>;

/// Bytes of acknowledged, not yet durable requests kept for replay. The server commits
/// long before this (every 64 MiB written); beyond it the oldest are dropped, loudly.
pub const MAX_UNSTABLE_BYTES: usize = 512 << 20;

/// An acknowledged change the server has not yet made durable.
pub struct Unstable {
    /// Its request id.
    pub id: u64,
    /// What it did.
    pub ops: Vec<p::Op>,
    /// The client's time it carried.
    pub time: Option<p::Time>,
    /// On whose behalf it ran.
    pub caller: p::Caller,
    /// What the server answered.
    pub results: Results,
    /// Its place among the session's changes (its `seq`; a replay's new one).
    pub pos: u64,
    /// When its answer came, counted (answers come in the order the changes ran).
    pub answered: u64,
}

/// What keeping `ops` for replay costs, about (data plus a fixed overhead per operation).
pub fn op_bytes(ops: &[p::Op]) -> usize {
    ops.iter()
        .map(|o| match o {
            p::Op::Write { data, .. } => data.len() + 64,
            _ => 128,
        })
        .sum()
}

/// What the client holds for replay.
#[derive(Default)]
pub struct ReplayLog {
    /// Acknowledged changes not yet durable, by their place (`seq`).
    pub unstable: BTreeMap<u64, Unstable>,
    /// Answers taken in, counted.
    pub answers: u64,
    /// What `unstable` costs (`op_bytes`), bounded by `MAX_UNSTABLE_BYTES`.
    pub bytes: usize,
    /// Entries resent after a restart, in their original order, until their new
    /// responses arrive.
    pub replaying: Vec<Unstable>,
}

impl ReplayLog {
    /// Keeps an acknowledged change (`seq` 0: a change that changed nothing durable).
    pub fn acknowledged(&mut self, seq: u64, mut entry: Unstable) {
        entry.answered = self.next_answer();
        self.acknowledged_replay(seq, entry);
    }

    /// The next count of `Unstable::answered`: for an answer now, or for a replay as it is
    /// sent.
    pub fn next_answer(&mut self) -> u64 {
        self.answers += 1;
        self.answers
    }

    /// A replay's answer: it keeps the count it was given as it was sent, in the order
    /// the replays go (and run). Counted at its answer instead, one answered would sort
    /// after a replay sent later but still unanswered when the server restarts again,
    /// which keeps the count of its first answer — and they would go again out of order.
    pub fn acknowledged_replay(&mut self, seq: u64, entry: Unstable) {
        if seq == 0 {
            return;
        }
        self.bytes += op_bytes(&entry.ops);
        self.unstable.insert(seq, entry);
        while self.bytes > MAX_UNSTABLE_BYTES {
            let Some((seq, old)) = self.unstable.pop_first() else { break };
            self.bytes -= op_bytes(&old.ops);
            tracing::warn!(seq, "replay log full: an acknowledged change is no longer kept for replay");
        }
    }

    /// The request id of the oldest change that may still go again, if any may.
    pub fn oldest_id(&self) -> Option<u64> {
        self.unstable.values().chain(&self.replaying).map(|e| e.id).min()
    }

    /// The server made everything through `through` durable: no replay needed.
    pub fn durable(&mut self, through: u64) {
        while let Some(entry) = self.unstable.first_entry() {
            if *entry.key() > through {
                break;
            }
            self.bytes -= op_bytes(&entry.remove().ops);
        }
    }

    /// After a restart that kept this session's changes through `through`: every
    /// acknowledged change it lost — kept ones, and replays of an earlier restart not yet
    /// answered (one through `through` was applied again and kept: done).
    pub fn take_lost(&mut self, through: u64, holes: &[u64]) -> Vec<Unstable> {
        self.durable(through);
        let mut lost: Vec<Unstable> = std::mem::take(&mut self.unstable).into_values().collect();
        let replays = std::mem::take(&mut self.replaying);
        lost.extend(replays.into_iter().filter(|e| e.pos > through || holes.contains(&e.pos)));
        // In the order they ran (the order their answers came).
        lost.sort_by_key(|e| e.answered);
        self.bytes = 0;
        lost
    }

    /// The replay with request id `id` was answered.
    pub fn replayed(&mut self, id: u64) -> Option<Unstable> {
        let i = self.replaying.iter().position(|e| e.id == id)?;
        Some(self.replaying.remove(i))
    }
}

/// What becomes of a session's pending calls after a restart that kept its changes
/// through `through` (the lost acknowledged ones are replayed first, in the order they ran).
#[derive(Debug, PartialEq, Eq)]
pub struct RestartPlan {
    /// Applied and kept: their answers are lost.
    pub kept: Vec<u64>,
    /// May have run and been lost, or never run: new work after `Replayed`, in the order
    /// they were sent.
    pub late: Vec<u64>,
}

/// Plans what becomes of the pending calls (id, place) after a restart. A change takes its
/// place as it reaches the server, and the record says which places had run when it was
/// last committed: all through `through` but `holes` (changes parked behind another
/// client's rights while later ones ran). So a pending call placed there was kept. Every
/// other one ran, if at all, after every acknowledged change (a session's answers go out
/// in the order its changes ran): it goes after their replays, as new work
/// (docs/protocol.md §4.5).
pub fn plan_restart(through: u64, holes: &[u64], pending: &[(u64, u64)]) -> RestartPlan {
    let (mut kept, mut late) = (Vec::new(), Vec::new());
    for &(id, p) in pending {
        if p <= through && !holes.contains(&p) {
            kept.push(id);
        } else {
            late.push((p, id));
        }
    }
    late.sort_unstable();
    RestartPlan { kept, late: late.into_iter().map(|(_, id)| id).collect() }
}

impl Unstable {
    /// The request that replays it.
    pub fn request(&self) -> p::Request {
        p::Request { id: self.id, ops: self.ops.clone(), time: self.time, caller: self.caller.clone() }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn after_a_restart_kept_changes_stay_and_unanswered_ones_go_last_in_their_order() {
        let pending = [(20, 4), (21, 6), (22, 8), (23, 10), (25, 3)];
        let plan = plan_restart(5, &[], &pending);
        assert_eq!(plan.kept, vec![20, 25], "applied and kept: not sent again");
        assert_eq!(plan.late, vec![21, 22, 23], "after the replays, in the order they were sent");
        // Place 4 waited (parked) while 5 ran and was committed: not kept.
        let plan = plan_restart(5, &[4], &pending);
        assert_eq!((plan.kept, plan.late), (vec![25], vec![20, 21, 22, 23]));
    }
}
