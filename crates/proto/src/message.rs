//! Messages. Every integer carries its unit in its name where one applies; times are
//! `(seconds, nanoseconds)`. Strings that are file names are raw bytes (Linux names need
//! not be UTF-8).

use serde::{Deserialize, Serialize};

/// The newest protocol version this code speaks; it speaks every version from
/// `OLDEST_PROTOCOL_VERSION` up to it. A client's hello names its newest, and the server
/// answers in the newer of the two versions both speak (`agree_version`); a peer outside
/// the range is refused with a message naming both sides' versions, and a client refused by
/// an older server (whose `Refused::version` it also speaks) says hello again in that
/// version. `Hello`, `Admin`, `Join`, `Renew` and `Refused` keep their layout in every version, so
/// that any two releases can tell each other which version they speak (docs/protocol.md §1).
pub const PROTOCOL_VERSION: u32 = 16;
/// The oldest protocol version this code still speaks (what each version added:
/// docs/protocol.md §1).
pub const OLDEST_PROTOCOL_VERSION: u32 = 13;
/// Version 14: the welcome names the server's release (`Welcome::server_release`).
pub const PROTOCOL_WELCOME_NAMES_RELEASE: u32 = 14;
/// Version 15: a getattr of a directory other sessions are changing may be answered with
/// `Reply::AttrOnly` (the attributes, no right to cache them).
pub const PROTOCOL_ATTR_ONLY: u32 = 15;
/// Version 16: file data in an object store (docs/objects.md): `Op::Uploads`,
/// `Op::MapObject`, and reads answered with `Reply::Located`.
pub const PROTOCOL_OBJECTS: u32 = 16;

/// The version a server at `PROTOCOL_VERSION` speaks to a client whose newest is
/// `client`: the newer of those both speak, or why there is none.
pub fn agree_version(client: u32) -> Result<u32, String> {
    if client < OLDEST_PROTOCOL_VERSION {
        return Err(format!(
            "client speaks protocol version {client}, this server speaks {OLDEST_PROTOCOL_VERSION} to {PROTOCOL_VERSION}: \
             upgrade the client"
        ));
    }
    Ok(client.min(PROTOCOL_VERSION))
}

/// The last protocol version whose servers refused every other version: from 14 on a
/// server answers a newer client in its own version, so only a server at or below this
/// one refuses a client for its version alone.
pub const LAST_EXACT_PROTOCOL_VERSION: u32 = 13;

/// Whether a client at `PROTOCOL_VERSION` whose hello at `tried` was refused by a server
/// that speaks `server` should say hello again in that version: a server that knew only
/// its own version (at most `LAST_EXACT_PROTOCOL_VERSION`), which this code speaks too.
/// A later server's refusal is about something else (a token already redeemed, a limit),
/// and asking again would hide it.
pub fn retry_version(tried: u32, server: u32) -> Option<u32> {
    (server <= LAST_EXACT_PROTOCOL_VERSION && (OLDEST_PROTOCOL_VERSION..tried).contains(&server)).then_some(server)
}
/// `Op::Open` access bits: the open's access mode as the kernel checks it (the values
/// of `acl::MAY_READ`, `MAY_WRITE`, `MAY_EXEC`).
pub const OPEN_READ: u32 = crate::acl::MAY_READ;
/// See `OPEN_READ`.
pub const OPEN_WRITE: u32 = crate::acl::MAY_WRITE;
/// An open to execute the file (the kernel's `FMODE_EXEC`): reading it needs only
/// execute permission.
pub const OPEN_EXEC: u32 = crate::acl::MAY_EXEC;
/// First bytes of a client hello, so a stray connection is recognised at once.
pub const HELLO_MAGIC: [u8; 4] = *b"CRST";
/// Longest client name a hello may carry, in bytes (the server keeps it with the session
/// and logs it; a longer one is refused).
pub const MAX_CLIENT_NAME_BYTES: usize = 256;

/// Longest dataset name a hello may carry (the store's limit).
pub const MAX_DATASET_NAME_BYTES: usize = 200;
/// Most operations in one compound request.
pub const MAX_OPS_PER_REQUEST: usize = 1024;
/// Most `SetLock` operations in one request: each looks at every lock of its file (up
/// to `locks::MAX_LOCKS_PER_FILE`), and a request is one step of the server's store, so
/// this bounds how long one request holds up the others.
pub const MAX_LOCK_OPS_PER_REQUEST: usize = 16;
/// The most entries an `Acquire` reply lists (a larger directory is not held whole).
pub const MAX_ACQUIRE_ENTRIES: usize = 20_000;
/// The most bytes of names an `Acquire` reply lists (it must fit in one frame with the
/// entries' attributes: ~100 bytes each).
pub const MAX_ACQUIRE_BYTES: usize = 1 << 20;
/// Largest read or write payload of one operation (4 MiB, FUSE's largest request).
pub const MAX_IO_BYTES: u32 = 4 << 20;
/// Most inode numbers one `Op::AllocInodes` hands out.
pub const MAX_INODE_GRANT: u32 = 1 << 16;
/// The size every directory's attributes report (its entry count is the server's own).
pub const DIR_SIZE_BYTES: u64 = 4096;

/// Seconds and nanoseconds since the epoch.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Time {
    /// Seconds.
    pub sec: i64,
    /// Nanoseconds (below 1e9).
    pub nsec: u32,
}

/// File types on the wire.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum FileType {
    /// Regular file.
    Regular,
    /// Directory.
    Directory,
    /// Symbolic link.
    Symlink,
    /// Character device.
    CharDevice,
    /// Block device.
    BlockDevice,
    /// Named pipe.
    Fifo,
    /// Socket.
    Socket,
}

