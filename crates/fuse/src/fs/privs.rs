//! The setgid rules the kernel leaves to a FUSE file system. Without FUSE_HANDLE_KILLPRIV
//! the kernel clears setuid on a write, truncate or fallocate, but setgid only on a
//! group-executable file; Linux's newer rule also clears it when the writer is neither
//! in the file's group nor holds CAP_FSETID, and the same holds for an ACL change. Only
//! this daemon can judge that (the caller's groups and capabilities are in /proc), so it
//! does so here, for the calls the kernel sends on behalf of that rule.

use std::time::Instant;

use crest_proto::{self as p, Op};

use super::{lock, want_attr, CrestFs};
use crate::caller;

const S_ISGID: u32 = 0o2000;

impl CrestFs {
    /// Clears setgid in a SETATTR the kernel sends to drop privileges: one that changes
    /// the mode (the kernel's own kill, which keeps setgid on a file the group may not
    /// run), the size, or nothing at all, from a caller outside the file's group without
    /// CAP_FSETID. chmod itself cannot reach here with setgid such a caller may not keep:
    /// the kernel strips it before (`setattr_prepare`).
    pub(super) fn kill_sgid(&self, pid: u32, ino: u64, set: &mut p::SetAttr) {
        let times = set.atime.is_some() || set.mtime.is_some() || set.ctime.is_some();
        let kill_shaped = set.mode.is_some() || set.size_bytes.is_some() || !times;
        if set.uid.is_some() || set.gid.is_some() || !kill_shaped {
            return;
        }
        if set.mode.is_some_and(|m| m & S_ISGID == 0) {
            return;
        }
        // Only a call that changes nothing is worth a round trip to find out.
        let Some(attr) = self.attr_for_privs(ino, set.mode.is_none() && set.size_bytes.is_none()) else { return };
        let mode = set.mode.unwrap_or(attr.mode);
        if attr.kind != p::FileType::Regular || mode & S_ISGID == 0 || caller::in_group_or_capable(pid, attr.gid) {
            return;
        }
        set.mode = Some(mode & !S_ISGID);
    }

    /// Whether setting an access ACL on `ino` must clear its setgid bit (the kernel's
    /// `posix_acl_update_mode`): the file has it and the caller is neither in the file's
    /// group nor holds CAP_FSETID.
    pub(super) fn caller_drops_sgid(&self, pid: u32, ino: u64) -> bool {
        let Some(attr) = self.attr_for_privs(ino, true) else { return false };
        attr.mode & S_ISGID != 0 && !caller::in_group_or_capable(pid, attr.gid)
    }

    /// `ino`'s attributes as held here, else (when `fetch`) from the server; `None` when
    /// unknown, and then the kernel's own rule stands.
    fn attr_for_privs(&self, ino: u64, fetch: bool) -> Option<p::Attr> {
        let cached = lock(&self.names).attr(ino, Instant::now());
        cached.or_else(|| {
            fetch.then(|| self.one("getattr", Op::GetAttr { ino }).and_then(|r| want_attr("getattr", r)).ok()).flatten()
        })
    }
}
