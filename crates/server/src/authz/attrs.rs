//! Checks of attribute and xattr changes (Linux's `setattr_prepare`, `chown_ok`,
//! `chgrp_ok`, `inode_newsize_ok`, utimes' rules and `xattr_permission`).

use super::names::{S_ISGID, S_ISUID};
use super::*;

const S_IXGRP: u32 = 0o010;
const NANOS: i128 = 1_000_000_000;

/// The namespaces of xattr names.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Space {
    User,
    Trusted,
    Security,
    /// `system.posix_acl_access`, `system.posix_acl_default`.
    Acl,
    /// Any other name (the store refuses names outside these namespaces).
    Other,
}

fn space(name: &[u8]) -> Space {
    if acl::flag_of(name) != 0 {
        Space::Acl
    } else if name.starts_with(b"user.") {
        Space::User
    } else if name.starts_with(b"trusted.") {
        Space::Trusted
    } else if name.starts_with(b"security.") {
        Space::Security
    } else {
        Space::Other
    }
}

/// A time in nanoseconds (a peer's nanoseconds beyond a second count as 999 999 999).
pub(super) fn nanos(t: p::Time) -> i128 {
    i128::from(t.sec) * NANOS + i128::from(t.nsec.min(999_999_999))
}

/// Whether `a` is within `MAX_CLOCK_SKEW` of `b`.
pub(super) fn near(a: p::Time, b: p::Time) -> bool {
    (nanos(a) - nanos(b)).abs() <= nanos(MAX_CLOCK_SKEW)
}

/// "Now" as far as a request is concerned: the client's clock when it gave one that is
/// itself near the server's, else the server's.
pub(super) fn effective_now(now: p::Time, client_time: Option<p::Time>) -> p::Time {
    client_time.filter(|&t| near(t, now)).unwrap_or(now)
}

