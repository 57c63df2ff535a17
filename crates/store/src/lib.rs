//! crest's storage engine: the last step of the data path (FUSE → client → wire →
//! server → **store** → disk). It keeps a file system in an image of checksummed
//! copy-on-write B-trees, reaching storage only through the [`Disk`] trait, and knows
//! nothing of networks or FUSE. The server calls [`Store`]'s POSIX-shaped operations;
//! `crest mkfs` and `crest fsck` call [`Store::mkfs`] and [`check::fsck`].
//!
//! Start reading at `store.rs` (open, commit), then `btree.rs` and `pager.rs` (copy-on-write),
//! then `fs/ops.rs` (the namespace) and `fs/extent.rs` (file data). docs/format.md has the
//! on-disk format byte by byte.

pub mod alloc;
pub mod bitmap;
pub mod btree;
pub mod check;
pub mod checksum;
pub mod crash;
pub mod disk;
pub mod error;
pub mod fs;
pub mod key;
pub mod limits;
pub mod node;
pub mod pager;
pub mod sessions;
pub mod store;
pub mod superblock;

pub use disk::{Disk, DiskIo, FileDisk, MemDisk, PoolDisk, UringDisk};
pub use error::{Error, Result};
pub use fs::dirent::DirEntry;
pub use fs::inode::{FileKind, Inode, Timespec, ROOT_INO};
pub use fs::ops::{FallocateMode, LeafLookup, NewInode, Op, OpResult, RenameFlags, SetAttr, StatFs, Unlinked};
pub use store::{CommitPolicy, MkfsOptions, Stats, Store};
