//! Which process each handler thread is serving, and whether that process has a signal
//! to take. fuser does not pass the kernel's FUSE_INTERRUPT on (it answers ENOSYS, and
//! the kernel stops sending them), and a process killed while its request is with the
//! daemon waits until the daemon answers. So a call that waits long (an unreachable
//! server) asks here, now and then, and gives up with EINTR for a caller that was sent
//! SIGINT, SIGTERM, SIGKILL or any other signal it neither blocks nor ignores.

use std::cell::{Cell, RefCell};
use std::time::{Duration, Instant};

use crest_proto as p;

/// Who a handler thread serves: the request's thread id, fs uid and fs gid.
#[derive(Clone, Copy, Default)]
struct Serving {
    pid: u32,
    uid: u32,
    gid: u32,
}

thread_local! {
    static CALLER: Cell<Serving> = const { Cell::new(Serving { pid: 0, uid: 0, gid: 0 }) };
    /// The last caller's supplementary groups, read from /proc: (pid, when, groups).
    static GROUPS: RefCell<Option<(u32, Instant, Vec<u32>)>> = const { RefCell::new(None) };
}

/// How long a thread's supplementary groups, once read, are taken as still current: a
/// process rarely changes them, and reading /proc for every call would cost more than
/// most calls.
const GROUPS_FRESH: Duration = Duration::from_secs(1);

/// The process this thread serves, from `enter` until dropped.
pub struct Caller {
    previous: Serving,
}

impl Caller {
    /// This thread now serves thread `pid` (the FUSE request's) with fs uid `uid` and fs
    /// gid `gid`.
    pub fn enter(pid: u32, uid: u32, gid: u32) -> Caller {
        Caller { previous: CALLER.with(|c| c.replace(Serving { pid, uid, gid })) }
    }
}

impl Drop for Caller {
    fn drop(&mut self) {
        CALLER.with(|c| c.set(self.previous));
    }
}

/// The thread id, fs uid and fs gid this thread serves (zeros: nobody), to serve the same
/// caller from another thread (`Caller::enter`).
pub fn serving() -> (u32, u32, u32) {
    let s = CALLER.with(Cell::get);
    (s.pid, s.uid, s.gid)
}

/// The credentials of the caller this thread serves, for the server to check: root on a
/// thread serving nobody (the daemon's own work: releases, write-back, recalls).
pub fn current() -> p::Caller {
    let s = CALLER.with(Cell::get);
    if s.pid == 0 {
        return p::Caller::ROOT;
    }
    let groups = GROUPS.with(|g| {
        let mut g = g.borrow_mut();
        match &*g {
            Some((pid, at, groups)) if *pid == s.pid && at.elapsed() < GROUPS_FRESH => groups.clone(),
            _ => {
                let groups = supplementary_groups(s.pid);
                *g = Some((s.pid, Instant::now(), groups.clone()));
                groups
            }
        }
    });
    p::Caller { uid: s.uid, gid: s.gid, groups }
}

/// Thread `tid`'s supplementary groups (none if its status cannot be read), at most
/// `MAX_CALLER_GROUPS` of them.
fn supplementary_groups(tid: u32) -> Vec<u32> {
    let Ok(status) = std::fs::read_to_string(format!("/proc/{tid}/status")) else { return Vec::new() };
    status
        .lines()
        .find_map(|l| l.strip_prefix("Groups:"))
        .unwrap_or("")
        .split_whitespace()
        .filter_map(|g| g.parse().ok())
        .take(p::MAX_CALLER_GROUPS)
        .collect()
}

/// Whether the process this thread serves has a signal to take (or is gone). False on
/// threads serving nobody.
pub fn interrupted() -> bool {
    process_interrupted(CALLER.with(Cell::get).pid)
}

/// Whether thread `tid` is gone or has a signal to take (which would interrupt a local
/// wait, SIGKILL included). Thread 0 (unknown) and an unreadable status (hidepid) say no:
/// the wait goes on.
pub fn process_interrupted(tid: u32) -> bool {
    if tid == 0 {
        return false;
    }
    match std::fs::read_to_string(format!("/proc/{tid}/status")) {
        Ok(status) => signal_pending(&status),
        Err(e) => e.kind() == std::io::ErrorKind::NotFound,
    }
}

/// SIGKILL's bit in the masks of /proc/PID/status (signal n is bit n - 1).
const SIGKILL_BIT: u64 = 1 << 8;

/// From /proc/PID/status: a pending signal (the thread's or the process's) that is
/// neither blocked nor ignored; SIGKILL always counts.
fn signal_pending(status: &str) -> bool {
    let mask = |name: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|v| u64::from_str_radix(v.trim(), 16).ok())
            .unwrap_or(0)
    };
    let pending = mask("SigPnd:") | mask("ShdPnd:");
    let held = mask("SigBlk:") | mask("SigIgn:");
    pending & SIGKILL_BIT != 0 || pending & !held != 0
}

/// CAP_FSETID's bit in CapEff.
const CAP_FSETID_BIT: u64 = 1 << 4;

