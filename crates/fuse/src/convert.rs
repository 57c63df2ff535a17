//! Pure conversions between the kernel's vocabulary (fuser types, `mode_t`, directory
//! offsets, xattr buffers) and the wire's (`crest_proto`). No I/O, and no state but the
//! `st_blksize` the mount reports (`set_reported_blksize`): everything here is unit-tested.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use crest_proto as p;
use fuser::{FileAttr, FileType, INodeNo, TimeOrNow};

/// `st_blksize` reported for every file: crest's block size.
pub const BLOCK_SIZE_BYTES: u32 = 4096;

/// What `st_blksize` says: crest's block size, or on a mount whose big writes go to
/// objects, an object's worth (as CephFS and NFS report their object or wsize), so that
/// `cp` and stdio write in pieces that size.
static REPORTED_BLKSIZE: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(BLOCK_SIZE_BYTES);

/// Sets what `st_blksize` says from now on.
pub fn set_reported_blksize(bytes: u32) {
    REPORTED_BLKSIZE.store(bytes, std::sync::atomic::Ordering::Relaxed);
}

fn reported_blksize() -> u32 {
    REPORTED_BLKSIZE.load(std::sync::atomic::Ordering::Relaxed)
}

/// FUSE offset that follows ".": the next call starts with "..".
pub const DOT_OFFSET: u64 = 1;
/// FUSE offset that follows "..": the next call starts with the first real entry.
pub const DOTDOT_OFFSET: u64 = 2;

/// The FUSE offset stored with a directory entry of server index `index`.
///
/// The kernel hands an entry's offset back to ask for what *follows* that entry, so the
/// offset must name the next position: `index + 1`, shifted by the two synthetic entries
/// ("." → 1, ".." → 2). Hence `index + 3`, and [`from_index`] inverts it to `index + 1`.
/// Offsets depend only on the server's stable per-directory index, never on how a listing
/// was paged, so a `seekdir` to any returned offset resumes exactly after that entry.
pub fn entry_offset(index: u64) -> u64 {
    index.saturating_add(3)
}

/// The server index to list from when the kernel asks for directory offset `offset`
/// (0 and 1 mean the synthetic entries come first; listing then starts at index 0).
pub fn from_index(offset: u64) -> u64 {
    offset.saturating_sub(DOTDOT_OFFSET)
}

/// The wire file type for a `mknod` mode (`S_IFMT` bits); a zero type means a regular
/// file, as in `mknod(2)`. Directories and symlinks have their own operations.
pub fn kind_from_mode(mode: u32) -> Option<p::FileType> {
    match mode & libc::S_IFMT {
        0 | libc::S_IFREG => Some(p::FileType::Regular),
        libc::S_IFCHR => Some(p::FileType::CharDevice),
        libc::S_IFBLK => Some(p::FileType::BlockDevice),
        libc::S_IFIFO => Some(p::FileType::Fifo),
        libc::S_IFSOCK => Some(p::FileType::Socket),
        _ => None,
    }
}

/// Permission bits a new node asks for (the umask or a default ACL applies later:
/// `acl::inherit`).
pub fn create_mode(mode: u32) -> u32 {
    mode & 0o7777
}

/// The kernel's file type for a wire file type.
pub fn file_type(kind: p::FileType) -> FileType {
    match kind {
        p::FileType::Regular => FileType::RegularFile,
        p::FileType::Directory => FileType::Directory,
        p::FileType::Symlink => FileType::Symlink,
        p::FileType::CharDevice => FileType::CharDevice,
        p::FileType::BlockDevice => FileType::BlockDevice,
        p::FileType::Fifo => FileType::NamedPipe,
        p::FileType::Socket => FileType::Socket,
    }
}

/// A wire time as a `SystemTime` (seconds may be negative; nanoseconds always add).
pub fn system_time(t: p::Time) -> SystemTime {
    let nsec = Duration::from_nanos(u64::from(t.nsec.min(999_999_999)));
    let base = if t.sec >= 0 {
        UNIX_EPOCH.checked_add(Duration::from_secs(t.sec.unsigned_abs()))
    } else {
        UNIX_EPOCH.checked_sub(Duration::from_secs(t.sec.unsigned_abs()))
    };
    base.and_then(|b| b.checked_add(nsec)).unwrap_or(UNIX_EPOCH)
}

/// A `SystemTime` as a wire time (`nsec` in `0..1e9`, so 1.3 s before the epoch is
/// `(-2, 700_000_000)`).
pub fn wire_time(t: SystemTime) -> p::Time {
    match t.duration_since(UNIX_EPOCH) {
        Ok(d) => p::Time { sec: i64::try_from(d.as_secs()).unwrap_or(i64::MAX), nsec: d.subsec_nanos() },
        Err(e) => {
            let d = e.duration();
            let sec = i64::try_from(d.as_secs()).map(|s| -s).unwrap_or(i64::MIN);
            if d.subsec_nanos() == 0 {
                p::Time { sec, nsec: 0 }
            } else {
                p::Time { sec: sec.saturating_sub(1), nsec: 1_000_000_000 - d.subsec_nanos() }
            }
        }
    }
}