/// Attributes of an inode.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Attr {
    /// Inode number.
    pub ino: u64,
    /// Generation: (ino, generation) names a file for ever.
    pub generation: u64,
    /// Type.
    pub kind: FileType,
    /// Permission bits (`0o7777`).
    pub mode: u32,
    /// Links.
    pub nlink: u32,
    /// Owner.
    pub uid: u32,
    /// Group.
    pub gid: u32,
    /// Size in bytes.
    pub size_bytes: u64,
    /// Allocated 4 KiB blocks.
    pub blocks_4k: u64,
    /// Device number.
    pub rdev: u64,
    /// Access time.
    pub atime: Time,
    /// Modification time.
    pub mtime: Time,
    /// Change time.
    pub ctime: Time,
    /// Creation time.
    pub crtime: Time,
    /// `acl::HAS_ACCESS`, `acl::HAS_DEFAULT`: which ACLs the inode has, so a client can
    /// answer the kernel's ACL look-ups for inodes without one.
    pub flags: u32,
}

/// Who is asking (used for ownership of new files; permissions are checked by the
/// client kernel with `default_permissions`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Cred {
    /// Caller's uid.
    pub uid: u32,
    /// Caller's gid.
    pub gid: u32,
    /// Caller's umask: the server applies it to a new inode's mode unless the parent
    /// directory has a default ACL, which masks the mode instead (`acl::inherit`).
    pub umask: u32,
}

/// A time to set.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum SetTime {
    /// The server's clock.
    Now,
    /// This time.
    At(Time),
}

/// Attribute changes; `None` leaves a field alone.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct SetAttr {
    /// Permission bits.
    pub mode: Option<u32>,
    /// Owner.
    pub uid: Option<u32>,
    /// Group.
    pub gid: Option<u32>,
    /// Size (truncate/extend).
    pub size_bytes: Option<u64>,
    /// Access time.
    pub atime: Option<SetTime>,
    /// Modification time.
    pub mtime: Option<SetTime>,
    /// Change time.
    pub ctime: Option<Time>,
}

/// One directory entry with its attributes (readdirplus, and cache priming).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct DirItem {
    /// Name.
    pub name: Vec<u8>,
    /// Position: the next listing continues at `index + 1`.
    pub index: u64,
    /// Attributes.
    pub attr: Attr,
}

/// The hash that orders a directory's entries on the server and names the ranges of
/// `DirLeaf` (64-bit FNV-1a of the name's bytes). Part of the protocol: a client uses it
/// to tell whether a name falls in a range it holds.
pub fn name_hash(name: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for &b in name {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    h
}

/// A stretch of one directory as the server stores it: every entry whose `name_hash`
/// lies in `hash_lo..=hash_hi`, with attributes. A name hashing into the range and not
/// listed does not exist (as of the reply). Empty when `hash_lo > hash_hi`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct DirLeaf {
    /// First hash covered.
    pub hash_lo: u64,
    /// Last hash covered (inclusive).
    pub hash_hi: u64,
    /// Every entry in the range.
    pub items: Vec<DirItem>,
}

impl DirLeaf {
    /// A leaf that speaks for no name: a reply that lends no stretch of the directory.
    pub fn none() -> DirLeaf {
        DirLeaf { hash_lo: 1, hash_hi: 0, items: Vec::new() }
    }

    /// True when the leaf speaks for names with this hash.
    pub fn covers(&self, hash: u64) -> bool {
        self.hash_lo <= hash && hash <= self.hash_hi
    }
}

/// File system usage.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct StatFs {
    /// Block size in bytes.
    pub block_size: u32,
    /// Blocks in the file system.
    pub total_blocks: u64,
    /// Free blocks.
    pub free_blocks: u64,
    /// Blocks available to users.
    pub avail_blocks: u64,
    /// Inodes in use.
    pub files: u64,
    /// Inodes free.
    pub files_free: u64,
    /// Longest name.
    pub name_max: u32,
}

/// Rename flags (Linux values: NOREPLACE = 1, EXCHANGE = 2, WHITEOUT = 4).
pub const RENAME_NOREPLACE: u32 = 1;
/// See `RENAME_NOREPLACE`.
pub const RENAME_EXCHANGE: u32 = 2;
/// Leaves a whiteout (a character device 0:0, as overlayfs makes them) at the old name.
pub const RENAME_WHITEOUT: u32 = 4;
/// Xattr flags (Linux values).
pub const XATTR_CREATE: u32 = 1;
/// See `XATTR_CREATE`.
pub const XATTR_REPLACE: u32 = 2;
/// crest's own: setting `system.posix_acl_access` also clears setgid, because the caller
/// is neither in the file's group nor holds CAP_FSETID (the kernel's rule, which only the
/// client can judge).
pub const XATTR_ACL_KILL_SGID: u32 = 1 << 16;
/// fallocate flags (Linux values).
pub const FALLOC_FL_KEEP_SIZE: u32 = 1;
/// See `FALLOC_FL_KEEP_SIZE`.
pub const FALLOC_FL_PUNCH_HOLE: u32 = 2;
/// See `FALLOC_FL_KEEP_SIZE`.
pub const FALLOC_FL_ZERO_RANGE: u32 = 0x10;
/// Most bytes the `Op::Fallocate`s of one request that allocate or zero may cover
/// together (the server refuses more with EINVAL). A request's work is done in one step of the store, between other
/// sessions' requests; so a big allocation is sent as several ops of at most this, each a
/// request of its own (`fallocate_steps`), and others' work goes between them. A punched
/// hole costs the extents it frees, not its length: it is one op, however long.
pub const MAX_FALLOCATE_STEP: u64 = 4 << 20;

