//! POSIX ACLs kept in step with modes as operations run (the rules themselves are
//! `crest_proto::acl`'s, shared with clients answering under exclusive rights). Each
//! function runs inside the operation's unit, so the ACL and the mode change together
//! or not at all.

use crest_proto as p;
use crest_proto::acl;
use crest_store as s;
use s::fs::inode::{FLAG_ACL_ACCESS, FLAG_ACL_DEFAULT};

use crate::session::{errno, Failure};

/// What a new inode in `parent` gets from the parent's default ACL or the umask.
pub fn inherit(
    store: &mut s::Store,
    parent: u64,
    kind: s::FileKind,
    mode: u32,
    umask: u32,
) -> Result<acl::Inherited, s::Error> {
    let dir = store.getattr(parent)?;
    let default = if dir.flags & FLAG_ACL_DEFAULT != 0 { Some(store.getxattr(parent, acl::DEFAULT)?) } else { None };
    Ok(acl::inherit(default.as_deref(), kind == s::FileKind::Directory, kind == s::FileKind::Symlink, mode, umask))
}

/// Stores the ACLs a new inode inherited; returns the inode as it now is.
pub fn store_inherited(
    store: &mut s::Store,
    inode: s::Inode,
    got: &acl::Inherited,
    now: s::Timespec,
) -> Result<s::Inode, s::Error> {
    if got.access.is_none() && got.default.is_none() {
        return Ok(inode);
    }
    if let Some(v) = &got.access {
        store.setxattr(inode.ino, acl::ACCESS, v, now)?;
    }
    if let Some(v) = &got.default {
        store.setxattr(inode.ino, acl::DEFAULT, v, now)?;
    }
    store.getattr(inode.ino)
}

/// After a chmod of `ino` to `mode`: its access ACL's owner, mask (or group) and other
/// entries follow the new mode.
pub fn chmod(store: &mut s::Store, ino: u64, mode: u32, now: s::Timespec) -> Result<(), s::Error> {
    if store.getattr(ino)?.flags & FLAG_ACL_ACCESS == 0 {
        return Ok(());
    }
    let old = store.getxattr(ino, acl::ACCESS)?;
    let entries = acl::parse(&old).map_err(|e| s::Error::Corrupt {
        what: "xattr",
        block: 0,
        detail: format!("access ACL of inode {ino}: {}", e.0),
    })?;
    store.setxattr(ino, acl::ACCESS, &acl::encode(&acl::chmod(&entries, mode)), now)
}

/// Sets an ACL xattr as the kernel's `posix_acl_update_mode` asks: an access ACL
/// changes the mode, and one the mode alone can say is not stored. Refuses a value that
/// is not a valid ACL (EINVAL) and a default ACL on anything but a directory (EACCES).
pub fn set(
    store: &mut s::Store,
    ino: u64,
    name: &[u8],
    value: &[u8],
    flags: u32,
    now: s::Timespec,
) -> Result<(), Failure> {
    let entries = acl::parse(value).map_err(|e| Failure::Wire(errno(22, format!("{}: {}", show(name), e.0))))?;
    let inode = store.getattr(ino)?;
    if name == acl::DEFAULT {
        if inode.kind != s::FileKind::Directory {
            return Err(Failure::Wire(errno(13, format!("default ACL on inode {ino}, not a directory"))));
        }
        return Ok(store.setxattr(ino, name, &acl::encode(&entries), now)?);
    }
    let (mode, stored) = acl::update_mode(inode.mode, &entries, flags & p::XATTR_ACL_KILL_SGID != 0);
    match stored {
        Some(v) => store.setxattr(ino, name, &v, now)?,
        None if inode.flags & FLAG_ACL_ACCESS != 0 => store.removexattr(ino, name, now)?,
        None => {}
    }
    if mode != inode.mode {
        store.setattr(ino, &s::SetAttr { mode: Some(mode), ..Default::default() }, now)?;
    }
    Ok(())
}

fn show(name: &[u8]) -> String {
    String::from_utf8_lossy(name).into_owned()
}
