//! The INODE item: an inode's attributes, 128 bytes, little-endian.

use crate::engine::key::Key;
use crate::error::{Error, Result};
use crate::fs::keys::kind;

/// Inode number of every dataset's root directory (FUSE's root is 1 too).
pub const ROOT_INO: u64 = 1;
/// Encoded size of an inode item.
pub const INODE_BYTES: usize = 128;
/// `Inode::flags`: an xattr `system.posix_acl_access` is stored (kept by `setxattr` and
/// `removexattr`, so a reader of the inode knows without looking for the xattr).
pub const FLAG_ACL_ACCESS: u32 = 1;
/// `Inode::flags`: an xattr `system.posix_acl_default` is stored.
pub const FLAG_ACL_DEFAULT: u32 = 2;
const KNOWN_FLAGS: u32 = FLAG_ACL_ACCESS | FLAG_ACL_DEFAULT;

/// The flag an xattr name keeps, if any.
pub fn xattr_flag(name: &[u8]) -> u32 {
    match name {
        b"system.posix_acl_access" => FLAG_ACL_ACCESS,
        b"system.posix_acl_default" => FLAG_ACL_DEFAULT,
        _ => 0,
    }
}

/// Seconds and nanoseconds since the epoch.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Timespec {
    /// Seconds (may be negative).
    pub sec: i64,
    /// Nanoseconds, below 1e9.
    pub nsec: u32,
}

impl Timespec {
    /// A time from seconds and nanoseconds.
    pub const fn new(sec: i64, nsec: u32) -> Timespec {
        Timespec { sec, nsec }
    }
}

/// File types. Numbers are part of the format.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum FileKind {
    /// Regular file.
    Regular = 1,
    /// Directory.
    Directory = 2,
    /// Symbolic link.
    Symlink = 3,
    /// Character device.
    CharDevice = 4,
    /// Block device.
    BlockDevice = 5,
    /// Named pipe.
    Fifo = 6,
    /// Unix socket.
    Socket = 7,
}

impl FileKind {
    /// Decodes a kind byte.
    pub fn from_u8(b: u8) -> Option<FileKind> {
        Some(match b {
            1 => FileKind::Regular,
            2 => FileKind::Directory,
            3 => FileKind::Symlink,
            4 => FileKind::CharDevice,
            5 => FileKind::BlockDevice,
            6 => FileKind::Fifo,
            7 => FileKind::Socket,
            _ => return None,
        })
    }

    /// True for kinds whose content lives in EXTENT items.
    pub fn has_data(self) -> bool {
        matches!(self, FileKind::Regular | FileKind::Symlink)
    }
}

/// An inode's attributes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Inode {
    /// Inode number (the item's objectid; not stored in the value).
    pub ino: u64,
    /// Random number chosen at creation; (ino, generation) names the file for ever.
    pub generation: u64,
    /// File type.
    pub kind: FileKind,
    /// Permission bits including setuid, setgid and sticky (`0o7777`).
    pub mode: u32,
    /// Hard links (for a directory: 2 + subdirectories).
    pub nlink: u32,
    /// Owner.
    pub uid: u32,
    /// Group.
    pub gid: u32,
    /// Size in bytes (regular files, symlinks); entries for directories.
    pub size: u64,
    /// Data blocks allocated to the file.
    pub blocks: u64,
    /// Device number for device files.
    pub rdev: u64,
    /// Last access.
    pub atime: Timespec,
    /// Last data change.
    pub mtime: Timespec,
    /// Last attribute change.
    pub ctime: Timespec,
    /// Creation.
    pub crtime: Timespec,
    /// Directories: the parent directory (the root's is itself).
    pub parent: u64,
    /// Directories: the index the next entry gets.
    pub next_index: u64,
    /// `FLAG_*`: which ACL xattrs the inode has.
    pub flags: u32,
}

fn put_time(b: &mut [u8], at: usize, t: Timespec) {
    b[at..at + 8].copy_from_slice(&t.sec.to_le_bytes());
    b[at + 8..at + 12].copy_from_slice(&t.nsec.to_le_bytes());
}

pub(crate) fn le_u64(b: &[u8], at: usize) -> u64 {
    let mut a = [0u8; 8];
    a.copy_from_slice(&b[at..at + 8]);
    u64::from_le_bytes(a)
}

pub(crate) fn le_u32(b: &[u8], at: usize) -> u32 {
    let mut a = [0u8; 4];
    a.copy_from_slice(&b[at..at + 4]);
    u32::from_le_bytes(a)
}

fn get_time(b: &[u8], at: usize) -> Timespec {
    Timespec { sec: le_u64(b, at) as i64, nsec: le_u32(b, at + 8) }
}

impl Inode {
    /// The item key.
    pub fn key(ino: u64) -> Key {
        Key::new(ino, kind::INODE, 0)
    }