/// Why a request is refused whole before any of it runs (errno and message), if it is:
/// more than `MAX_OPS_PER_REQUEST` operations or `MAX_LOCK_OPS_PER_REQUEST` locks (E2BIG),
/// or allocations (fallocate not punching) above `MAX_FALLOCATE_STEP` together (EINVAL).
/// A request is one step of the server's store: what one may cost is bounded.
pub fn request_refusal(ops: &[Op]) -> Option<(i32, String)> {
    if ops.len() > MAX_OPS_PER_REQUEST {
        return Some((7, format!("{} operations in one request (max {MAX_OPS_PER_REQUEST})", ops.len())));
    }
    let locks = ops.iter().filter(|op| matches!(op, Op::SetLock { .. })).count();
    if locks > MAX_LOCK_OPS_PER_REQUEST {
        return Some((7, format!("{locks} lock operations in one request (max {MAX_LOCK_OPS_PER_REQUEST})")));
    }
    let allocating = ops
        .iter()
        .filter_map(|op| match op {
            Op::Fallocate { len, flags, .. } if flags & FALLOC_FL_PUNCH_HOLE == 0 => Some(*len),
            _ => None,
        })
        .fold(0u64, u64::saturating_add);
    (allocating > MAX_FALLOCATE_STEP)
        .then(|| (22, format!("fallocate of {allocating} bytes in one request (at most {MAX_FALLOCATE_STEP})")))
}

/// The (offset, len) of the ops a fallocate of `len` bytes at `offset` in mode `flags` is
/// sent as, in order (`MAX_FALLOCATE_STEP`). As on ext4, steps done before one that fails
/// stay allocated.
pub fn fallocate_steps(offset: u64, len: u64, flags: u32) -> impl Iterator<Item = (u64, u64)> {
    let step = if flags & FALLOC_FL_PUNCH_HOLE != 0 { u64::MAX } else { MAX_FALLOCATE_STEP };
    let end = offset.saturating_add(len);
    // (A length of 0 is one op still: the server answers it as it answers any.)
    let mut next = Some(offset);
    std::iter::from_fn(move || {
        let at = next?;
        let n = (end - at).min(step);
        next = Some(at + n).filter(|&e| e < end);
        Some((at, n))
    })
}

/// What a byte-range lock request asks for.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum LockKind {
    /// Shared: coexists with other read locks (F_RDLCK, LOCK_SH).
    Read,
    /// Exclusive: coexists with no other lock (F_WRLCK, LOCK_EX).
    Write,
    /// Drops the owner's locks in the range (F_UNLCK, LOCK_UN).
    Unlock,
}

/// The end of a lock range that means "to the end of the file, however long it grows".
pub const LOCK_TO_EOF: u64 = u64::MAX;

/// A lock held by another owner that conflicts with a request (the answer to `GetLock`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct LockInfo {
    /// `Read` or `Write`.
    pub kind: LockKind,
    /// First byte.
    pub start: u64,
    /// Last byte, inclusive (`LOCK_TO_EOF`: the rest of the file).
    pub end: u64,
    /// The holder's process id, as its client reported it (meaningful on its host only).
    pub pid: u32,
}

