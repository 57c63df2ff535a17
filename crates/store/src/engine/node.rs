//! Tree nodes: one block each, checksummed, self-describing. This module only turns
//! nodes into bytes and back and verifies them; `btree` decides what goes in them.
//!
//! Invariants, checked by `Node::decode` on every read and asserted by `encode`:
//! - the checksum covers the whole block after the checksum field;
//! - the header names this file system, the block the node was written to, the generation
//!   and owner tree the parent pointer expects, and the level the parent expects;
//! - keys strictly increase; leaf item data is packed back to front without gaps or
//!   overlap; an internal node has at least one child;
//! - a leaf's encoded size never exceeds `BLOCK_SIZE` (callers split before that).

use std::sync::Arc;

use crate::engine::checksum::crc32c;
use crate::engine::key::{Key, KEY_BYTES};
use crate::error::{Error, Result};
use crate::limits::{BLOCK_SIZE, MAX_TREE_LEVEL};

/// Header bytes at the start of every node.
pub const HEADER_BYTES: usize = 80;
/// Bytes per leaf item header: key, data offset (u16), data length (u16).
pub const LEAF_ITEM_BYTES: usize = KEY_BYTES + 4;
/// Bytes per internal entry: key, child block (u64), child generation (u64), block of the
/// child's second copy (u64, 0 when it has one copy).
pub const INTERNAL_ENTRY_BYTES: usize = KEY_BYTES + 24;
/// Most children an internal node holds.
pub const INTERNAL_CAPACITY: usize = (BLOCK_SIZE - HEADER_BYTES) / INTERNAL_ENTRY_BYTES;
/// Bytes available for leaf items (headers + data).
pub const LEAF_SPACE: usize = BLOCK_SIZE - HEADER_BYTES;

/// Where a node lives on disk and what its parent expects of it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct BlockPtr {
    /// Block number.
    pub block: u64,
    /// Block of the node's second copy (byte for byte the same block, header included), or
    /// 0 when it has one copy (block 0 is reserved, never a node).
    pub twin: u64,
    /// Generation the node was written in.
    pub generation: u64,
    /// Level: 0 for a leaf.
    pub level: u8,
}

/// Contents of a node.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Body {
    /// Sorted items.
    Leaf(Vec<(Key, Vec<u8>)>),
    /// Sorted children; entry `i` covers keys `[key_i, key_{i+1})`.
    Internal(Vec<(Key, ChildPtr)>),
}

/// A child pointer: either on disk, or a node modified in the running transaction.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ChildPtr {
    /// A committed node.
    Disk {
        /// Block number.
        block: u64,
        /// Block of its second copy, 0 if none.
        twin: u64,
        /// Generation expected in its header.
        generation: u64,
    },
    /// Index into the transaction's arena of dirty nodes.
    Dirty(u32),
}

impl BlockPtr {
    /// The same node as a parent's child pointer.
    pub fn child(&self) -> ChildPtr {
        ChildPtr::Disk { block: self.block, twin: self.twin, generation: self.generation }
    }

    /// The blocks holding the node: its block, and its twin if it has one.
    pub fn copies(&self) -> impl Iterator<Item = u64> {
        [self.block, self.twin].into_iter().filter(|&b| b != 0)
    }
}

impl ChildPtr {
    /// The committed node this names, at `level`; `None` for a dirty one.
    pub fn on_disk(&self, level: u8) -> Option<BlockPtr> {
        match *self {
            ChildPtr::Disk { block, twin, generation } => Some(BlockPtr { block, twin, generation, level }),
            ChildPtr::Dirty(_) => None,
        }
    }
}

/// A decoded node.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Node {
    /// Tree that owns the node.
    pub owner: u64,
    /// 0 for leaves.
    pub level: u8,
    /// Items or children.
    pub body: Body,
}

/// Shared handle to an immutable node.
pub type NodeRef = Arc<Node>;

impl Node {
    /// An empty leaf.
    pub fn empty_leaf(owner: u64) -> Node {
        Node { owner, level: 0, body: Body::Leaf(Vec::new()) }
    }