/// A time from a fuser `setattr` request as a wire time.
///
/// fuser 0.18 decodes the kernel's `(sec, nsec)` with negative `sec` as
/// `EPOCH - (|sec| + nsec)` instead of `EPOCH - |sec| + nsec`, so for times before the epoch
/// the distance it gives is exactly the kernel's `(|sec|, nsec)`: undo that here. Times at
/// or after the epoch are decoded correctly and convert normally.
pub fn setattr_time(t: SystemTime) -> p::Time {
    match t.duration_since(UNIX_EPOCH) {
        Ok(_) => wire_time(t),
        Err(e) => {
            let d = e.duration();
            p::Time { sec: i64::try_from(d.as_secs()).map(|s| -s).unwrap_or(i64::MIN), nsec: d.subsec_nanos() }
        }
    }
}

/// A time to set, from the kernel's.
pub fn set_time(t: TimeOrNow) -> p::SetTime {
    match t {
        TimeOrNow::Now => p::SetTime::Now,
        TimeOrNow::SpecificTime(t) => p::SetTime::At(setattr_time(t)),
    }
}

/// Kernel attributes from wire attributes.
pub fn file_attr(a: &p::Attr) -> FileAttr {
    FileAttr {
        ino: INodeNo(a.ino),
        size: a.size_bytes,
        blocks: a.blocks_4k.saturating_mul(u64::from(BLOCK_SIZE_BYTES / 512)),
        atime: system_time(a.atime),
        mtime: system_time(a.mtime),
        ctime: system_time(a.ctime),
        crtime: system_time(a.crtime),
        kind: file_type(a.kind),
        perm: (a.mode & 0o7777) as u16,
        nlink: a.nlink,
        uid: a.uid,
        gid: a.gid,
        rdev: a.rdev as u32,
        blksize: reported_blksize(),
        flags: 0,
    }
}

/// Placeholder attributes for entries whose attributes the kernel ignores: the "." and
/// ".." of a readdirplus listing, and negative lookups (inode 0).
pub fn placeholder_attr(ino: u64, kind: FileType) -> FileAttr {
    FileAttr {
        ino: INodeNo(ino),
        size: 0,
        blocks: 0,
        atime: UNIX_EPOCH,
        mtime: UNIX_EPOCH,
        ctime: UNIX_EPOCH,
        crtime: UNIX_EPOCH,
        kind,
        perm: 0,
        nlink: 1,
        uid: 0,
        gid: 0,
        rdev: 0,
        blksize: BLOCK_SIZE_BYTES,
        flags: 0,
    }
}

/// The `listxattr` buffer: every name followed by a NUL.
pub fn xattr_list(names: &[Vec<u8>]) -> Vec<u8> {
    let mut out = Vec::with_capacity(names.iter().map(|n| n.len() + 1).sum());
    for n in names {
        out.extend_from_slice(n);
        out.push(0);
    }
    out
}

/// What a `getxattr`/`listxattr` reply carries for a value of `len` bytes when the caller
/// offered a buffer of `size` bytes (0 asks only for the size).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum XattrAnswer {
    /// Only the length (a size-0 probe).
    Size(u32),
    /// The bytes themselves.
    Data,
    /// The buffer is too small: ERANGE.
    TooSmall,
}

/// Size-probe semantics of the xattr calls.
pub fn xattr_answer(len: usize, size: u32) -> XattrAnswer {
    match u32::try_from(len) {
        Err(_) => XattrAnswer::TooSmall,
        Ok(len) if size == 0 => XattrAnswer::Size(len),
        Ok(len) if len <= size => XattrAnswer::Data,
        Ok(_) => XattrAnswer::TooSmall,
    }
}

/// The wire's rename flags from `renameat2` flags; `None` for flags crest does not take
/// (unknown bits, a whiteout with an exchange): EINVAL.
pub fn rename_flags(flags: u32) -> Option<u32> {
    let known = libc::RENAME_NOREPLACE | libc::RENAME_EXCHANGE | libc::RENAME_WHITEOUT;
    if flags & !known != 0 || (flags & libc::RENAME_WHITEOUT != 0 && flags & libc::RENAME_EXCHANGE != 0) {
        return None;
    }
    let mut out = 0;
    if flags & libc::RENAME_NOREPLACE != 0 {
        out |= p::RENAME_NOREPLACE;
    }
    if flags & libc::RENAME_EXCHANGE != 0 {
        out |= p::RENAME_EXCHANGE;
    }
    if flags & libc::RENAME_WHITEOUT != 0 {
        out |= p::RENAME_WHITEOUT;
    }
    Some(out)
}