/// One file system operation.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[allow(missing_docs)]
pub enum Op {
    Lookup {
        parent: u64,
        name: Vec<u8>,
    },
    GetAttr {
        ino: u64,
    },
    SetAttr {
        ino: u64,
        set: SetAttr,
    },
    ReadDir {
        ino: u64,
        from_index: u64,
        limit: u32,
    },
    /// Regular files, directories, devices, fifos, sockets.
    Create {
        parent: u64,
        name: Vec<u8>,
        kind: FileType,
        mode: u32,
        rdev: u64,
        cred: Cred,
    },
    Symlink {
        parent: u64,
        name: Vec<u8>,
        target: Vec<u8>,
        cred: Cred,
    },
    Link {
        ino: u64,
        parent: u64,
        name: Vec<u8>,
    },
    Unlink {
        parent: u64,
        name: Vec<u8>,
    },
    Rmdir {
        parent: u64,
        name: Vec<u8>,
    },
    Rename {
        parent: u64,
        name: Vec<u8>,
        new_parent: u64,
        new_name: Vec<u8>,
        flags: u32,
    },
    ReadLink {
        ino: u64,
    },
    /// Keeps an unlinked inode alive until the `Release` of the same `handle` (a number
    /// the client chose, unique among its session's open handles). Idempotent: a retry
    /// of an `Open` or `Release` of a handle already opened or released changes nothing,
    /// so neither needs the reply cache nor replay (handles die with the server anyway).
    /// `access` is what the descriptor may do (`OPEN_READ | OPEN_WRITE | OPEN_EXEC`):
    /// the server checks it as the kernel checks an open, and lets the session read or
    /// write the file through it whoever asks later (a descriptor passed to another user
    /// works as on a local file system). 0 asks nothing (a directory's open).
    Open {
        ino: u64,
        handle: u64,
        access: u32,
    },
    Release {
        ino: u64,
        handle: u64,
    },
    Read {
        ino: u64,
        offset: u64,
        len: u32,
    },
    Write {
        ino: u64,
        offset: u64,
        #[serde(with = "crate::checked")]
        data: Vec<u8>,
    },
    /// Writes `data` at the end of the file as the server sees it (O_APPEND: the writer's
    /// idea of the size may be stale when other clients append too).
    Append {
        ino: u64,
        #[serde(with = "crate::checked")]
        data: Vec<u8>,
    },
    Fallocate {
        ino: u64,
        offset: u64,
        len: u64,
        flags: u32,
    },
    /// Makes everything durable (crest commits the whole file system).
    Fsync {
        ino: u64,
    },
    StatFs,
    SetXattr {
        ino: u64,
        name: Vec<u8>,
        value: Vec<u8>,
        flags: u32,
    },
    GetXattr {
        ino: u64,
        name: Vec<u8>,
    },
    ListXattr {
        ino: u64,
    },
    RemoveXattr {
        ino: u64,
        name: Vec<u8>,
    },
    /// The client's clock for the operations after this one in the request (writeback
    /// submissions merged into one compound request each keep their own time).
    At {
        time: Time,
    },
    /// Reserves `count` inode numbers for this session's writeback creates (`CreateAt`,
    /// `SymlinkAt`); answered with `Reply::Inodes`.
    AllocInodes {
        count: u32,
    },
    /// `Create` with an inode number the client chose from a range it was granted (and a
    /// generation it chose): the client answered its caller before the server applied it.
    CreateAt {
        ino: u64,
        generation: u64,
        parent: u64,
        name: Vec<u8>,
        kind: FileType,
        mode: u32,
        rdev: u64,
        cred: Cred,
    },
    /// `Symlink` with a client-chosen inode number and generation (see `CreateAt`).
    SymlinkAt {
        ino: u64,
        generation: u64,
        parent: u64,
        name: Vec<u8>,
        target: Vec<u8>,
        cred: Cred,
    },
    /// Takes, changes or drops a lock of `owner` (an id the client chose, unique within its
    /// session) on bytes `start..=end` (`end` = `LOCK_TO_EOF`: to the end of the file).
    /// A try: a conflicting lock of another owner fails it at once with EAGAIN (11) and
    /// changes nothing; the server never makes a request wait. Locks of one owner never
    /// conflict with each other; a new one replaces the owner's overlapping ranges. `flock`
    /// locks are whole-file and live apart from POSIX (fcntl) locks: the two kinds never
    /// conflict with each other. A session's locks go when it ends or stays disconnected
    /// (docs/protocol.md §4.6).
    SetLock {
        ino: u64,
        owner: u64,
        start: u64,
        end: u64,
        kind: LockKind,
        flock: bool,
        pid: u32,
    },
    /// Asks for exclusive rights on directory `ino` and on every inode it names (so the
    /// client may answer creates, unlinks and renames in it, and changes of its entries,
    /// itself: docs/protocol.md §4.1). Answered, once every other session has given up
    /// what it held of them, with `Reply::Lookup { attr: the directory, leaf: every entry
    /// (hash range 0..=u64::MAX) }`. Refused with E2BIG (7) when the listing would not fit
    /// in a reply (`MAX_ACQUIRE_ENTRIES`, `MAX_ACQUIRE_BYTES`), ENOTDIR for a non-directory.
    Acquire {
        ino: u64,
    },
    /// After a server restart, while the session replays (before `Replayed`): the client
    /// held rights on `ino` before the restart — exclusive ones when `exclusive` — and
    /// keeps them if the server gives them back (`Reply::Done`). Refused with EBUSY (16)
    /// when another session holds rights that conflict, EINVAL (22) outside a replay
    /// (docs/protocol.md §4.5). Changes nothing stored.
    Reassert {
        ino: u64,
        exclusive: bool,
    },
    /// Names a lock of another owner that would conflict with this one (F_GETLK):
    /// `Reply::Lock(None)` when there is none.
    GetLock {
        ino: u64,
        owner: u64,
        start: u64,
        end: u64,
        kind: LockKind,
        flock: bool,
    },
    /// A write of pages the client's kernel cached: a shared writable mapping's dirty
    /// pages, written back. The server runs it as `Write`; but a session being recalled
    /// for the file sends these as part of its answer (a recall drops the pages, writing
    /// dirty ones back), so they run at once instead of waiting for the other sessions'
    /// write-back in turn, which a `write(2)` of that session does.
    WriteBack {
        ino: u64,
        offset: u64,
        data: Vec<u8>,
    },
    /// Object ids (1 to `MAX_UPLOADS`) this session may upload file data to, each with a
    /// URL to PUT it (protocol 16; an image keeping its data in an object store). Durable
    /// before the reply: an id is never granted twice.
    Uploads {
        count: u32,
    },
    /// Maps uploaded object `id` (granted to this session) over file bytes
    /// `[offset, offset + len)` (`offset` block-aligned): the object holds `csums.len()`
    /// blocks of 4 KiB, the last zero-padded past `len`, each with its CRC-32C. A write:
    /// the file grows to `offset + len` if shorter.
    MapObject {
        ino: u64,
        offset: u64,
        len: u64,
        id: u64,
        csums: Vec<u32>,
    },
}

/// Most object ids one `Op::Uploads` grants.
pub const MAX_UPLOADS: u32 = 64;
/// Most blocks (4 KiB) one object holds.
pub const MAX_OBJECT_BLOCKS: u64 = 1 << 14;

/// An object id to upload to and the presigned URL to PUT it with (the request must send
/// the header `If-None-Match: *`, which the URL signs: an object is written once).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Upload {
    /// The object id, to name in `Op::MapObject`.
    pub id: u64,
    /// Presigned PUT URL.
    pub url: String,
}

/// A read of a file whose data is partly in objects: `Reply::Located`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Located {
    /// File offset of the read's first byte.
    pub offset: u64,
    /// Bytes the read returns (clipped to the file); what no part covers reads as zeros.
    pub len: u64,
    /// Where they come from.
    pub parts: Vec<LocatedPart>,
}