    /// 128-byte encoding.
    pub fn encode(&self) -> Vec<u8> {
        let mut b = vec![0u8; INODE_BYTES];
        b[0..8].copy_from_slice(&self.generation.to_le_bytes());
        b[8] = self.kind as u8;
        b[12..16].copy_from_slice(&self.mode.to_le_bytes());
        b[16..20].copy_from_slice(&self.nlink.to_le_bytes());
        b[20..24].copy_from_slice(&self.uid.to_le_bytes());
        b[24..28].copy_from_slice(&self.gid.to_le_bytes());
        b[28..32].copy_from_slice(&self.flags.to_le_bytes());
        b[32..40].copy_from_slice(&self.size.to_le_bytes());
        b[40..48].copy_from_slice(&self.blocks.to_le_bytes());
        b[48..56].copy_from_slice(&self.rdev.to_le_bytes());
        put_time(&mut b, 56, self.atime);
        put_time(&mut b, 68, self.mtime);
        put_time(&mut b, 80, self.ctime);
        put_time(&mut b, 92, self.crtime);
        b[104..112].copy_from_slice(&self.parent.to_le_bytes());
        b[112..120].copy_from_slice(&self.next_index.to_le_bytes());
        b
    }

    /// Decodes and validates an inode item found in `block` (for error messages).
    pub fn decode(ino: u64, b: &[u8], block: u64) -> Result<Inode> {
        let key = Inode::key(ino);
        if b.len() != INODE_BYTES {
            return Err(Error::bad_item(key, block, format!("inode item of {} bytes", b.len())));
        }
        let kind = FileKind::from_u8(b[8])
            .ok_or_else(|| Error::bad_item(key, block, format!("unknown file type {}", b[8])))?;
        let mode = le_u32(b, 12);
        if mode & !0o7777 != 0 {
            return Err(Error::bad_item(key, block, format!("mode {mode:o} has bits beyond 07777")));
        }
        let inode = Inode {
            ino,
            generation: le_u64(b, 0),
            kind,
            mode,
            nlink: le_u32(b, 16),
            uid: le_u32(b, 20),
            gid: le_u32(b, 24),
            flags: le_u32(b, 28),
            size: le_u64(b, 32),
            blocks: le_u64(b, 40),
            rdev: le_u64(b, 48),
            atime: get_time(b, 56),
            mtime: get_time(b, 68),
            ctime: get_time(b, 80),
            crtime: get_time(b, 92),
            parent: le_u64(b, 104),
            next_index: le_u64(b, 112),
        };
        if inode.kind == FileKind::Symlink && (inode.size == 0 || inode.size > crate::limits::SYMLINK_MAX as u64) {
            return Err(Error::bad_item(key, block, format!("symlink of {} bytes", inode.size)));
        }
        if inode.size > crate::limits::MAX_FILE_BYTES {
            return Err(Error::bad_item(key, block, format!("size {} beyond the largest file", inode.size)));
        }
        for t in [inode.atime, inode.mtime, inode.ctime, inode.crtime] {
            if t.nsec >= 1_000_000_000 {
                return Err(Error::bad_item(key, block, format!("timestamp nanoseconds {}", t.nsec)));
            }
        }
        if inode.flags & !KNOWN_FLAGS != 0 || b[9..12].iter().chain(&b[120..]).any(|&x| x != 0) {
            return Err(Error::bad_item(key, block, "reserved bytes are not zero"));
        }
        Ok(inode)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn roundtrip_and_rejects() {
        let i = Inode {
            ino: 77,
            generation: 0xdead_beef,
            kind: FileKind::Symlink,
            mode: 0o4755,
            nlink: 3,
            uid: 1000,
            gid: 100,
            size: 2345,
            blocks: 4,
            rdev: 0x0801,
            atime: Timespec::new(-5, 999_999_999),
            mtime: Timespec::new(1_700_000_000, 1),
            ctime: Timespec::new(2, 3),
            crtime: Timespec::new(4, 5),
            parent: 0,
            next_index: 9,
            flags: 0,
        };
        let b = i.encode();
        assert_eq!(Inode::decode(77, &b, 0).ok(), Some(i.clone()));
        assert!(Inode::decode(77, &b[..100], 0).is_err());
        let mut bad = b.clone();
        bad[8] = 99;
        assert!(Inode::decode(77, &bad, 0).is_err());
        let mut bad = b.clone();
        bad[15] = 0xff;
        assert!(Inode::decode(77, &bad, 0).is_err());
        let mut long_link = i.clone();
        long_link.size = 4096;
        assert!(Inode::decode(77, &long_link.encode(), 0).is_err(), "a symlink longer than PATH_MAX - 1");
        let mut bad = b;
        bad[64..68].copy_from_slice(&2_000_000_000u32.to_le_bytes());
        assert!(Inode::decode(77, &bad, 0).is_err());
    }
}