/// The wire's fallocate flags from `fallocate(2)`'s mode (unknown bits are passed on, so
/// the server can refuse them with EOPNOTSUPP).
pub fn fallocate_flags(mode: i32) -> u32 {
    let mode = mode as u32;
    let mut out = mode & !(libc::FALLOC_FL_KEEP_SIZE | libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_ZERO_RANGE) as u32;
    if mode & libc::FALLOC_FL_KEEP_SIZE as u32 != 0 {
        out |= p::FALLOC_FL_KEEP_SIZE;
    }
    if mode & libc::FALLOC_FL_PUNCH_HOLE as u32 != 0 {
        out |= p::FALLOC_FL_PUNCH_HOLE;
    }
    if mode & libc::FALLOC_FL_ZERO_RANGE as u32 != 0 {
        out |= p::FALLOC_FL_ZERO_RANGE;
    }
    out
}

/// The wire's xattr flags from `setxattr(2)`'s.
pub fn xattr_flags(flags: i32) -> u32 {
    let mut out = 0;
    if flags & libc::XATTR_CREATE != 0 {
        out |= p::XATTR_CREATE;
    }
    if flags & libc::XATTR_REPLACE != 0 {
        out |= p::XATTR_REPLACE;
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn attr() -> p::Attr {
        p::Attr {
            ino: 42,
            generation: 7,
            kind: p::FileType::Regular,
            mode: 0o4755,
            nlink: 2,
            uid: 1000,
            gid: 100,
            size_bytes: 12345,
            blocks_4k: 4,
            rdev: 0x0801,
            atime: p::Time { sec: 10, nsec: 5 },
            mtime: p::Time { sec: -2, nsec: 700_000_000 },
            ctime: p::Time { sec: 0, nsec: 0 },
            crtime: p::Time { sec: 1_700_000_000, nsec: 999_999_999 },
            flags: 0,
        }
    }

    #[test]
    fn mode_to_kind() {
        assert_eq!(kind_from_mode(libc::S_IFREG | 0o644), Some(p::FileType::Regular));
        assert_eq!(kind_from_mode(0o644), Some(p::FileType::Regular));
        assert_eq!(kind_from_mode(libc::S_IFCHR | 0o600), Some(p::FileType::CharDevice));
        assert_eq!(kind_from_mode(libc::S_IFBLK), Some(p::FileType::BlockDevice));
        assert_eq!(kind_from_mode(libc::S_IFIFO | 0o666), Some(p::FileType::Fifo));
        assert_eq!(kind_from_mode(libc::S_IFSOCK | 0o755), Some(p::FileType::Socket));
        assert_eq!(kind_from_mode(libc::S_IFDIR | 0o755), None);
        assert_eq!(kind_from_mode(libc::S_IFLNK | 0o777), None);
    }

    #[test]
    fn type_bits_are_stripped() {
        assert_eq!(create_mode(libc::S_IFREG | 0o666), 0o666);
        assert_eq!(create_mode(libc::S_IFDIR | 0o7777), 0o7777);
        assert_eq!(create_mode(0o4755), 0o4755);
    }

    #[test]
    fn attr_conversion() {
        let a = file_attr(&attr());
        assert_eq!(a.ino, INodeNo(42));
        assert_eq!(a.size, 12345);
        assert_eq!(a.blocks, 32);
        assert_eq!(a.kind, FileType::RegularFile);
        assert_eq!(a.perm, 0o4755);
        assert_eq!((a.nlink, a.uid, a.gid, a.rdev), (2, 1000, 100, 0x0801));
        assert_eq!(a.blksize, 4096);
        assert_eq!(a.atime, UNIX_EPOCH + Duration::new(10, 5));
        assert_eq!(a.mtime, UNIX_EPOCH - Duration::from_millis(1300));
        assert_eq!(a.ctime, UNIX_EPOCH);
        assert_eq!(a.crtime, UNIX_EPOCH + Duration::new(1_700_000_000, 999_999_999));
        let mut d = attr();
        d.kind = p::FileType::Directory;
        d.mode = 0o40755; // type bits never leak into perm
        assert_eq!(file_attr(&d).kind, FileType::Directory);
        assert_eq!(file_attr(&d).perm, 0o755);
    }

    #[test]
    fn kinds_map_one_to_one() {
        use p::FileType as W;
        let all = [W::Regular, W::Directory, W::Symlink, W::CharDevice, W::BlockDevice, W::Fifo, W::Socket];
        let mapped: std::collections::HashSet<_> = all.iter().map(|k| file_type(*k)).collect();
        assert_eq!(mapped.len(), all.len());
        assert_eq!(file_type(W::Fifo), FileType::NamedPipe);
    }

    #[test]
    fn times_round_trip_including_negative() {
        for (sec, nsec) in [(0, 0), (1, 1), (-1, 0), (-2, 700_000_000), (-1, 999_999_999), (1_700_000_000, 123)] {
            let t = p::Time { sec, nsec };
            assert_eq!(wire_time(system_time(t)), t, "{sec} {nsec}");
        }
        assert_eq!(wire_time(UNIX_EPOCH - Duration::from_millis(1300)), p::Time { sec: -2, nsec: 700_000_000 });
    }

    #[test]
    fn setattr_times_undo_fusers_negative_decoding() {
        // fuser turns the kernel's (-2, 700_000_000) (= -1.3 s) into EPOCH - 2.7 s.
        let from_fuser = UNIX_EPOCH - Duration::new(2, 700_000_000);
        assert_eq!(setattr_time(from_fuser), p::Time { sec: -2, nsec: 700_000_000 });
        assert_eq!(setattr_time(UNIX_EPOCH - Duration::new(5, 0)), p::Time { sec: -5, nsec: 0 });
        assert_eq!(setattr_time(UNIX_EPOCH + Duration::new(5, 9)), p::Time { sec: 5, nsec: 9 });
        assert_eq!(set_time(TimeOrNow::Now), p::SetTime::Now);
    }

    #[test]
    fn directory_offsets_are_stable_and_resume_after_the_entry() {
        // "." and ".." lead; any offset 0..=2 starts the real entries at index 0.
        assert_eq!(from_index(0), 0);
        assert_eq!(from_index(DOT_OFFSET), 0);
        assert_eq!(from_index(DOTDOT_OFFSET), 0);
        // An entry's offset asks for what follows it, whatever the page boundaries were.
        for index in [0u64, 1, 5, 1 << 40] {
            assert_eq!(from_index(entry_offset(index)), index + 1);
            assert!(entry_offset(index) > DOTDOT_OFFSET);
        }
        // Offsets grow with the index (the kernel expects nothing else, telldir likes it).
        assert!(entry_offset(4) < entry_offset(5));
        assert_eq!(entry_offset(u64::MAX), u64::MAX);
    }

    #[test]
    fn xattr_list_encoding() {
        assert_eq!(xattr_list(&[]), Vec::<u8>::new());
        assert_eq!(xattr_list(&[b"user.a".to_vec(), b"trusted.bc".to_vec()]), b"user.a\0trusted.bc\0".to_vec());
    }

    #[test]
    fn xattr_size_probe() {
        assert_eq!(xattr_answer(10, 0), XattrAnswer::Size(10));
        assert_eq!(xattr_answer(0, 0), XattrAnswer::Size(0));
        assert_eq!(xattr_answer(10, 10), XattrAnswer::Data);
        assert_eq!(xattr_answer(10, 64), XattrAnswer::Data);
        assert_eq!(xattr_answer(10, 9), XattrAnswer::TooSmall);
    }

    #[test]
    fn flag_translation() {
        assert_eq!(rename_flags(0), Some(0));
        assert_eq!(rename_flags(libc::RENAME_NOREPLACE), Some(p::RENAME_NOREPLACE));
        assert_eq!(rename_flags(libc::RENAME_EXCHANGE), Some(p::RENAME_EXCHANGE));
        assert_eq!(rename_flags(libc::RENAME_WHITEOUT), Some(p::RENAME_WHITEOUT));
        assert_eq!(rename_flags(libc::RENAME_WHITEOUT | libc::RENAME_NOREPLACE), Some(5));
        assert_eq!(rename_flags(libc::RENAME_WHITEOUT | libc::RENAME_EXCHANGE), None);
        assert_eq!(rename_flags(8), None);
        assert_eq!(fallocate_flags(0), 0);
        assert_eq!(
            fallocate_flags(libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE),
            p::FALLOC_FL_PUNCH_HOLE | p::FALLOC_FL_KEEP_SIZE
        );
        assert_eq!(fallocate_flags(libc::FALLOC_FL_ZERO_RANGE), p::FALLOC_FL_ZERO_RANGE);
        assert_eq!(fallocate_flags(libc::FALLOC_FL_COLLAPSE_RANGE), libc::FALLOC_FL_COLLAPSE_RANGE as u32);
        assert_eq!(xattr_flags(libc::XATTR_CREATE), p::XATTR_CREATE);
        assert_eq!(xattr_flags(libc::XATTR_REPLACE), p::XATTR_REPLACE);
        assert_eq!(xattr_flags(0), 0);
    }
}
