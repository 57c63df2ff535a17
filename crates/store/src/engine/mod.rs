//! The storage engine: checksummed copy-on-write B-trees of `(key, bytes)` items in the
//! 4 KiB blocks of one image. Nodes ([`node`]) and their keys ([`key`]), the trees
//! ([`btree`]), the pager that caches verified nodes, copies them on write and writes a
//! transaction's dirty nodes at commit ([`pager`]), the free-space bitmaps and allocator
//! ([`bitmap`], [`alloc`]), the superblock ([`superblock`]) and checksums ([`checksum`]).
//!
//! The rule: the engine does not know what the items mean. It never names the schema
//! (`crate::fs`, `crate::sessions`) nor the layers that join or check it (`crate::store`,
//! `crate::check`), and it reaches storage only through the `Disk` trait, never a
//! concrete back-end. Outside this folder it uses only `crate::error`, `crate::limits`
//! and `crate::disk::Disk`. `tests/layers.rs` enforces this.

pub mod alloc;
pub mod bitmap;
pub mod btree;
pub mod checksum;
pub mod key;
pub mod node;
pub mod pager;
pub mod pins;
pub mod superblock;
