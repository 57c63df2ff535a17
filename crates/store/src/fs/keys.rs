//! What keys mean: the registry of item kinds of every tree (fs trees, the root tree, the
//! refcount tree), kept in one list so that their numbers, which are part of the on-disk
//! format, never collide; the objectid of the orphan list; and the name hash that places
//! directory entries and xattrs. The engine orders `(objectid, kind, offset)` keys without
//! knowing any of this. Public as `crest_store::key`, beside the engine's `Key`.

/// Item kinds. The numbers are part of the on-disk format.
pub mod kind {
    /// fs tree: an inode's attributes; offset 0.
    pub const INODE: u8 = 1;
    /// fs tree: directory entries whose name hashes to `offset`.
    pub const DIR_ENTRY: u8 = 2;
    /// fs tree: one directory entry at creation index `offset` (stable readdir order).
    pub const DIR_INDEX: u8 = 3;
    /// fs tree: extended attributes whose name hashes to `offset`.
    pub const XATTR: u8 = 4;
    /// fs tree: file data at byte `offset` (inline bytes or an extent with checksums).
    pub const EXTENT: u8 = 5;
    /// fs tree: inode `offset` is unlinked but was still open (objectid = ORPHAN_OBJECTID).
    pub const ORPHAN: u8 = 6;
    /// fs tree: part of an xattr value too large for its XATTR item: offset =
    /// chunk id << 8 | chunk index (`fs/xattr.rs`).
    pub const XATTR_CHUNK: u8 = 7;
    /// root tree: the root pointer and counters of dataset `objectid`.
    pub const ROOT_ITEM: u8 = 10;
    /// root tree: the server's record of client session `objectid` (opaque bytes the
    /// server layer owns; see `Store::put_session_record`); offset 0.
    pub const SESSION: u8 = 11;
    /// root tree: the name and properties of dataset `objectid` (a name-value list,
    /// `datasets.rs`); offset 0.
    pub const DATASET: u8 = 12;
    /// root tree, key (0, 13, 0): the id the next dataset created gets (u64).
    pub const NEXT_DATASET: u8 = 13;
    /// root tree: part `offset` of the deadlist of dataset or snapshot `objectid`: blocks
    /// it stopped using that an older snapshot still reaches (`snapshots.rs`).
    pub const DEADLIST: u8 = 14;
    /// root tree, key (0, 15, 0): where the scrub is and what it found (`scrub.rs`).
    pub const SCRUB: u8 = 15;
    /// root tree: a receive into dataset `objectid` is under way (`receive.rs`); offset 0.
    /// The value says how to undo it: kind (u8: 0 destroy the dataset, 1 roll it back)
    /// and the snapshot to roll back to (u64).
    pub const RECEIVE: u8 = 16;
    /// root tree: how many data blocks the files of live dataset `objectid` (its tree id)
    /// map, and the root of its tree when that was counted (u64 block, u64 generation,
    /// u64 blocks); offset 0. Opening trusts it only while the dataset's ROOT_ITEM still
    /// names that root (a commit by a crest that predates it leaves it stale), and then
    /// need not read the tree's leaves.
    pub const USAGE: u8 = 17;
    /// refcount tree: blocks `[objectid, objectid+offset)` have the stored reference count.
    pub const EXTENT_REF: u8 = 20;
    /// root tree, key (u64::MAX - 1, 21, 0): where file data lives (`fs/objects.rs`): the
    /// store id (u64) and the data URL.
    pub const OBJECT_CONFIG: u8 = 21;
    /// root tree, key (u64::MAX - 1, 22, 0): the next object id (u64).
    pub const OBJECT_NEXT: u8 = 22;
    /// root tree: object `offset` is granted to the session the value names (u64) and
    /// not yet mapped.
    pub const OBJECT_GRANT: u8 = 23;
    /// root tree: object `offset` is referenced no more and is to be deleted (empty value).
    pub const OBJECT_GONE: u8 = 24;
}

/// Objectid under which orphan items are kept (sorts after every inode).
pub const ORPHAN_OBJECTID: u64 = u64::MAX;

/// FNV-1a 64 of a name: the `offset` of DIR_ENTRY and XATTR items. Part of the format.
pub fn name_hash(name: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for &b in name {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    h
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hash_is_fnv1a() {
        assert_eq!(name_hash(b""), 0xcbf2_9ce4_8422_2325);
        assert_eq!(name_hash(b"a"), 0xaf63_dc4c_8601_ec8c);
    }
}
