//! crest's storage engine: the last step of the data path (FUSE → client → wire →
//! server → **store** → disk). It keeps a file system in an image of checksummed
//! copy-on-write B-trees, reaching storage only through the [`Disk`] trait, and knows
//! nothing of networks or FUSE. The server calls [`Store`]'s POSIX-shaped operations;
//! `crest mkfs` and `crest fsck` call [`Store::mkfs`] and [`check::fsck`].
//!
//! Three layers, each in its own folder:
//! - `engine/`: the storage engine (nodes, keys, B-trees, the pager and its transactions,
//!   allocator and bitmaps, superblock, checksums). It knows no schema.
//! - `fs/`: the file-system schema on the engine (inodes, directory entries, extents,
//!   xattrs, space, the POSIX operations; the registry of item kinds).
//! - `disk/`: the back-ends behind the [`Disk`] trait (file, thread pool, io_uring,
//!   memory, the crash-test wrappers). The engine and the schema see only the trait.
//!
//! On top, `store.rs` joins them into [`Store`] (mkfs, open, commit), `sessions.rs` adds
//! units and session records, and `check.rs` is fsck of both layers; `error.rs` and
//! `limits.rs` serve all. `tests/layers.rs` keeps the layers apart. The engine's modules
//! are public at their old paths (`crest_store::btree`, `crest_store::key`…).
//!
//! Start reading at `store.rs` (open, commit), then `engine/btree.rs` and `engine/pager.rs`
//! (copy-on-write), then `fs/ops.rs` (the namespace) and `fs/extent.rs` (file data).
//! docs/format.md has the on-disk format byte by byte.

mod engine;

pub mod check;
pub mod datasets;
pub mod disk;
pub mod error;
pub mod fs;
pub mod limits;
pub mod memory;
pub mod receive;
pub mod scrub;
pub mod send;
pub mod sessions;
pub mod snapshots;
pub mod store;

pub use disk::crash;
pub use engine::{alloc, bitmap, btree, checksum, node, pager, superblock};

/// Item keys: the engine's [`Key`](key::Key), and the schema's item kinds, orphan
/// objectid and name hash that give its fields their meaning.
pub mod key {
    pub use crate::engine::key::{Key, KEY_BYTES};
    pub use crate::fs::keys::{kind, name_hash, ORPHAN_OBJECTID};
}

pub use disk::{Disk, DiskIo, FileDisk, MemDisk, PoolDisk, SharedReader, UringDisk};
pub use error::{Error, Result};
pub use fs::dirent::DirEntry;
pub use fs::inode::{FileKind, Inode, Timespec, ROOT_INO};
pub use fs::ops::{FallocateMode, LeafLookup, NewInode, Op, OpResult, RenameFlags, SetAttr, StatFs, Unlinked};
pub use fs::read::{Located, Part, Planned, ReadPlan};
pub use store::{CommitPolicy, MkfsOptions, Stats, Store};