/// Part of a located read.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum LocatedPart {
    /// Bytes of the read from offset `at` in it.
    Bytes {
        /// Offset in the read.
        at: u64,
        /// The bytes.
        #[serde(with = "crate::checked")]
        data: Vec<u8>,
    },
    /// File bytes from `file_at` (block-aligned) are blocks `block..` of the object that
    /// `url` (a presigned GET) names, one CRC-32C each; the reader fetches the blocks the
    /// read needs (a ranged GET) and checks them.
    Object {
        /// File offset of the object's block `block`.
        file_at: u64,
        /// First block of the object the part covers.
        block: u64,
        /// CRC-32C of each block.
        csums: Vec<u32>,
        /// Presigned GET URL of the object.
        url: String,
    },
}

impl Op {
    /// The operation's kind, for logs and counters.
    pub fn name(&self) -> &'static str {
        match self {
            Op::Lookup { .. } => "lookup",
            Op::GetAttr { .. } => "get_attr",
            Op::SetAttr { .. } => "set_attr",
            Op::ReadDir { .. } => "read_dir",
            Op::Create { .. } => "create",
            Op::Symlink { .. } => "symlink",
            Op::Link { .. } => "link",
            Op::Unlink { .. } => "unlink",
            Op::Rmdir { .. } => "rmdir",
            Op::Rename { .. } => "rename",
            Op::ReadLink { .. } => "read_link",
            Op::Open { .. } => "open",
            Op::Release { .. } => "release",
            Op::Read { .. } => "read",
            Op::Write { .. } => "write",
            Op::WriteBack { .. } => "write_back",
            Op::Uploads { .. } => "uploads",
            Op::MapObject { .. } => "map_object",
            Op::Append { .. } => "append",
            Op::Fallocate { .. } => "fallocate",
            Op::Fsync { .. } => "fsync",
            Op::StatFs => "stat_fs",
            Op::SetXattr { .. } => "set_xattr",
            Op::GetXattr { .. } => "get_xattr",
            Op::ListXattr { .. } => "list_xattr",
            Op::RemoveXattr { .. } => "remove_xattr",
            Op::At { .. } => "at",
            Op::AllocInodes { .. } => "alloc_inodes",
            Op::CreateAt { .. } => "create_at",
            Op::SymlinkAt { .. } => "symlink_at",
            Op::SetLock { .. } => "set_lock",
            Op::GetLock { .. } => "get_lock",
            Op::Acquire { .. } => "acquire",
            Op::Reassert { .. } => "reassert",
        }
    }

    /// True for operations that change the file system (these go through the reply cache).
    /// Locks change no stored state: a retried `SetLock` of the same owner finds its own
    /// lock and grants it again, so locks need neither the reply cache nor replay; nor does
    /// `Acquire` or `Reassert`, which change only who holds what (a retry grants the same
    /// again), nor `Open`/`Release`, idempotent by handle.
    pub fn is_mutation(&self) -> bool {
        !matches!(
            self,
            Op::Lookup { .. }
                | Op::GetAttr { .. }
                | Op::ReadDir { .. }
                | Op::ReadLink { .. }
                | Op::Read { .. }
                | Op::StatFs
                | Op::GetXattr { .. }
                | Op::ListXattr { .. }
                | Op::SetLock { .. }
                | Op::GetLock { .. }
                | Op::At { .. }
                | Op::Acquire { .. }
                | Op::Reassert { .. }
                | Op::Open { .. }
                | Op::Release { .. }
        )
    }

    /// True for operations whose successful reply names an inode they created (its creator
    /// holds it exclusively).
    pub fn creates(&self) -> bool {
        matches!(self, Op::Create { .. } | Op::Symlink { .. } | Op::CreateAt { .. } | Op::SymlinkAt { .. })
    }

    /// The inodes the operation names by number (a directory it changes the entries of
    /// included; not what a name in it stands for: see `named_entries`).
    pub fn named_inodes(&self) -> Vec<u64> {
        match self {
            Op::StatFs | Op::At { .. } | Op::AllocInodes { .. } | Op::Uploads { .. } => Vec::new(),
            Op::Lookup { parent, .. }
            | Op::Create { parent, .. }
            | Op::Symlink { parent, .. }
            | Op::Unlink { parent, .. }
            | Op::Rmdir { parent, .. } => vec![*parent],
            Op::Rename { parent, new_parent, .. } => vec![*parent, *new_parent],
            Op::Link { ino, parent, .. } | Op::CreateAt { ino, parent, .. } | Op::SymlinkAt { ino, parent, .. } => {
                vec![*ino, *parent]
            }
            Op::GetAttr { ino }
            | Op::SetAttr { ino, .. }
            | Op::ReadDir { ino, .. }
            | Op::ReadLink { ino }
            | Op::Open { ino, .. }
            | Op::Release { ino, .. }
            | Op::Read { ino, .. }
            | Op::Write { ino, .. }
            | Op::WriteBack { ino, .. }
            | Op::MapObject { ino, .. }
            | Op::Append { ino, .. }
            | Op::Fallocate { ino, .. }
            | Op::Fsync { ino }
            | Op::SetXattr { ino, .. }
            | Op::GetXattr { ino, .. }
            | Op::ListXattr { ino }
            | Op::RemoveXattr { ino, .. }
            | Op::SetLock { ino, .. }
            | Op::Acquire { ino }
            | Op::Reassert { ino, .. }
            | Op::GetLock { ino, .. } => vec![*ino],
        }
    }

    /// The directory entries the operation names: (directory, name).
    pub fn named_entries(&self) -> Vec<(u64, &[u8])> {
        match self {
            Op::Lookup { parent, name }
            | Op::Create { parent, name, .. }
            | Op::Symlink { parent, name, .. }
            | Op::Link { parent, name, .. }
            | Op::Unlink { parent, name }
            | Op::Rmdir { parent, name }
            | Op::CreateAt { parent, name, .. }
            | Op::SymlinkAt { parent, name, .. } => vec![(*parent, name.as_slice())],
            Op::Rename { parent, name, new_parent, new_name, .. } => {
                vec![(*parent, name.as_slice()), (*new_parent, new_name.as_slice())]
            }
            _ => Vec::new(),
        }
    }
}

