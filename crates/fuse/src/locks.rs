//! The client's side of server-side locks (docs/protocol.md §4.6): what the kernel's lock
//! requests mean on the wire, which owners may hold locks (so that closing a file sends an
//! unlock only when one is due), and the waiting of blocking requests.
//!
//! The server only ever *tries* a lock. F_SETLKW and blocking flock wait here, on a thread
//! of their own, retrying with a backoff from `FIRST_RETRY` doubling to `LAST_RETRY`:
//! FUSE handler threads are few (4), and a waiting request must not hold one, or the very
//! unlock it waits for could not get through. While it waits, the requesting thread is
//! watched in /proc: the kernel cannot interrupt a FUSE request once the daemon has it
//! (fuser answers FUSE_INTERRUPT with ENOSYS), so a waiter that is killed or gets a signal
//! is answered EINTR from here, as a local F_SETLKW would be.

use std::collections::{HashMap, HashSet};
use std::sync::{Mutex, Weak};
use std::time::Duration;

use crest_net::Client;
use crest_proto::{self as p, LockKind, Op};
use fuser::{Errno, ReplyEmpty};

/// The first pause before a blocked lock request is tried again.
pub const FIRST_RETRY: Duration = Duration::from_millis(1);
/// The longest pause between tries: how late, at most, a waiter notices the lock is free.
pub const LAST_RETRY: Duration = Duration::from_millis(50);

/// The kernel's largest file offset (`OFFSET_MAX`): the end of a lock "to EOF".
const OFFSET_MAX: u64 = i64::MAX as u64;

/// The wire's lock kind for the kernel's `l_type`.
pub fn kind_in(typ: i32) -> Option<LockKind> {
    match typ {
        libc::F_RDLCK => Some(LockKind::Read),
        libc::F_WRLCK => Some(LockKind::Write),
        libc::F_UNLCK => Some(LockKind::Unlock),
        _ => None,
    }
}

/// The kernel's `l_type` for a wire lock kind.
pub fn kind_out(kind: LockKind) -> i32 {
    match kind {
        LockKind::Read => libc::F_RDLCK,
        LockKind::Write => libc::F_WRLCK,
        LockKind::Unlock => libc::F_UNLCK,
    }
}

/// The wire's end of a range from the kernel's: `OFFSET_MAX` (and beyond) means to the
/// end of the file, however far it grows.
pub fn end_in(end: u64) -> u64 {
    if end >= OFFSET_MAX {
        p::LOCK_TO_EOF
    } else {
        end
    }
}

/// The kernel's end from the wire's: the kernel refuses (EIO) an end past `OFFSET_MAX`.
pub fn end_out(end: u64) -> u64 {
    end.min(OFFSET_MAX)
}

/// Which system call a lock request came from. FUSE says flock or not in the request
/// (FUSE_LK_FLOCK), but fuser 0.18 drops that bit, so the daemon asks /proc which call the
/// requesting thread is blocked in (it stays there until the reply).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LockCall {
    /// flock(2): whole-file, owned by the open file, its own namespace.
    Flock,
    /// fcntl(2) with an F_OFD_* command: POSIX semantics, owned by the open file.
    Ofd,
    /// fcntl(2) F_SETLK/F_SETLKW/F_GETLK (and lockf(3)), owned by the process — and
    /// whatever /proc could not tell (a daemon without the right to read another user's
    /// /proc/PID/syscall): then flock locks are POSIX locks owned by the open file, which
    /// still exclude each other across clients but also meet fcntl locks, as on NFS.
    Posix,
}

/// Classifies the lock request of thread `tid` (as the kernel names it to the daemon).
pub fn lock_call(tid: u32) -> LockCall {
    if tid == 0 {
        return LockCall::Posix; // the caller lives in a pid namespace the daemon cannot see
    }
    match std::fs::read_to_string(format!("/proc/{tid}/syscall")) {
        Ok(s) => classify_syscall(&s),
        Err(e) => {
            tracing::debug!(tid, "cannot tell flock from fcntl: /proc/{tid}/syscall: {e}");
            LockCall::Posix
        }
    }
}

