//! Checks of operations on names: create, link, unlink, rmdir, rename (Linux's
//! `may_create`, `may_linkat`, `may_delete` and `vfs_rename`).

use super::*;

/// Setuid, setgid, sticky.
pub(super) const S_ISUID: u32 = 0o4000;
pub(super) const S_ISGID: u32 = p::owner::S_ISGID;
const S_ISVTX: u32 = 0o1000;
pub(super) const S_IXGRP: u32 = 0o010;

impl Checker<'_> {
    /// The new inode is the caller's, whatever the client claimed (the umask stays its);
    /// root's (unsquashed) may be anyone's, as root could chown it anyway.
    pub(super) fn own(&self, cred: &mut p::Cred) {
        if self.caller.uid != 0 {
            cred.uid = self.caller.uid;
            cred.gid = self.caller.gid;
        }
    }

    /// Create (and CreateAt): write and search on the parent; devices only for root where
    /// the policy allows them; setuid and setgid as the policy and the new group allow.
    pub(super) fn create(
        &mut self,
        parent: u64,
        kind: p::FileType,
        mode: &mut u32,
        rdev: u64,
        cred: &mut p::Cred,
    ) -> Result<(), p::OpError> {
        let dir = self.inode(parent)?;
        self.need_on(&dir, acl::MAY_WRITE | acl::MAY_EXEC)?;
        self.own(cred);
        let device = matches!(kind, p::FileType::CharDevice | p::FileType::BlockDevice);
        // A whiteout (character device 0:0, as overlayfs makes them) opens nothing: Linux
        // lets anyone make one.
        let whiteout = kind == p::FileType::CharDevice && rdev == 0;
        if device && !whiteout && !(self.root() && self.policy.allow_dev) {
            return Err(not_permitted(parent, "making a device node in directory"));
        }
        let is_dir = kind == p::FileType::Directory;
        if !self.policy.allow_suid {
            *mode &= if is_dir { !S_ISUID } else { !(S_ISUID | S_ISGID) };
        }
        // mode_strip_sgid: a group-executable file made set-group-ID for a group its
        // creator is not in (a set-group-ID directory's) is not.
        let (group, _) = p::owner::new_inode_group(dir.mode, dir.gid, cred.gid, is_dir, *mode);
        let group_exec_sgid = *mode & (S_ISGID | S_IXGRP) == S_ISGID | S_IXGRP;
        if !is_dir && group_exec_sgid && !self.root() && !self.caller.in_group(group) {
            *mode &= !S_ISGID;
        }
        Ok(())
    }

    /// Link: write and search on the new parent; a file the caller does not own only if
    /// they may read and write it and it is a regular file that is neither setuid nor
    /// executable setgid (`fs.protected_hardlinks`, on by default: a user cannot keep
    /// a copy of someone's setuid program past its update by linking to it).
    pub(super) fn link(&mut self, ino: u64, parent: u64) -> Result<(), p::OpError> {
        self.need(parent, acl::MAY_WRITE | acl::MAY_EXEC)?;
        let inode = self.inode(ino)?;
        if self.owner_or_root(&inode) {
            return Ok(());
        }
        let setid = inode.mode & S_ISUID != 0 || inode.mode & (S_ISGID | S_IXGRP) == S_ISGID | S_IXGRP;
        if inode.kind != s::FileKind::Regular || setid || !self.may(&inode, acl::MAY_READ | acl::MAY_WRITE)? {
            return Err(not_permitted(ino, "hard link to a file of another owner"));
        }
        Ok(())
    }

    /// Unlink and rmdir: write and search on the parent, and the sticky bit's rule.
    pub(super) fn remove(&mut self, parent: u64, name: &[u8]) -> Result<(), p::OpError> {
        let dir = self.inode(parent)?;
        self.need_on(&dir, acl::MAY_WRITE | acl::MAY_EXEC)?;
        self.sticky(&dir, name).map(|_| ())
    }

    /// In a sticky directory only the victim's owner, the directory's or root may remove
    /// or replace an entry (EPERM).
    fn sticky(&mut self, dir: &s::Inode, name: &[u8]) -> Result<Option<s::Inode>, p::OpError> {
        let victim = self.child(dir.ino, name)?;
        if let Some(v) = &victim {
            if dir.mode & S_ISVTX != 0 && !self.owner_or_root(v) && !self.owns(dir) {
                return Err(not_permitted(v.ino, "removal from a sticky directory of another's file"));
            }
        }
        Ok(victim)
    }

    /// Rename: write and search on both parents, the sticky rule for what is moved and
    /// what is replaced, and write on a directory that moves to another parent (its ".."
    /// changes; with RENAME_EXCHANGE, on the other side too).
    pub(super) fn rename(
        &mut self,
        parent: u64,
        name: &[u8],
        new_parent: u64,
        new_name: &[u8],
        flags: u32,
    ) -> Result<(), p::OpError> {
        let from = self.inode(parent)?;
        self.need_on(&from, acl::MAY_WRITE | acl::MAY_EXEC)?;
        let to = if new_parent == parent { from.clone() } else { self.inode(new_parent)? };
        if new_parent != parent {
            self.need_on(&to, acl::MAY_WRITE | acl::MAY_EXEC)?;
        }
        let moved = self.sticky(&from, name)?;
        let replaced = self.sticky(&to, new_name)?;
        if new_parent != parent {
            let is_dir = |i: &Option<s::Inode>| i.as_ref().filter(|i| i.kind == s::FileKind::Directory).cloned();
            if let Some(d) = is_dir(&moved) {
                self.need_on(&d, acl::MAY_WRITE)?;
            }
            if flags & p::RENAME_EXCHANGE != 0 {
                if let Some(d) = is_dir(&replaced) {
                    self.need_on(&d, acl::MAY_WRITE)?;
                }
            }
        }
        Ok(())
    }
}