/// The successful result of one operation.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[allow(missing_docs)]
pub enum Reply {
    /// Attributes (getattr, setattr, write, link, fallocate).
    Attr(Attr),
    /// The inode a new name names (create, symlink, link).
    Entry(Attr),
    /// A lookup's answer (`attr` is `None` when the name does not exist) with the other
    /// entries of the same directory leaf, to prime the client's cache.
    Lookup {
        attr: Option<Attr>,
        leaf: DirLeaf,
    },
    /// A page of a directory listing; `end` when nothing follows. `next_index` is the
    /// directory's next entry index when the page was read: an entry created or renamed
    /// into the directory later gets an index at or above it, so a listing that stops
    /// there ends even while another client keeps renaming (each rename makes a new
    /// index), and never names an entry twice.
    Dir {
        items: Vec<DirItem>,
        end: bool,
        next_index: u64,
    },
    /// File bytes or an xattr value (with their CRC-32C on the wire: `checked`).
    Data(#[serde(with = "crate::checked")] Vec<u8>),
    /// Xattr names.
    Names(Vec<Vec<u8>>),
    StatFs(StatFs),
    Done,
    /// Inode numbers `first .. first + count` are this session's to use.
    Inodes {
        first: u64,
        count: u32,
    },
    /// The answer to `GetLock`: the conflicting lock, or `None`.
    Lock(Option<LockInfo>),
    /// Attributes as they are now, which the client may not cache (it holds no right to
    /// them: a change elsewhere recalls nothing from it). The answer to a getattr of a
    /// directory other sessions are changing, for sessions of `PROTOCOL_ATTR_ONLY` and
    /// later (docs/protocol.md §4.1 "Shared directories").
    AttrOnly(Attr),
    /// The answer to `Op::Uploads` (protocol 16).
    Uploads(Vec<Upload>),
    /// The answer to a read of a file with data in objects (protocol 16).
    Located(Located),
}

/// Why one operation failed: a POSIX errno and a message for the log.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct OpError {
    /// errno (ENOENT = 2, …).
    pub errno: i32,
    /// Human-readable detail (which inode, which block).
    pub message: String,
}

/// A session token: lets a reconnecting client resume its session (reply cache, open files).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct SessionToken {
    /// Session number.
    pub id: u64,
    /// Random secret so sessions cannot be guessed.
    pub secret: u64,
}

/// First message of a client.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Hello {
    /// `HELLO_MAGIC`.
    pub magic: [u8; 4],
    /// The client's `PROTOCOL_VERSION`.
    pub version: u32,
    /// Host name or other label for logs.
    pub client_name: String,
    /// A session to resume after a reconnect.
    pub resume: Option<SessionToken>,
    /// The dataset to mount, by name; empty: the default one. A session stays in its
    /// dataset: it sees its root as inode 1, and any other inode number it names is
    /// taken as a number in that dataset (docs/protocol.md §2).
    pub dataset: String,
}

/// Server's answer to a good hello. Its layout follows its own first field: a welcome of
/// version 13 ends at `identity`, later ones add the fields marked with the version that
/// added them (`crate::welcome` encodes and decodes it).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Welcome {
    /// The version the server speaks on this connection (`agree_version`).
    pub version: u32,
    /// The session (new, or the resumed one).
    pub session: SessionToken,
    /// True when `Hello::resume` was honoured.
    pub resumed: bool,
    /// Set when the session was resumed from its durable record after a server restart:
    /// the reply cache is gone, and of the session's requests exactly those with
    /// `Response::seq` up to this value survived. The client replays the later ones it
    /// holds, in `seq` order, before anything else.
    pub durable_seq: Option<u64>,
    /// With `durable_seq`: places at or below it whose changes had not run when the last
    /// commit was made (they waited behind another session's exclusive rights while later
    /// ones ran): lost, like those above it.
    pub durable_holes: Vec<u64>,
    /// File system id.
    pub fsid: [u8; 16],
    /// The session the client asked to resume was fenced (it went silent past its lease:
    /// its rights, locks and open files were taken back and its later requests refused).
    /// This is a new session; the client must not replay what it held for the old one
    /// and reports it lost (docs/protocol.md §4.4).
    pub fenced: bool,
    /// The dataset keeps no access times (its `atime` property is off when the session
    /// starts): the client moves none, as under `noatime`.
    pub noatime: bool,
    /// Whom the server takes this session's callers for (its export policy's squashing
    /// and id maps): a mount answers a change itself only for a caller the server takes
    /// for who it is, as the kernel judged that caller's permissions with its own ids.
    pub identity: crate::IdentityMap,
    /// (Version 14.) The server's release and the commit it was built from, for the
    /// client's logs and status ("crest 0.2.0 (1a2b3c4d5e6f)"); empty from an older server.
    pub server_release: String,
}

/// A compound request.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Request {
    /// Unique per session; a retry after reconnect reuses it so it applies once.
    pub id: u64,
    /// Operations, applied in order.
    pub ops: Vec<Op>,
    /// The client's clock when it answered these operations itself (writeback): the
    /// server applies them at this time so that the attributes it stores are the ones the
    /// client already reported. `None`: the server's clock.
    pub time: Option<Time>,
    /// On whose behalf: the server checks each operation's permissions for this caller,
    /// as its export policy maps it (docs/security.md).
    pub caller: Caller,
}