/// Classifies a /proc/PID/syscall line: "NR ARG1 ARG2 …" (decimal number, hex arguments)
/// of a thread blocked in a system call.
fn classify_syscall(line: &str) -> LockCall {
    let mut fields = line.split_whitespace();
    let nr = fields.next().and_then(|f| f.parse::<i64>().ok());
    let cmd = fields.nth(1).and_then(|f| i64::from_str_radix(f.trim_start_matches("0x"), 16).ok());
    match (nr, cmd) {
        (Some(nr), _) if nr == libc::SYS_flock => LockCall::Flock,
        (Some(nr), Some(cmd))
            if nr == libc::SYS_fcntl
                && [libc::F_OFD_GETLK, libc::F_OFD_SETLK, libc::F_OFD_SETLKW].contains(&(cmd as i32)) =>
        {
            LockCall::Ofd
        }
        _ => LockCall::Posix,
    }
}

/// True when thread `tid`, waiting for a lock, is gone or has a signal to take (which
/// would interrupt a local F_SETLKW): `caller::process_interrupted`.
fn waiter_interrupted(tid: u32) -> bool {
    crate::caller::process_interrupted(tid)
}

/// Owners that may hold locks on the server. Close paths consult it so that a close
/// without locks costs no round trip.
#[derive(Debug, Default)]
pub struct Owners {
    /// (inode, process owner) pairs that took POSIX locks: the kernel's FLUSH at each
    /// close by the process must drop them.
    posix: HashSet<(u64, u64)>,
    /// Owners that are the open file itself (flock, OFD), by file handle, with their
    /// namespace (flock or not): the RELEASE of the handle drops them.
    by_handle: HashMap<u64, HashSet<(u64, bool)>>,
}

impl Owners {
    /// Notes that `owner` asked for a lock (not an unlock) on `ino` through handle `fh`.
    pub fn note(&mut self, ino: u64, fh: u64, owner: u64, call: LockCall) {
        match call {
            LockCall::Posix => {
                self.posix.insert((ino, owner));
            }
            LockCall::Ofd => {
                self.by_handle.entry(fh).or_default().insert((owner, false));
            }
            LockCall::Flock => {
                self.by_handle.entry(fh).or_default().insert((owner, true));
            }
        }
    }

    /// At a close by process owner `owner`: true if it may hold POSIX locks on `ino`
    /// (and forgets it: the caller unlocks).
    pub fn take_posix(&mut self, ino: u64, owner: u64) -> bool {
        self.posix.remove(&(ino, owner))
    }

    /// At the release of handle `fh`: the (owner, flock) pairs to unlock.
    pub fn take_handle(&mut self, fh: u64) -> Vec<(u64, bool)> {
        self.by_handle.remove(&fh).map(|s| s.into_iter().collect()).unwrap_or_default()
    }
}

/// An unlock of everything `owner` holds on `ino` in one namespace.
pub fn unlock_all(ino: u64, owner: u64, flock: bool) -> Op {
    Op::SetLock { ino, owner, start: 0, end: p::LOCK_TO_EOF, kind: LockKind::Unlock, flock, pid: 0 }
}