    /// Number of items or children.
    pub fn len(&self) -> usize {
        match &self.body {
            Body::Leaf(items) => items.len(),
            Body::Internal(children) => children.len(),
        }
    }

    /// True when the node holds nothing.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// First key, if any.
    pub fn first_key(&self) -> Option<Key> {
        match &self.body {
            Body::Leaf(items) => items.first().map(|(k, _)| *k),
            Body::Internal(children) => children.first().map(|(k, _)| *k),
        }
    }

    /// Bytes the node's payload occupies when encoded (excluding the header).
    pub fn used_bytes(&self) -> usize {
        match &self.body {
            Body::Leaf(items) => items.iter().map(|(_, v)| LEAF_ITEM_BYTES + v.len()).sum(),
            Body::Internal(children) => children.len() * INTERNAL_ENTRY_BYTES,
        }
    }

    /// True when the node fits in one block.
    pub fn fits(&self) -> bool {
        match &self.body {
            Body::Leaf(_) => self.used_bytes() <= LEAF_SPACE,
            Body::Internal(c) => c.len() <= INTERNAL_CAPACITY,
        }
    }

    /// Encodes the node for `block` in `generation`. Every child pointer must be on disk.
    pub fn encode(&self, fsid: &[u8; 16], block: u64, generation: u64) -> Vec<u8> {
        assert!(self.fits(), "node for block {block} overflows");
        let mut b = vec![0u8; BLOCK_SIZE];
        b[32..48].copy_from_slice(fsid);
        b[48..56].copy_from_slice(&block.to_le_bytes());
        b[56..64].copy_from_slice(&generation.to_le_bytes());
        b[64..72].copy_from_slice(&self.owner.to_le_bytes());
        b[72] = self.level;
        b[74..76].copy_from_slice(&(self.len() as u16).to_le_bytes());
        match &self.body {
            Body::Leaf(items) => {
                let mut data_end = BLOCK_SIZE;
                for (i, (key, value)) in items.iter().enumerate() {
                    let at = HEADER_BYTES + i * LEAF_ITEM_BYTES;
                    key.encode(&mut b[at..at + KEY_BYTES]);
                    let start = data_end - value.len();
                    b[at + KEY_BYTES..at + KEY_BYTES + 2].copy_from_slice(&(start as u16).to_le_bytes());
                    b[at + KEY_BYTES + 2..at + KEY_BYTES + 4].copy_from_slice(&(value.len() as u16).to_le_bytes());
                    b[start..data_end].copy_from_slice(value);
                    data_end = start;
                }
            }
            Body::Internal(children) => {
                for (i, (key, ptr)) in children.iter().enumerate() {
                    let at = HEADER_BYTES + i * INTERNAL_ENTRY_BYTES;
                    key.encode(&mut b[at..at + KEY_BYTES]);
                    let ChildPtr::Disk { block: cb, twin: ct, generation: cg } = ptr else {
                        panic!("encoding node {block} with an unwritten child");
                    };
                    b[at + KEY_BYTES..at + KEY_BYTES + 8].copy_from_slice(&cb.to_le_bytes());
                    b[at + KEY_BYTES + 8..at + KEY_BYTES + 16].copy_from_slice(&cg.to_le_bytes());
                    b[at + KEY_BYTES + 16..at + KEY_BYTES + 24].copy_from_slice(&ct.to_le_bytes());
                }
            }
        }
        let csum = crc32c(&b[32..]);
        b[0..4].copy_from_slice(&csum.to_le_bytes());
        b
    }

