//! Writeback batching rules: what may join a batch of writeback calls before it is sent.
//! The connection driver's merger takes consecutive writeback calls into one request;
//! these decide whether a write or a setattr joins the one before it (`join_write`,
//! `join_setattr`), whether a create and its removal cancel (`cancel_pair`), and whether
//! an open and its release do (`cancel_open`).

use crest_proto as p;

/// True when `op` names inode `ino` in any role (the inode it acts on, a directory it
/// acts in, a new inode's number).
pub fn mentions(op: &p::Op, ino: u64) -> bool {
    use p::Op as O;
    match op {
        O::StatFs | O::At { .. } | O::AllocInodes { .. } | O::Uploads { .. } => false,
        O::Lookup { parent, .. }
        | O::Create { parent, .. }
        | O::Symlink { parent, .. }
        | O::Unlink { parent, .. }
        | O::Rmdir { parent, .. } => *parent == ino,
        O::Rename { parent, new_parent, .. } => *parent == ino || *new_parent == ino,
        O::Link { ino: i, parent, .. } | O::CreateAt { ino: i, parent, .. } | O::SymlinkAt { ino: i, parent, .. } => {
            *i == ino || *parent == ino
        }
        O::GetAttr { ino: i }
        | O::SetAttr { ino: i, .. }
        | O::ReadDir { ino: i, .. }
        | O::ReadLink { ino: i }
        | O::Open { ino: i, .. }
        | O::Release { ino: i, .. }
        | O::Read { ino: i, .. }
        | O::Write { ino: i, .. }
        | O::WriteBack { ino: i, .. }
        | O::MapObject { ino: i, .. }
        | O::Append { ino: i, .. }
        | O::Fallocate { ino: i, .. }
        | O::Fsync { ino: i }
        | O::SetXattr { ino: i, .. }
        | O::GetXattr { ino: i, .. }
        | O::ListXattr { ino: i }
        | O::RemoveXattr { ino: i, .. }
        | O::SetLock { ino: i, .. }
        | O::GetLock { ino: i, .. }
        | O::Acquire { ino: i }
        | O::Reassert { ino: i, .. } => *i == ino,
    }
}

/// Joins `next` (at `next_time`), a lone write that continues the batch's last operation —
/// a write of the same inode ending where `next`'s starts — into that operation: a run of small appends (a
/// log written a few bytes per call, under exclusive rights) then costs the server one
/// write per batch, not one per call. The joined write runs at `next`'s clock: its caller
/// was told the times of the last write, and the earlier caller's times are overtaken by
/// them on the server as they would be by `next`'s own write.
pub fn join_write(
    ops: &mut [p::Op],
    base_time: &mut Option<p::Time>,
    clock: &mut Option<p::Time>,
    next: &[p::Op],
    next_time: Option<p::Time>,
) -> bool {
    let [p::Op::Write { ino, offset, data }] = next else { return false };
    let Some(p::Op::Write { ino: last_ino, offset: last_offset, data: last_data }) = ops.last() else {
        return false;
    };
    let continues = last_offset.checked_add(last_data.len() as u64) == Some(*offset);
    if *last_ino != *ino || !continues || last_data.len() + data.len() > p::MAX_IO_BYTES as usize {
        return false;
    }
    if !retime_last(ops, base_time, clock, next_time) {
        return false;
    }
    if let Some(p::Op::Write { data: last_data, .. }) = ops.last_mut() {
        last_data.extend_from_slice(data);
    }
    true
}

