//! Privileges a change takes away. The daemon runs with FUSE_HANDLE_KILLPRIV_V2: the
//! kernel leaves it to clear setuid, setgid and file capabilities on a write, truncate,
//! fallocate or chown, and in exchange marks the superblock `SB_NOSEC`, so it no longer
//! asks for `security.capability` before every write (a request each: a third of an
//! untar's). The rules are Linux's (`file_remove_privs`, `setattr_should_drop_suidgid`):
//! a write, truncate or fallocate by a caller without CAP_FSETID clears setuid, and setgid
//! on a group-executable file or when the caller is outside the file's group; any of them,
//! and a chown, removes file capabilities whoever the caller. Judged from what this mount
//! holds of the file (coherent under its rights), else from the kernel's word and the
//! server; the caller's groups and capabilities are in /proc, read only for a file that
//! has a bit to lose. The clearing goes before the change, as the kernel's own did: a
//! setattr of the mode and a removal of the capability, answered here or by the server
//! like any other.

use std::time::Instant;

use crest_proto::{self as p, Op};

use super::{lock, want_attr, want_data, want_done, CrestFs};
use crate::caller;
use crate::error::Error;

const S_ISUID: u32 = 0o4000;
const S_ISGID: u32 = 0o2000;
const S_IXGRP: u32 = 0o010;
/// Where a file's capabilities live.
const CAPABILITY: &[u8] = b"security.capability";

