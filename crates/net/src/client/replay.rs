//! Writing a call on the wire with its place among the session's changes, and what
//! becomes of a change whose answer a restart lost (the replay log and restart plan are
//! `crest_client::replay`'s).

use super::*;

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