/// Joins `next` (at `next_time`), a lone setattr of the inode whose attributes the batch's
/// last operation sets too, into that operation: the times, owner and mode tar gives each
/// file it makes (three calls, answered by the mount) then cost the server one change. The
/// joined setattr runs at `next`'s clock and leaves the inode as the two in turn would:
/// each field as the later one set it, the change time `next`'s. Not when that could
/// differ: a size change in either (it moves data and times); `next` changing the owner or
/// group after the last set the mode or the owner or group (each change of hands drops the
/// set-user-ID bit, which the server does only for a chown without a mode, and only when
/// the owner or group it is given differs from the one before: two joined would skip the
/// one in between); a time the last set to "now" under another clock than `next`'s.
pub fn join_setattr(
    ops: &mut [p::Op],
    base_time: &mut Option<p::Time>,
    clock: &mut Option<p::Time>,
    next: &[p::Op],
    next_time: Option<p::Time>,
) -> bool {
    let [p::Op::SetAttr { ino, set: b }] = next else { return false };
    let Some(p::Op::SetAttr { ino: last_ino, set: a }) = ops.last() else { return false };
    if last_ino != ino || a.size_bytes.is_some() || b.size_bytes.is_some() {
        return false;
    }
    if (b.uid.is_some() || b.gid.is_some()) && (a.mode.is_some() || a.uid.is_some() || a.gid.is_some()) {
        return false;
    }
    let now = Some(p::SetTime::Now);
    if (a.atime == now || a.mtime == now) && next_time != *clock {
        return false;
    }
    let joined = p::SetAttr {
        mode: b.mode.or(a.mode),
        uid: b.uid.or(a.uid),
        gid: b.gid.or(a.gid),
        size_bytes: None,
        atime: b.atime.or(a.atime),
        mtime: b.mtime.or(a.mtime),
        ctime: b.ctime,
    };
    if !retime_last(ops, base_time, clock, next_time) {
        return false;
    }
    if let Some(p::Op::SetAttr { set, .. }) = ops.last_mut() {
        *set = joined;
    }
    true
}

/// Moves the clock the batch's last operation runs at to `next_time`: the request's own
/// (when it is the only operation) or that of an `At` just before it. Elsewhere an `At`
/// would have to be inserted, shifting the results of the part it lies in: false then,
/// and nothing changed.
fn retime_last(
    ops: &mut [p::Op],
    base_time: &mut Option<p::Time>,
    clock: &mut Option<p::Time>,
    next_time: Option<p::Time>,
) -> bool {
    if next_time == *clock {
        return true;
    }
    let Some(time) = next_time else { return false };
    let n = ops.len();
    if n == 1 {
        *base_time = Some(time);
    } else if let Some(p::Op::At { time: t }) = n.checked_sub(2).and_then(|i| ops.get_mut(i)) {
        *t = time;
    } else {
        return false;
    }
    *clock = Some(time);
    true
}

/// Cancels a create and its removal that are both still in one unsent batch (`ops`, at
/// clock `time` until an `Op::At`), when the removal is its last operation: an inode
/// made and removed again before the server heard of it never reaches the server.
///
/// Sound only when nothing left can tell: the create (`CreateAt`/`SymlinkAt`, numbered by
/// this client, so nobody else can name the inode) is in the batch, hence so is every
/// later operation on the inode (a call that waits ends a batch); no rename or link came
/// after it (the name may have moved, the inode gained a name); every operation naming
/// the inode is one that only changes it (write, setattr, xattrs, fallocate) or an open
/// matched by its release (no descriptor is left through which a later call could reach
/// it); and nothing uses it as a directory (every entry made in it was cancelled first).
/// Then the create and those operations become `Op::At` of the clock in force there (so
/// every result slot stays, answered `Done`, and every completion still runs), and the
/// removal becomes a setattr of the directory's mtime to its clock — the one trace the
/// pair leaves on the server (its ctime follows; the link counts are unchanged).
/// Returns true when it cancelled.
pub fn cancel_pair(ops: &mut [p::Op], time: Option<p::Time>) -> bool {
    let Some(last) = ops.len().checked_sub(1) else { return false };
    let (parent, name, rmdir) = match &ops[last] {
        p::Op::Unlink { parent, name } => (*parent, name.clone(), false),
        p::Op::Rmdir { parent, name } => (*parent, name.clone(), true),
        _ => return false,
    };
    let mut created = None;
    for (i, op) in ops[..last].iter().enumerate().rev() {
        match op {
            p::Op::CreateAt { ino, parent: d, name: n, kind, .. } if *d == parent && *n == name => {
                if (*kind == p::FileType::Directory) != rmdir {
                    return false;
                }
                created = Some((i, *ino));
                break;
            }
            p::Op::SymlinkAt { ino, parent: d, name: n, .. } if *d == parent && *n == name => {
                if rmdir {
                    return false;
                }
                created = Some((i, *ino));
                break;
            }
            p::Op::Rename { .. } | p::Op::Link { .. } | p::Op::Create { .. } | p::Op::Symlink { .. } => return false,
            p::Op::Unlink { parent: d, name: n } | p::Op::Rmdir { parent: d, name: n }
                if *d == parent && *n == name =>
            {
                return false;
            }
            _ => {}
        }
    }
    let Some((at, ino)) = created else { return false };
    let mut gone = vec![at];
    let (mut opens, mut releases) = (0usize, 0usize);
    for (i, op) in ops.iter().enumerate().take(last).skip(at + 1) {
        match op {
            p::Op::Write { ino: x, .. }
            | p::Op::WriteBack { ino: x, .. }
            | p::Op::MapObject { ino: x, .. }
            | p::Op::Append { ino: x, .. }
            | p::Op::SetAttr { ino: x, .. }
            | p::Op::Fallocate { ino: x, .. }
            | p::Op::SetXattr { ino: x, .. }
            | p::Op::RemoveXattr { ino: x, .. }
                if *x == ino =>
            {
                gone.push(i)
            }
            p::Op::Open { ino: x, .. } if *x == ino => {
                opens += 1;
                gone.push(i);
            }
            p::Op::Release { ino: x, .. } if *x == ino => {
                releases += 1;
                gone.push(i);
            }
            op if mentions(op, ino) => return false,
            _ => {}
        }
    }
    if opens != releases {
        return false;
    }
    // The clock in force at each operation.
    let mut clock = time;
    let mut clocks = Vec::with_capacity(ops.len());
    for op in ops.iter() {
        if let p::Op::At { time } = op {
            clock = Some(*time);
        }
        clocks.push(clock);
    }
    if gone.iter().chain([&last]).any(|&i| clocks[i].is_none()) {
        return false;
    }
    for i in gone {
        if let Some(time) = clocks[i] {
            ops[i] = p::Op::At { time };
        }
    }
    ops[last] = p::Op::SetAttr { ino: parent, set: p::SetAttr { mtime: Some(p::SetTime::Now), ..Default::default() } };
    true
}