impl CrestFs {
    /// Clears setgid in a SETATTR the kernel sends to drop privileges: one that changes
    /// the mode (the kernel's own kill, which keeps setgid on a file the group may not
    /// run), the size, or nothing at all, from a caller outside the file's group without
    /// CAP_FSETID. chmod itself cannot reach here with setgid such a caller may not keep:
    /// the kernel strips it before (`setattr_prepare`).
    fn kill_sgid(&self, pid: u32, ino: u64, set: &mut p::SetAttr) {
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

    /// What a write (`kernel_kill`: the kernel, from its copy of the mode, says setuid or
    /// setgid must go), truncate or fallocate by `pid` takes from `ino` first.
    pub(super) fn remove_privs(&self, pid: u32, ino: u64, kernel_kill: bool) -> Result<(), Error> {
        let attr = self.attr_for_privs(ino, kernel_kill);
        if attr.as_ref().is_some_and(|a| a.kind != p::FileType::Regular) {
            return Ok(());
        }
        if let Some(attr) = &attr {
            if let Some(mode) = write_killed_mode(pid, attr) {
                let set = p::SetAttr { mode: Some(mode), ..Default::default() };
                self.set_attr(ino, set)?;
                // (The write's or fallocate's reply tells the kernel nothing of it.)
                self.kernel_attrs.forget(ino);
            }
        }
        self.remove_capability(ino)
    }

    /// The privileges a setattr takes away besides what it sets, joined into it as a
    /// mode: a truncate's as a write's; a chown's (of anything but a directory) setuid
    /// whoever the caller, setgid as for a write but even with CAP_FSETID on a
    /// group-executable file, and capabilities; otherwise setgid as `kill_sgid` says.
    pub(super) fn setattr_privs(&self, pid: u32, ino: u64, set: &mut p::SetAttr) -> Result<(), Error> {
        let chown = set.uid.is_some() || set.gid.is_some();
        if set.mode.is_none() && (chown || set.size_bytes.is_some()) {
            let Some(attr) = self.attr_for_privs(ino, true) else { return Ok(()) };
            if chown && attr.kind != p::FileType::Directory {
                // (`in_group` here is the kernel's `in_group_or_capable`.)
                let in_group = |gid| caller::in_group_or_capable(pid, gid);
                set.mode = killed_mode(&attr, || false, in_group);
                if attr.kind == p::FileType::Regular {
                    self.remove_capability(ino)?;
                }
            } else if !chown && attr.kind == p::FileType::Regular {
                set.mode = write_killed_mode(pid, &attr);
                self.remove_capability(ino)?;
            }
        }
        self.kill_sgid(pid, ino, set);
        Ok(())
    }

    /// Removes `ino`'s file capabilities, if it has any: known here when the mount holds
    /// its extended attributes, else asked of the server.
    fn remove_capability(&self, ino: u64) -> Result<(), Error> {
        let held = lock(&self.names).held_xattrs(ino).map(|m| m.contains_key(CAPABILITY));
        let has = match held {
            Some(has) => has,
            None => match self.one("getxattr", Op::GetXattr { ino, name: CAPABILITY.to_vec() }) {
                Ok(r) => want_data("getxattr", r).map(|_| true)?,
                Err(Error::Server { errno, .. }) if errno == libc::ENODATA => false,
                Err(e) => return Err(e),
            },
        };
        if !has {
            return Ok(());
        }
        match self.xattr_locally(ino, CAPABILITY, None, 0) {
            Some(Ok(())) => Ok(()),
            Some(Err(e)) => Err(Error::Server { op: "removexattr", errno: e.code(), message: "capability".into() }),
            None => match self.remove_xattr_on_server(ino, CAPABILITY.to_vec()) {
                Err(Error::Server { errno, .. }) if errno == libc::ENODATA => Ok(()),
                r => r,
            },
        }
    }

    /// A setattr, answered here when the mount holds the inode, else by the server.
    pub(super) fn set_attr(&self, ino: u64, set: p::SetAttr) -> Result<p::Attr, Error> {
        // (A mode the server would not keep as set goes to it: it answers what it kept.)
        let local = self.judged_map().is_some_and(|map| set.mode.is_none_or(|m| map.keeps_mode(m, false)));
        if local {
            if let Some(a) = self.change_locally(ino, 0, |c, clock| c.setattr_here(ino, &set, clock)) {
                return Ok(a);
            }
        }
        let chmod = set.mode.is_some();
        let since = self.stamp();
        let r = self.one("setattr", Op::SetAttr { ino, set }).and_then(|r| want_attr("setattr", r));
        if let Ok(a) = &r {
            lock(&self.inodes).changed_here(a);
            self.attr_changed(a, since);
            if chmod && a.flags & p::acl::HAS_ACCESS != 0 {
                lock(&self.names).xattrs_changed(a.ino);
            }
        }
        r
    }

    /// A removexattr of `name`, not an ACL's, by the server.
    pub(super) fn remove_xattr_on_server(&self, ino: u64, name: Vec<u8>) -> Result<(), Error> {
        lock(&self.names).xattrs_changed(ino);
        let r = self.one("removexattr", Op::RemoveXattr { ino, name }).and_then(|r| want_done("removexattr", r));
        lock(&self.names).attr_stale(ino);
        r
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

/// `killed_mode` for a write by thread `pid`, its capability and groups from /proc.
fn write_killed_mode(pid: u32, attr: &p::Attr) -> Option<u32> {
    killed_mode(attr, || caller::capable_fsetid(pid), |gid| caller::in_group(pid, gid))
}

/// The mode `attr`'s file is left with after a write by a caller, if the write changes it:
/// setuid goes, and setgid where the group may execute the file or the caller is outside
/// its group, unless the caller holds CAP_FSETID. `capable` and `in_group` are asked only
/// when there is a bit to lose.
fn killed_mode(attr: &p::Attr, capable: impl FnOnce() -> bool, in_group: impl FnOnce(u32) -> bool) -> Option<u32> {
    let mode = attr.mode & 0o7777;
    if mode & (S_ISUID | S_ISGID) == 0 {
        return None;
    }
    let mut kill = mode & S_ISUID;
    if mode & S_ISGID != 0 && (mode & S_IXGRP != 0 || !in_group(attr.gid)) {
        kill |= S_ISGID;
    }
    (kill != 0 && !capable()).then_some(mode & !kill)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn file(mode: u32, gid: u32) -> p::Attr {
        let t = p::Time { sec: 0, nsec: 0 };
        p::Attr {
            ino: 2,
            generation: 1,
            kind: p::FileType::Regular,
            mode,
            nlink: 1,
            uid: 0,
            gid,
            size_bytes: 0,
            blocks_4k: 0,
            rdev: 0,
            atime: t,
            mtime: t,
            ctime: t,
            crtime: t,
            flags: 0,
        }
    }

    #[test]
    fn a_write_takes_what_linux_takes() {
        let (no, yes) = (|| false, || true);
        let outside = |_| false;
        let inside = |_| true;
        assert_eq!(killed_mode(&file(0o644, 5), no, outside), None, "nothing to take");
        assert_eq!(killed_mode(&file(0o4755, 5), no, inside), Some(0o755), "setuid always");
        assert_eq!(killed_mode(&file(0o4755, 5), yes, inside), None, "CAP_FSETID keeps it");
        assert_eq!(killed_mode(&file(0o2755, 5), no, inside), Some(0o755), "setgid, group may run it");
        assert_eq!(killed_mode(&file(0o2745, 5), no, inside), None, "setgid, no group execute, in the group");
        assert_eq!(killed_mode(&file(0o2745, 5), no, outside), Some(0o745), "setgid, outside the group");
        assert_eq!(killed_mode(&file(0o6745, 5), no, inside), Some(0o2745), "setuid goes, setgid stays");
        assert_eq!(killed_mode(&file(0o7777, 5), no, inside), Some(0o1777), "sticky stays");
        assert_eq!(killed_mode(&file(0o6777, 5), yes, outside), None);
        // Asked only when there is something to lose.
        let asked = std::cell::Cell::new(false);
        let _ = killed_mode(&file(0o755, 5), || asked.replace(true), |_| asked.replace(true));
        assert!(!asked.get());
    }
}
