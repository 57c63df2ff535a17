//! The file-system schema on top of the engine: how inodes, directory entries, file data
//! and xattrs are laid out as items in a dataset's fs tree, the registry of item kinds of
//! every tree (`keys`), the space an operation may take and how deleted files are
//! freed (`space`), and the POSIX operations on them (`ops`), as methods of `Store`.
//!
//! The rule: the schema builds on the engine (`crate::engine`: trees, keys, the pager)
//! and on `Store`, and never names a concrete disk back-end (`MemDisk`, `FileDisk`…): at
//! most the `Disk` trait. The engine never refers back to anything here.
//! `tests/layers.rs` enforces both.

pub mod dirent;
pub mod extent;
pub mod inode;
pub(crate) mod keys;
pub mod objects;
pub mod ops;
pub mod read;
pub(crate) mod space;
pub mod xattr;