impl Checker<'_> {
    /// SetAttr: chmod and chown as `setattr_prepare` allows them (EPERM), truncation with
    /// write permission or by the owner (EACCES), times as utimes allows them, and a
    /// change time far from the server's clock replaced by it.
    pub(super) fn setattr(
        &mut self,
        ino: u64,
        set: &mut p::SetAttr,
        now: p::Time,
        client_time: Option<p::Time>,
    ) -> Result<(), p::OpError> {
        let inode = self.inode(ino)?;
        let (root, owner) = (self.root(), self.owns(&inode));
        // chown_ok, chgrp_ok: root; or the owner keeping the owner, and giving the file
        // to its group or one of the owner's.
        let chown_ok = |uid: u32| root || (owner && uid == inode.uid);
        let chgrp_ok = |gid: u32| root || (owner && (gid == inode.gid || self.caller.in_group(gid)));
        if set.uid.is_some_and(|uid| !chown_ok(uid)) {
            return Err(not_permitted(ino, "change of owner"));
        }
        if set.gid.is_some_and(|gid| !chgrp_ok(gid)) {
            return Err(not_permitted(ino, "change of group"));
        }
        let is_dir = inode.kind == s::FileKind::Directory;
        if let Some(mode) = set.mode.as_mut() {
            // A write, truncate or fallocate by someone outside the file's group drops its
            // setuid and setgid bits (Linux's kill-priv): the kernel asks the file system
            // to, on behalf of the writer, who need not own the file nor (writing through a
            // descriptor another opened) be allowed to write it. So a mode change that only
            // drops them is let through for a caller who could have made that write: one
            // allowed to write the file, or whose session holds it open for writing. Anyone
            // else is denied it as any chmod: a setuid program is not someone else's to
            // disarm.
            let (old, new) = (inode.mode & 0o7777, *mode & 0o7777);
            let kill_priv = new != old && new & !old == 0 && (old & !new) & !(S_ISUID | S_ISGID) == 0;
            let may_kill = kill_priv
                && !(root || owner)
                && (self.opened & acl::MAY_WRITE != 0 || self.may(&inode, acl::MAY_WRITE)?);
            if !(root || owner || may_kill) {
                return Err(not_permitted(ino, "change of mode"));
            }
            if !self.policy.allow_suid {
                *mode &= if is_dir { !S_ISUID } else { !(S_ISUID | S_ISGID) };
            }
            if !root && !self.caller.in_group(set.gid.unwrap_or(inode.gid)) {
                *mode &= !S_ISGID;
            }
        } else if !is_dir && (set.uid.is_some_and(|u| u != inode.uid) || set.gid.is_some_and(|g| g != inode.gid)) {
            // A file that changes hands stops being set-user-ID, and set-group-ID with
            // group execute (Linux's ATTR_KILL_SUID, ATTR_KILL_SGID on chown).
            let mut mode = inode.mode & !S_ISUID;
            if mode & (S_ISGID | S_IXGRP) == S_ISGID | S_IXGRP {
                mode &= !S_ISGID;
            }
            if mode != inode.mode {
                set.mode = Some(mode);
            }
        }
        // (ftruncate through a descriptor open for writing needs no permission.)
        if set.size_bytes.is_some() && !owner && self.opened & acl::MAY_WRITE == 0 {
            self.need_on(&inode, acl::MAY_WRITE)?;
        }
        self.times(&inode, set, effective_now(now, client_time))?;
        if set.ctime.is_some_and(|t| !near(t, now)) {
            set.ctime = Some(now);
        }
        Ok(())
    }

    /// utimes: the owner or root may set any times; others only "now" (a time within
    /// `MAX_CLOCK_SKEW` of `now` counts), with write permission, or read permission for
    /// the access time alone (reading sets it). A given time: EPERM; no permission: EACCES.
    fn times(&mut self, inode: &s::Inode, set: &p::SetAttr, now: p::Time) -> Result<(), p::OpError> {
        if (set.atime.is_none() && set.mtime.is_none()) || self.owner_or_root(inode) {
            return Ok(());
        }
        let nowish = |t: Option<p::SetTime>| match t {
            None | Some(p::SetTime::Now) => true,
            Some(p::SetTime::At(t)) => near(t, now),
        };
        if !nowish(set.atime) || !nowish(set.mtime) {
            return Err(not_permitted(inode.ino, "setting the times (not to now)"));
        }
        if self.may(inode, acl::MAY_WRITE)? || (set.mtime.is_none() && self.may(inode, acl::MAY_READ)?) {
            return Ok(());
        }
        Err(denied(inode.ino, "set the times of"))
    }

    /// GetXattr: `user.*` with read permission or by the owner; `trusted.*` by root alone
    /// (EPERM); `security.*` and `system.*` by anyone (`ls -l` reads ACLs and labels).
    pub(super) fn getxattr(&mut self, ino: u64, name: &[u8]) -> Result<(), p::OpError> {
        match space(name) {
            Space::User => self.need_or_owner(ino, acl::MAY_READ),
            Space::Trusted if !self.root() => Err(not_permitted(ino, "reading a trusted xattr")),
            Space::Trusted | Space::Security | Space::Acl | Space::Other => Ok(()),
        }
    }

    /// SetXattr (`flags` given) and RemoveXattr: `user.*` on regular files and directories
    /// only, with write permission or by the owner, and in a sticky directory by its owner
    /// alone; `trusted.*` and `security.*` by root alone (`security.capability` not at
    /// all where setuid is not allowed: file capabilities are setuid's kin); ACLs by the
    /// owner or root, clearing setgid for a caller outside the file's group.
    pub(super) fn setxattr(&mut self, ino: u64, name: &[u8], flags: Option<&mut u32>) -> Result<(), p::OpError> {
        let inode = self.inode(ino)?;
        match space(name) {
            Space::User => {
                let sticky_dir = inode.kind == s::FileKind::Directory && inode.mode & 0o1000 != 0;
                if !matches!(inode.kind, s::FileKind::Regular | s::FileKind::Directory)
                    || (sticky_dir && !self.owner_or_root(&inode))
                {
                    return Err(not_permitted(ino, "user xattr change"));
                }
                if self.owns(&inode) {
                    return Ok(());
                }
                self.need_on(&inode, acl::MAY_WRITE)
            }
            // Taking a file's capabilities away only lowers privilege, and a write of the
            // file does it anyway (a mount does it first, for the writer, as the kernel
            // does): whoever may write the file, or writes it through a handle, may.
            Space::Security if name == b"security.capability" && flags.is_none() && !self.root() => {
                if self.owns(&inode) || self.opened & acl::MAY_WRITE != 0 {
                    return Ok(());
                }
                self.need_on(&inode, acl::MAY_WRITE)
            }
            Space::Security if name == b"security.capability" && !self.policy.allow_suid => {
                Err(not_permitted(ino, "file capabilities (setuid is not allowed to this host)"))
            }
            Space::Trusted | Space::Security | Space::Other if !self.root() => {
                Err(not_permitted(ino, "privileged xattr change"))
            }
            Space::Trusted | Space::Security | Space::Other => Ok(()),
            Space::Acl => {
                if !self.owner_or_root(&inode) {
                    return Err(not_permitted(ino, "ACL change"));
                }
                if let Some(flags) = flags {
                    if !self.root() && !self.caller.in_group(inode.gid) {
                        *flags |= p::XATTR_ACL_KILL_SGID;
                    }
                }
                Ok(())
            }
        }
    }
}