/// The credentials a request runs with: the calling process's on the client, as its
/// kernel gave them.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Caller {
    /// File-system uid.
    pub uid: u32,
    /// File-system gid.
    pub gid: u32,
    /// Supplementary groups (at most `MAX_CALLER_GROUPS`; more are refused).
    pub groups: Vec<u32>,
}

/// Supplementary groups a caller may name.
pub const MAX_CALLER_GROUPS: usize = 256;

impl Caller {
    /// Root, as the server's own work and a trusted tool run.
    pub const ROOT: Caller = Caller { uid: 0, gid: 0, groups: Vec::new() };

    /// Whether the caller is in group `gid` (primary or supplementary).
    pub fn in_group(&self, gid: u32) -> bool {
        self.gid == gid || self.groups.contains(&gid)
    }
}

/// The answer to a request: one result per operation, in order.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Response {
    /// The request's id.
    pub id: u64,
    /// Results.
    pub results: Vec<Result<Reply, OpError>>,
    /// For a request that changed something: its place in the order the server applied
    /// this session's changes (1, 2, …); 0 for a read-only request.
    pub seq: u64,
    /// Every change of this session with `seq` up to this value is durable: the client
    /// may forget them (it keeps later ones to replay if the server restarts).
    pub durable: u64,
    /// For a change: the time it ran at (`Request::time` when it carried one). Its replay
    /// after a server restart carries it as `Request::time`, so that it comes out with
    /// the times it first had.
    pub time: Option<Time>,
}

/// Unsolicited server messages.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Notify {
    /// The server is shutting down; reconnect later.
    ShuttingDown,
    /// This session was fenced (its lease lapsed): the request just sent, and every later
    /// one of it, is refused. The client starts a new session without replaying.
    Fenced,
    /// Another session changed these inodes (attributes, data, or a directory's entries):
    /// drop what is cached of them, then answer `ClientMessage::RecallDone` with this id.
    /// The change's own reply waits for that answer (docs/protocol.md §4.2).
    Recall {
        /// Names this recall in the answer.
        recall_id: u64,
        /// The changed inodes.
        inodes: Vec<u64>,
    },
    /// The first part of a recall naming more inodes than one notice carries
    /// (`MAX_RECALL_INODES`): drop what is cached of these too, but answer only the
    /// `Recall` with the same id that follows, after every part.
    RecallPart {
        /// The recall this is part of.
        recall_id: u64,
        /// Some of the changed inodes.
        inodes: Vec<u64>,
    },
}

/// Most inodes one recall notice names (~1 MiB on the wire): a longer recall goes as
/// `RecallPart`s and a final `Recall`.
pub const MAX_RECALL_INODES: usize = 100_000;

/// Everything a client sends.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum ClientMessage {
    /// Handshake (must be first).
    Hello(Hello),
    /// Work.
    Request(Request),
    /// Clean end of the session.
    Goodbye,
    /// After a server restart: every request this client replays has been sent (they
    /// precede this on the connection). The server holds other requests until every
    /// restored session has said so, or its grace period ends (docs/protocol.md §4.5).
    Replayed,
    /// Everything the recall named is dropped from this client's caches.
    RecallDone {
        /// `Notify::Recall::recall_id`.
        recall_id: u64,
    },
    /// Instead of a hello, on a TLS connection without a client certificate: redeem a
    /// join token for one (docs/security.md). Answered `Joined` or `Refused`; then the
    /// connection closes.
    Join(Join),
    /// Instead of a hello: one administrative call (`crest dataset …`), from a host whose
    /// export policy allows it. Answered `Administered` or `Refused`; then the connection
    /// closes.
    Admin(Admin),
    /// Instead of a hello, on a TLS connection with a client certificate the server admits:
    /// a certificate for a new key, under the name of the one presented, once a third of
    /// its life is left (docs/security.md). Answered `Joined` or `Refused`; then the
    /// connection closes. (A server older than this message ends the connection.)
    Renew(Renew),
}

/// A joined client's request for its next certificate.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Renew {
    /// `HELLO_MAGIC`.
    pub magic: [u8; 4],
    /// The client's `PROTOCOL_VERSION`.
    pub version: u32,
    /// A PKCS#10 certificate request (DER) for the new key the client keeps; of it the
    /// server uses only the key.
    pub csr: Vec<u8>,
}

/// An administrative call: a name-value list (`crest_nvlist`) naming the command (`cmd`)
/// and its arguments; docs/protocol.md §5 lists them.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Admin {
    /// `HELLO_MAGIC`.
    pub magic: [u8; 4],
    /// The client's `PROTOCOL_VERSION`.
    pub version: u32,
    /// The encoded name-value list.
    #[serde(with = "crate::checked::plain")]
    pub call: Vec<u8>,
}

/// A joining client's request for a certificate.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Join {
    /// `HELLO_MAGIC`.
    pub magic: [u8; 4],
    /// The client's `PROTOCOL_VERSION`.
    pub version: u32,
    /// The token `crest token create` printed.
    pub token: String,
    /// The name the client asks for (its host name); at most `MAX_CLIENT_NAME_BYTES` bytes.
    pub name: String,
    /// A PKCS#10 certificate request (DER) for the key the client keeps.
    pub csr: Vec<u8>,
}

/// What a joined client gets.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Joined {
    /// Its certificate (DER).
    pub cert: Vec<u8>,
    /// The server's CA (DER), whose fingerprint the token named.
    pub ca: Vec<u8>,
    /// The name in the certificate.
    pub name: String,
}

