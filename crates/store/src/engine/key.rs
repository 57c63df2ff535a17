//! Item keys: `(objectid, kind, offset)`, ordered field by field as in btrfs, so that all
//! items of one inode sit together and a directory's entries cluster in few leaves.
//! The engine only orders and encodes keys; the `kind` registry is the schema's (`fs/keys.rs`).

use std::fmt;

/// Encoded size of a key in a node.
pub const KEY_BYTES: usize = 17;

/// The key of one item in a tree.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct Key {
    /// Inode number (fs trees), tree id (root tree), first block (refcount tree).
    pub objectid: u64,
    /// What the item is (one of the `kind` constants).
    pub kind: u8,
    /// Meaning depends on `kind`: name hash, file offset, directory index, length…
    pub offset: u64,
}

impl Key {
    /// A key from its three parts.
    pub const fn new(objectid: u64, kind: u8, offset: u64) -> Key {
        Key { objectid, kind, offset }
    }

    /// Smallest key.
    pub const MIN: Key = Key::new(0, 0, 0);
    /// Largest key.
    pub const MAX: Key = Key::new(u64::MAX, u8::MAX, u64::MAX);

    /// Writes the key's 17 little-endian bytes.
    pub fn encode(&self, out: &mut [u8]) {
        out[0..8].copy_from_slice(&self.objectid.to_le_bytes());
        out[8] = self.kind;
        out[9..17].copy_from_slice(&self.offset.to_le_bytes());
    }

    /// Reads a key from 17 bytes (the caller has checked the length).
    pub fn decode(b: &[u8]) -> Key {
        let mut o = [0u8; 8];
        o.copy_from_slice(&b[0..8]);
        let mut f = [0u8; 8];
        f.copy_from_slice(&b[9..17]);
        Key::new(u64::from_le_bytes(o), b[8], u64::from_le_bytes(f))
    }
}

impl fmt::Debug for Key {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "({} {} {})", self.objectid, self.kind, self.offset)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn order_is_objectid_kind_offset() {
        assert!(Key::new(1, 9, 9) < Key::new(2, 0, 0));
        assert!(Key::new(1, 1, 9) < Key::new(1, 2, 0));
        assert!(Key::new(1, 1, 1) < Key::new(1, 1, 2));
    }

    #[test]
    fn roundtrip() {
        let k = Key::new(0x0102_0304_0506_0708, 7, u64::MAX - 3);
        let mut b = [0u8; KEY_BYTES];
        k.encode(&mut b);
        assert_eq!(Key::decode(&b), k);
        assert_eq!(b[0], 0x08, "little-endian");
    }
}
