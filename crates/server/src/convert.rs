//! Conversions between protocol types and store types.

use crest_proto as p;
use crest_store as s;

/// Store time from wire time.
pub fn time_in(t: p::Time) -> s::Timespec {
    s::Timespec::new(t.sec, t.nsec.min(999_999_999))
}

/// Wire time from store time.
pub fn time_out(t: s::Timespec) -> p::Time {
    p::Time { sec: t.sec, nsec: t.nsec }
}

/// Store file kind from the wire's.
pub fn kind_in(k: p::FileType) -> s::FileKind {
    match k {
        p::FileType::Regular => s::FileKind::Regular,
        p::FileType::Directory => s::FileKind::Directory,
        p::FileType::Symlink => s::FileKind::Symlink,
        p::FileType::CharDevice => s::FileKind::CharDevice,
        p::FileType::BlockDevice => s::FileKind::BlockDevice,
        p::FileType::Fifo => s::FileKind::Fifo,
        p::FileType::Socket => s::FileKind::Socket,
    }
}

/// Wire file kind from the store's.
pub fn kind_out(k: s::FileKind) -> p::FileType {
    match k {
        s::FileKind::Regular => p::FileType::Regular,
        s::FileKind::Directory => p::FileType::Directory,
        s::FileKind::Symlink => p::FileType::Symlink,
        s::FileKind::CharDevice => p::FileType::CharDevice,
        s::FileKind::BlockDevice => p::FileType::BlockDevice,
        s::FileKind::Fifo => p::FileType::Fifo,
        s::FileKind::Socket => p::FileType::Socket,
    }
}

/// The wire's ACL flags from the store's inode flags.
fn acl_flags_out(flags: u32) -> u32 {
    let mut out = 0;
    if flags & s::fs::inode::FLAG_ACL_ACCESS != 0 {
        out |= p::acl::HAS_ACCESS;
    }
    if flags & s::fs::inode::FLAG_ACL_DEFAULT != 0 {
        out |= p::acl::HAS_DEFAULT;
    }
    out
}

/// Wire attributes from an inode.
pub fn attr_out(i: &s::Inode) -> p::Attr {
    p::Attr {
        ino: i.ino,
        generation: i.generation,
        kind: kind_out(i.kind),
        mode: i.mode,
        nlink: i.nlink,
        uid: i.uid,
        gid: i.gid,
        size_bytes: if i.kind == s::FileKind::Directory { p::DIR_SIZE_BYTES } else { i.size },
        blocks_4k: i.blocks,
        rdev: i.rdev,
        atime: time_out(i.atime),
        mtime: time_out(i.mtime),
        ctime: time_out(i.ctime),
        crtime: time_out(i.crtime),
        flags: acl_flags_out(i.flags),
    }
}

/// The wire error for a store error.
pub fn error_out(e: &s::Error) -> p::OpError {
    p::OpError { errno: e.errno(), message: e.to_string() }
}