/// Everything a server sends.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum ServerMessage {
    /// Handshake accepted.
    Welcome(Welcome),
    /// Handshake refused (wrong version, not a crest client…); the connection closes.
    Refused {
        /// Why.
        reason: String,
        /// Server's version.
        version: u32,
    },
    /// Results.
    Response(Response),
    /// Unsolicited.
    Notify(Notify),
    /// A join token redeemed, or a certificate renewed.
    Joined(Joined),
    /// The answer to an `Admin` call: an encoded name-value list (`error` and `errno` when
    /// it failed; per-item results for calls on many names).
    Administered(#[serde(with = "crate::checked::plain")] Vec<u8>),
}

/// Checks a hello: the protocol version the server speaks to it, or why it is refused.
pub fn check_hello(h: &Hello) -> Result<u32, String> {
    if h.magic != HELLO_MAGIC {
        return Err(format!("not a crest client (magic {:02x?})", h.magic));
    }
    let version = agree_version(h.version)?;
    if h.client_name.len() > MAX_CLIENT_NAME_BYTES {
        return Err(format!("client name of {} bytes (at most {MAX_CLIENT_NAME_BYTES})", h.client_name.len()));
    }
    if h.dataset.len() > MAX_DATASET_NAME_BYTES {
        return Err(format!("dataset name of {} bytes (at most {MAX_DATASET_NAME_BYTES})", h.dataset.len()));
    }
    Ok(version)
}

/// Checks an administrative call's envelope (the call itself is the server's to judge).
pub fn check_admin(a: &Admin) -> Result<(), String> {
    if a.magic != HELLO_MAGIC {
        return Err(format!("not a crest client (magic {:02x?})", a.magic));
    }
    agree_version(a.version)?;
    Ok(())
}

/// Largest certificate request a join or renewal may carry (one for a P-256 key is ~250
/// bytes).
pub const MAX_CSR_BYTES: usize = 16 * 1024;

/// Checks a join request's shape (the token itself is the server's to judge).
pub fn check_join(j: &Join) -> Result<(), String> {
    if j.magic != HELLO_MAGIC {
        return Err(format!("not a crest client (magic {:02x?})", j.magic));
    }
    agree_version(j.version)?;
    if j.name.len() > MAX_CLIENT_NAME_BYTES || j.token.len() > 256 || j.csr.len() > MAX_CSR_BYTES {
        return Err("join request too large".into());
    }
    Ok(())
}

/// Checks a renewal request's shape (whether the certificate may be renewed is the
/// server's to judge).
pub fn check_renew(r: &Renew) -> Result<(), String> {
    if r.magic != HELLO_MAGIC {
        return Err(format!("not a crest client (magic {:02x?})", r.magic));
    }
    agree_version(r.version)?;
    if r.csr.len() > MAX_CSR_BYTES {
        return Err("renewal request too large".into());
    }
    Ok(())
}

/// `name` cut to `MAX_CLIENT_NAME_BYTES` at a character's edge: what a client says in its
/// hello.
pub fn clip_client_name(name: &str) -> String {
    let mut end = name.len().min(MAX_CLIENT_NAME_BYTES);
    while !name.is_char_boundary(end) {
        end -= 1;
    }
    name[..end].to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renewal_requests_are_bounded() {
        let renew = |csr: usize| Renew { magic: HELLO_MAGIC, version: PROTOCOL_VERSION, csr: vec![0; csr] };
        assert!(check_renew(&renew(MAX_CSR_BYTES)).is_ok());
        assert!(check_renew(&renew(MAX_CSR_BYTES + 1)).is_err_and(|e| e.contains("too large")));
        assert!(check_renew(&Renew { magic: *b"HTTP", ..renew(10) }).is_err());
        assert!(check_renew(&Renew { version: OLDEST_PROTOCOL_VERSION - 1, ..renew(10) }).is_err());
    }

    #[test]
    fn fallocate_steps_cover_the_range_once_in_order_each_within_a_step() {
        let seed =
            std::env::var("CREST_PROTO_SEED").ok().and_then(|s| s.parse().ok()).unwrap_or_else(crest_rng::next_u64);
        eprintln!("CREST_PROTO_SEED={seed}");
        let mut rng = crest_rng::Stream::from_seed_u64(seed);
        let mut next = |m: u64| rng.below(m);
        let edges = [0, 1, 4095, 4096, MAX_FALLOCATE_STEP - 1, MAX_FALLOCATE_STEP, MAX_FALLOCATE_STEP + 1];
        for round in 0..2000 {
            let offset = if round % 2 == 0 { next(1 << 40) } else { edges[next(edges.len() as u64) as usize] };
            let len = match round % 3 {
                0 => edges[next(edges.len() as u64) as usize] * (1 + next(5)),
                _ => next(20 * MAX_FALLOCATE_STEP),
            };
            for flags in [0, FALLOC_FL_KEEP_SIZE, FALLOC_FL_ZERO_RANGE, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE] {
                let steps: Vec<(u64, u64)> = fallocate_steps(offset, len, flags).collect();
                let what = format!("offset {offset} len {len} flags {flags:#x}: {steps:?}");
                if len == 0 || flags & FALLOC_FL_PUNCH_HOLE != 0 {
                    assert_eq!(steps, vec![(offset, len)], "{what}");
                    continue;
                }
                let mut at = offset;
                for &(o, n) in &steps {
                    assert!(o == at && n > 0 && n <= MAX_FALLOCATE_STEP, "{what}");
                    at += n;
                }
                assert_eq!(at, offset + len, "{what}");
                assert_eq!(steps.len() as u64, len.div_ceil(MAX_FALLOCATE_STEP), "{what}");
            }
        }
    }
}
