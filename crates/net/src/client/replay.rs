//! What a restarted server may have lost: acknowledged changes not yet durable, kept for
//! replay (`ReplayLog`), and the order in which they and the unanswered calls go again
//! (`plan_restart`).

use super::*;

/// An acknowledged change the server has not yet made durable.
pub(super) struct Unstable {
    pub(super) id: u64,
    pub(super) ops: Vec<p::Op>,
    pub(super) time: Option<p::Time>,
    pub(super) results: Results,
    /// Its place among the session's changes (its `seq`; a replay's new one).
    pub(super) pos: u64,
    /// When its answer came, counted (answers come in the order the changes ran).
    pub(super) answered: u64,
}

pub(super) fn op_bytes(ops: &[p::Op]) -> usize {
    ops.iter()
        .map(|o| match o {
            p::Op::Write { data, .. } => data.len() + 64,
            _ => 128,
        })
        .sum()
}

/// What the client holds for replay.
#[derive(Default)]
pub(super) struct ReplayLog {
    pub(super) unstable: BTreeMap<u64, Unstable>,
    /// Answers taken in, counted.
    pub(super) answers: u64,
    pub(super) bytes: usize,
    /// Entries resent after a restart, in their original order, until their new
    /// responses arrive.
    pub(super) replaying: Vec<Unstable>,
}

impl ReplayLog {
    pub(super) fn acknowledged(&mut self, seq: u64, mut entry: Unstable) {
        if seq == 0 {
            return;
        }
        self.answers += 1;
        entry.answered = self.answers;
        self.bytes += op_bytes(&entry.ops);
        self.unstable.insert(seq, entry);
        while self.bytes > MAX_UNSTABLE_BYTES {
            let Some((seq, old)) = self.unstable.pop_first() else { break };
            self.bytes -= op_bytes(&old.ops);
            tracing::warn!(seq, "replay log full: an acknowledged change is no longer kept for replay");
        }
    }

    pub(super) fn durable(&mut self, through: u64) {
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
    pub(super) fn take_lost(&mut self, through: u64, holes: &[u64]) -> Vec<Unstable> {
        self.durable(through);
        let mut lost: Vec<Unstable> = std::mem::take(&mut self.unstable).into_values().collect();
        let replays = std::mem::take(&mut self.replaying);
        lost.extend(replays.into_iter().filter(|e| e.pos > through || holes.contains(&e.pos)));
        // In the order they ran (the order their answers came).
        lost.sort_by_key(|e| e.answered);
        self.bytes = 0;
        lost
    }

    pub(super) fn replayed(&mut self, id: u64) -> Option<Unstable> {
        let i = self.replaying.iter().position(|e| e.id == id)?;
        Some(self.replaying.remove(i))
    }
}

/// What becomes of a session's pending calls after a restart that kept its changes
/// through `through` (the lost acknowledged ones are replayed first, in the order they ran).
#[derive(Debug, PartialEq, Eq)]
pub(super) struct RestartPlan {
    /// Applied and kept: their answers are lost.
    pub(super) kept: Vec<u64>,
    /// May have run and been lost, or never run: new work after `Replayed`, in the order
    /// they were sent.
    pub(super) late: Vec<u64>,
}

/// Plans what becomes of the pending calls (id, place) after a restart. A change takes its
/// place as it reaches the server, and the record says which places had run when it was
/// last committed: all through `through` but `holes` (changes parked behind another
/// client's rights while later ones ran). So a pending call placed there was kept. Every
/// other one ran, if at all, after every acknowledged change (a session's answers go out
/// in the order its changes ran): it goes after their replays, as new work
/// (docs/protocol.md §4.5).
pub(super) fn plan_restart(through: u64, holes: &[u64], pending: &[(u64, u64)]) -> RestartPlan {
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
    pub(super) fn request(&self) -> p::Request {
        p::Request { id: self.id, ops: self.ops.clone(), time: self.time }
    }
}

/// Writes `c`'s request, giving a change its place among the session's changes when it
/// first goes on the wire. The server numbers a session's changes as they arrive (parked
/// or not), so the change in place n is the one it answers with `seq` n, and after a
/// restart the welcome's `durable_seq` and `durable_holes` tell which unanswered changes
/// it applied and kept (docs/protocol.md §4.5).
pub(super) fn write_call(c: &mut Call, positions: &mut u64, out: &mut Vec<u8>) {
    if c.pos.is_none() && c.ops.iter().any(p::Op::is_mutation) {
        *positions += 1;
        c.pos = Some(*positions);
    }
    write_frame(out, &ClientMessage::Request(c.request()));
}

/// Answers a change the server applied and kept but never answered: writeback (already
/// answered to its caller) as done, and an fsync too (it was kept: its commit happened);
/// any other waiting caller with `ReplyLost` (its result is gone).
pub(super) fn reply_lost(c: Call, addr: &str) {
    let all_fsync = c.ops.iter().all(|o| matches!(o, p::Op::Fsync { .. } | p::Op::At { .. }));
    match c.reply {
        Answer::Wait(_) if !all_fsync => c.reply.send(Err(ClientError::ReplyLost { addr: addr.to_string() })),
        _ => {
            let n = c.ops.len();
            c.reply.send(Ok(vec![Ok(p::Reply::Done); n]));
        }
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