/// True when the server checks no permission for any of `ops` (releases of handles, clock
/// changes): they may run under any caller's credentials, so join any caller's batch.
pub fn caller_free(ops: &[p::Op]) -> bool {
    ops.iter().all(|op| matches!(op, p::Op::Release { .. } | p::Op::At { .. }))
}

/// When the last operation of `ops` releases a handle whose `Open` is earlier in `ops`,
/// cancels both: the server needs to know of an open only while it lasts, and here it
/// would last inside one request. A file read and closed (`cat`, a compiler's headers)
/// then costs the server no open and no release. Not when an operation between them may
/// remove a name (the inode may lose its last one, and the server keeps a nameless inode
/// only for its open handles: what follows may reach it through this one) or takes a
/// lock on the inode. Both become `Op::At` of the clock in force there, so every result
/// slot stays (answered `Done`) and every completion runs. Returns true when it
/// cancelled.
pub fn cancel_open(ops: &mut [p::Op], time: Option<p::Time>) -> bool {
    let Some(last) = ops.len().checked_sub(1) else { return false };
    let p::Op::Release { ino, handle } = ops[last] else { return false };
    let mut open = None;
    for (i, op) in ops[..last].iter().enumerate().rev() {
        match op {
            p::Op::Open { ino: x, handle: h, .. } if *x == ino && *h == handle => {
                open = Some(i);
                break;
            }
            p::Op::Unlink { .. } | p::Op::Rmdir { .. } | p::Op::Rename { .. } => return false,
            p::Op::SetLock { ino: x, .. } if *x == ino => return false,
            _ => {}
        }
    }
    let Some(open) = open else { return false };
    let (Some(at_open), Some(at_release)) = (clock_at(ops, open, time), clock_at(ops, last, time)) else {
        return false;
    };
    ops[open] = p::Op::At { time: at_open };
    ops[last] = p::Op::At { time: at_release };
    true
}

/// The clock operation `i` of `ops` runs at: the last `Op::At` before it, else the
/// request's own `time`.
fn clock_at(ops: &[p::Op], i: usize, time: Option<p::Time>) -> Option<p::Time> {
    ops[..i].iter().rev().find_map(|op| if let p::Op::At { time } = op { Some(*time) } else { None }).or(time)
}