    /// Decodes and verifies a node read from `expected.block`, checking everything the
    /// parent pointer promised. Never panics on any input.
    pub fn decode(b: &[u8], fsid: &[u8; 16], expected: &BlockPtr, owner: u64, total_blocks: u64) -> Result<Node> {
        let block = expected.block;
        let bad = |detail: String| Error::corrupt("node", block, detail);
        if b.len() != BLOCK_SIZE {
            return Err(bad(format!("{} bytes, expected {BLOCK_SIZE}", b.len())));
        }
        let stored = u32::from_le_bytes([b[0], b[1], b[2], b[3]]);
        let computed = crc32c(&b[32..]);
        if stored != computed {
            return Err(bad(format!("checksum mismatch: stored {stored:#010x}, computed {computed:#010x}")));
        }
        if b[4..32].iter().any(|&x| x != 0) || b[73] != 0 || b[76..80].iter().any(|&x| x != 0) {
            return Err(bad("non-zero reserved header bytes".into()));
        }
        if &b[32..48] != fsid {
            return Err(bad("belongs to another file system (fsid mismatch)".into()));
        }
        let get = |off: usize| {
            let mut a = [0u8; 8];
            a.copy_from_slice(&b[off..off + 8]);
            u64::from_le_bytes(a)
        };
        let own_block = get(48);
        if own_block != block {
            return Err(bad(format!("header says block {own_block}: misdirected write or read")));
        }
        let generation = get(56);
        if generation != expected.generation {
            return Err(bad(format!(
                "generation {generation}, parent expects {} (stale or lost write)",
                expected.generation
            )));
        }
        let node_owner = get(64);
        if node_owner != owner {
            return Err(bad(format!("owner tree {node_owner}, expected {owner}")));
        }
        let level = b[72];
        if level != expected.level || level > MAX_TREE_LEVEL {
            return Err(bad(format!("level {level}, parent expects {}", expected.level)));
        }
        let n = usize::from(u16::from_le_bytes([b[74], b[75]]));
        let body = if level == 0 {
            if HEADER_BYTES + n * LEAF_ITEM_BYTES > BLOCK_SIZE {
                return Err(bad(format!("{n} items cannot fit in a leaf")));
            }
            let mut items = Vec::with_capacity(n);
            let mut data_end = BLOCK_SIZE;
            let table_end = HEADER_BYTES + n * LEAF_ITEM_BYTES;
            for i in 0..n {
                let at = HEADER_BYTES + i * LEAF_ITEM_BYTES;
                let key = Key::decode(&b[at..at + KEY_BYTES]);
                let start = usize::from(u16::from_le_bytes([b[at + KEY_BYTES], b[at + KEY_BYTES + 1]]));
                let len = usize::from(u16::from_le_bytes([b[at + KEY_BYTES + 2], b[at + KEY_BYTES + 3]]));
                if start + len != data_end || start < table_end {
                    return Err(bad(format!(
                        "item {i} {key:?} data at {start}+{len} is not packed (expected to end at {data_end}, above {table_end})"
                    )));
                }
                if let Some((prev, _)) = items.last() {
                    if *prev >= key {
                        return Err(bad(format!("item {i} key {key:?} not above {prev:?}")));
                    }
                }
                items.push((key, b[start..data_end].to_vec()));
                data_end = start;
            }
            if b[table_end..data_end].iter().any(|&x| x != 0) {
                return Err(bad("free space inside the leaf is not zero".into()));
            }
            Body::Leaf(items)
        } else {
            if n == 0 || n > INTERNAL_CAPACITY {
                return Err(bad(format!("internal node with {n} children")));
            }
            let mut children: Vec<(Key, ChildPtr)> = Vec::with_capacity(n);
            for i in 0..n {
                let at = HEADER_BYTES + i * INTERNAL_ENTRY_BYTES;
                let key = Key::decode(&b[at..at + KEY_BYTES]);
                let cb = get(at + KEY_BYTES);
                let cg = get(at + KEY_BYTES + 8);
                let ct = get(at + KEY_BYTES + 16);
                if cb >= total_blocks {
                    return Err(bad(format!("child {i} points at block {cb}, past the end")));
                }
                if ct >= total_blocks {
                    return Err(bad(format!("child {i}'s second copy is at block {ct}, past the end")));
                }
                if ct != 0 && ct == cb {
                    return Err(bad(format!("child {i}'s second copy is the block itself ({cb})")));
                }
                if cg > generation {
                    return Err(bad(format!("child {i} generation {cg} is newer than the node's {generation}")));
                }
                if let Some((prev, _)) = children.last() {
                    if *prev >= key {
                        return Err(bad(format!("child {i} key {key:?} not above {prev:?}")));
                    }
                }
                children.push((key, ChildPtr::Disk { block: cb, twin: ct, generation: cg }));
            }
            let end = HEADER_BYTES + n * INTERNAL_ENTRY_BYTES;
            if b[end..].iter().any(|&x| x != 0) {
                return Err(bad("bytes after the last child are not zero".into()));
            }
            Body::Internal(children)
        };
        Ok(Node { owner, level, body })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const FSID: [u8; 16] = [9; 16];

    fn leaf() -> Node {
        Node {
            owner: 5,
            level: 0,
            body: Body::Leaf(vec![
                (Key::new(1, 1, 0), vec![1, 2, 3]),
                (Key::new(1, 2, 77), vec![]),
                (Key::new(2, 1, 0), vec![9; 100]),
            ]),
        }
    }

    fn ptr(level: u8) -> BlockPtr {
        BlockPtr { block: 500, twin: 0, generation: 7, level }
    }

    #[test]
    fn leaf_roundtrip_and_flips() {
        let n = leaf();
        let b = n.encode(&FSID, 500, 7);
        assert_eq!(Node::decode(&b, &FSID, &ptr(0), 5, 1000).ok(), Some(n));
        for i in (0..BLOCK_SIZE).step_by(7) {
            let mut c = b.clone();
            c[i] ^= 1;
            assert!(Node::decode(&c, &FSID, &ptr(0), 5, 1000).is_err(), "flip at {i}");
        }
    }

    #[test]
    fn header_expectations_are_checked() {
        let b = leaf().encode(&FSID, 500, 7);
        let msg = |r: Result<Node>| r.err().map(|e| e.to_string()).unwrap_or_default();
        assert!(msg(Node::decode(&b, &[1; 16], &ptr(0), 5, 1000)).contains("fsid"));
        let moved = BlockPtr { block: 501, ..ptr(0) };
        assert!(msg(Node::decode(&b, &FSID, &moved, 5, 1000)).contains("misdirected"));
        let stale = BlockPtr { generation: 8, ..ptr(0) };
        assert!(msg(Node::decode(&b, &FSID, &stale, 5, 1000)).contains("stale"));
        assert!(msg(Node::decode(&b, &FSID, &ptr(0), 6, 1000)).contains("owner"));
        assert!(msg(Node::decode(&b, &FSID, &ptr(1), 5, 1000)).contains("level"));
    }

    #[test]
    fn internal_roundtrip() {
        let n = Node {
            owner: 1,
            level: 1,
            body: Body::Internal(vec![
                (Key::MIN, ChildPtr::Disk { block: 10, twin: 0, generation: 3 }),
                (Key::new(5, 0, 0), ChildPtr::Disk { block: 11, twin: 900, generation: 7 }),
            ]),
        };
        let b = n.encode(&FSID, 500, 7);
        assert_eq!(Node::decode(&b, &FSID, &ptr(1), 1, 1000).ok(), Some(n));
        // A child past the end of the image is refused.
        assert!(Node::decode(&b, &FSID, &ptr(1), 1, 11).is_err());
    }

    #[test]
    fn full_leaf_fits() {
        let mut items = Vec::new();
        let mut k = 0;
        let mut node = Node::empty_leaf(5);
        loop {
            items.push((Key::new(k, 1, 0), vec![k as u8; 50]));
            node.body = Body::Leaf(items.clone());
            if !node.fits() {
                items.pop();
                break;
            }
            k += 1;
        }
        node.body = Body::Leaf(items);
        let b = node.encode(&FSID, 500, 7);
        assert_eq!(Node::decode(&b, &FSID, &ptr(0), 5, 1000).ok(), Some(node));
    }
}