/// The kernel's `in_group_or_capable` for thread `tid` and group `gid`: its fsgid or one
/// of its supplementary groups is `gid`, or it holds CAP_FSETID. The kernel leaves the
/// rules that need this to a FUSE file system (setgid cleared by a write, a truncate or
/// an ACL change of a caller outside the group). A thread whose status cannot be read
/// (gone, hidepid) counts as in the group: setgid is then left alone, as the kernel
/// alone would.
pub fn in_group_or_capable(tid: u32, gid: u32) -> bool {
    status_of(tid).is_none_or(|s| status_capable(&s) || status_in_group(&s, gid))
}

/// Whether thread `tid`'s fsgid or one of its supplementary groups is `gid` (unknown:
/// yes, as `in_group_or_capable`).
pub fn in_group(tid: u32, gid: u32) -> bool {
    status_of(tid).is_none_or(|s| status_in_group(&s, gid))
}

/// Whether thread `tid` holds CAP_FSETID (keeps setuid and setgid through its writes).
/// Unknown: no, so that a write by a caller this daemon cannot see still clears them.
pub fn capable_fsetid(tid: u32) -> bool {
    status_of(tid).is_some_and(|s| status_capable(&s))
}

fn status_of(tid: u32) -> Option<String> {
    (tid != 0).then(|| std::fs::read_to_string(format!("/proc/{tid}/status")).ok()).flatten()
}

fn status_field<'a>(status: &'a str, name: &str) -> &'a str {
    status.lines().find_map(|l| l.strip_prefix(name)).unwrap_or("")
}

fn status_capable(status: &str) -> bool {
    u64::from_str_radix(status_field(status, "CapEff:").trim(), 16).unwrap_or(0) & CAP_FSETID_BIT != 0
}

fn status_in_group(status: &str, gid: u32) -> bool {
    // Gid: real, effective, saved, filesystem.
    let fsgid = status_field(status, "Gid:").split_whitespace().nth(3).and_then(|g| g.parse::<u32>().ok());
    let mut groups = status_field(status, "Groups:").split_whitespace().filter_map(|g| g.parse::<u32>().ok());
    fsgid == Some(gid) || groups.any(|g| g == gid)
}

#[cfg(test)]
fn status_in_group_or_capable(status: &str, gid: u32) -> bool {
    status_capable(status) || status_in_group(status, gid)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn group_membership_and_cap_fsetid_from_status() {
        let st = |gid: &str, groups: &str, cap: &str| {
            format!("Name:\tx\nUid:\t1\t1\t1\t1\nGid:\t{gid}\nGroups:\t{groups}\nCapEff:\t{cap}\n")
        };
        let plain = "0000000000000000";
        assert!(status_in_group_or_capable(&st("5\t5\t5\t7", "", plain), 7), "fsgid counts");
        assert!(!status_in_group_or_capable(&st("7\t7\t7\t5", "", plain), 7), "only the fsgid counts");
        assert!(status_in_group_or_capable(&st("5\t5\t5\t5", "3 7 9", plain), 7), "supplementary groups");
        assert!(!status_in_group_or_capable(&st("5\t5\t5\t5", "3 9", plain), 7));
        assert!(status_in_group_or_capable(&st("5\t5\t5\t5", "", "0000000000000010"), 7), "CAP_FSETID");
        assert!(!status_in_group_or_capable(&st("5\t5\t5\t5", "", "0000000000000008"), 7));
    }

    fn status(pnd: u64, shd: u64, blk: u64, ign: u64) -> String {
        format!("Name:\tx\nSigQ:\t0/1\nSigPnd:\t{pnd:016x}\nShdPnd:\t{shd:016x}\nSigBlk:\t{blk:016x}\nSigIgn:\t{ign:016x}\n")
    }

    #[test]
    fn pending_signals_count_unless_blocked_or_ignored() {
        let sigint = 1 << 1;
        assert!(!signal_pending(&status(0, 0, 0, 0)));
        assert!(signal_pending(&status(0, sigint, 0, 0)), "Ctrl-C, sent to the process");
        assert!(signal_pending(&status(sigint, 0, 0, 0)), "sent to the thread");
        assert!(!signal_pending(&status(0, sigint, sigint, 0)), "blocked");
        assert!(!signal_pending(&status(0, sigint, 0, sigint)), "ignored");
        assert!(signal_pending(&status(0, SIGKILL_BIT, SIGKILL_BIT, SIGKILL_BIT)), "kill -9 always");
    }

    #[test]
    fn a_thread_serves_its_caller_until_the_guard_goes() {
        assert!(!interrupted(), "nobody served");
        {
            let _c = Caller::enter(u32::MAX - 1, 0, 0); // no such process: gone
            assert!(interrupted());
            {
                let _inner = Caller::enter(std::process::id(), 0, 0);
                assert!(!interrupted(), "this test process has nothing pending");
            }
            assert!(interrupted());
        }
        assert!(!interrupted());
    }
}