/// Retries `op` (a `SetLock` that met a conflict) until the server grants it, the
/// requesting thread `tid` is interrupted, or the mount goes; then replies. Runs on a
/// thread of its own (see the module comment); `granted` runs on success.
pub fn wait_for_lock(
    client: Weak<Client>,
    op: Op,
    tid: u32,
    reply: ReplyEmpty,
    granted: impl FnOnce() + Send + 'static,
) -> std::io::Result<()> {
    // The reply travels in a slot the caller keeps if the thread cannot start, so the
    // request is still answered (ENOLCK) rather than dropped.
    let slot = std::sync::Arc::new(Mutex::new(Some(reply)));
    let mine = slot.clone();
    let spawned = std::thread::Builder::new().name("crest-lockwait".into()).spawn(move || {
        let Some(reply) = mine.lock().unwrap_or_else(|e| e.into_inner()).take() else { return };
        let mut pause = FIRST_RETRY;
        loop {
            std::thread::sleep(pause);
            if waiter_interrupted(tid) {
                tracing::debug!(tid, "lock wait interrupted");
                return reply.error(Errno::EINTR);
            }
            let Some(client) = client.upgrade() else {
                return reply.error(Errno::EINTR); // unmounted
            };
            match client.call_one(op.clone()) {
                Ok(_) => {
                    granted();
                    return reply.ok();
                }
                Err(e) if e.errno == libc::EAGAIN => {}
                Err(e) => {
                    tracing::warn!(tid, "lock wait: {}", e.message);
                    return reply.error(Errno::from_i32(e.errno));
                }
            }
            pause = (pause * 2).min(LAST_RETRY);
        }
    });
    if let Err(e) = spawned {
        if let Some(reply) = slot.lock().unwrap_or_else(|e| e.into_inner()).take() {
            reply.error(Errno::from_i32(libc::ENOLCK));
        }
        return Err(e);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kinds_and_ends() {
        for k in [LockKind::Read, LockKind::Write, LockKind::Unlock] {
            assert_eq!(kind_in(kind_out(k)), Some(k));
        }
        assert_eq!(kind_in(99), None);
        assert_eq!(end_in(OFFSET_MAX), p::LOCK_TO_EOF);
        assert_eq!(end_in(u64::MAX), p::LOCK_TO_EOF);
        assert_eq!(end_in(4095), 4095);
        assert_eq!(end_out(p::LOCK_TO_EOF), OFFSET_MAX);
        assert_eq!(end_out(4095), 4095);
    }

    #[test]
    fn syscall_lines() {
        let flock = format!("{} 0x3 0x2 0x0 0x0 0x0 0x0 0x7ffd0 0x7f00", libc::SYS_flock);
        assert_eq!(classify_syscall(&flock), LockCall::Flock);
        let ofd = format!("{} 0x3 {:#x} 0x7ffd0 0x0 0x0 0x0 0x7ffd0 0x7f00", libc::SYS_fcntl, libc::F_OFD_SETLKW);
        assert_eq!(classify_syscall(&ofd), LockCall::Ofd);
        let posix = format!("{} 0x3 {:#x} 0x7ffd0 0x0 0x0 0x0 0x7ffd0 0x7f00", libc::SYS_fcntl, libc::F_SETLKW);
        assert_eq!(classify_syscall(&posix), LockCall::Posix);
        assert_eq!(classify_syscall("running"), LockCall::Posix);
        assert_eq!(classify_syscall(""), LockCall::Posix);
    }

    #[test]
    fn this_thread_is_in_no_lock_call_and_has_no_signal() {
        // This thread, reading its own /proc entries, is in read(2): fcntl semantics, and
        // nothing pending.
        let link = std::fs::read_link("/proc/thread-self").expect("/proc/thread-self"); // "PID/task/TID"
        let tid: u32 = link.file_name().and_then(|n| n.to_str()?.parse().ok()).expect("tid");
        assert_eq!(lock_call(tid), LockCall::Posix);
        assert!(!waiter_interrupted(tid));
        assert!(waiter_interrupted(u32::MAX), "no such thread");
        assert!(!waiter_interrupted(0), "unknown: keep waiting");
    }

    #[test]
    fn owners() {
        let mut o = Owners::default();
        o.note(5, 1, 100, LockCall::Posix);
        o.note(5, 1, 200, LockCall::Flock);
        o.note(5, 1, 300, LockCall::Ofd);
        assert!(!o.take_posix(5, 200));
        assert!(o.take_posix(5, 100));
        assert!(!o.take_posix(5, 100), "forgotten once unlocked");
        let mut h = o.take_handle(1);
        h.sort_unstable();
        assert_eq!(h, vec![(200, true), (300, false)]);
        assert!(o.take_handle(1).is_empty());
    }
}
