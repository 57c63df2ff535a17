//! `Node::decode` on arbitrary blocks: it must never panic, and whatever it accepts must
//! survive a roundtrip: re-encoding the node for the same fsid, block and generation gives
//! bytes that decode to the same node, and (the encoding being canonical: every byte of a
//! valid node is either meaningful or checked to be zero) are the very bytes decoded.
//!
//! Random bytes almost never carry a valid CRC-32C or header, so besides raw input the
//! target can fix up the checksum, take the expected pointer from the header itself, or
//! start from a well-formed encoded node and flip bytes in it.

#![no_main]

use arbitrary::Arbitrary;
use crest_store::checksum::crc32c;
use crest_store::key::Key;
use crest_store::limits::{BLOCK_SIZE, MAX_TREE_LEVEL};
use crest_store::node::{BlockPtr, Body, ChildPtr, Node, INTERNAL_CAPACITY};
use libfuzzer_sys::fuzz_target;

#[derive(Arbitrary, Debug)]
struct Expect {
    fsid: [u8; 16],
    block: u64,
    generation: u64,
    level: u8,
    owner: u64,
    total_blocks: u64,
}

#[derive(Arbitrary, Debug)]
enum Source {
    /// Bytes as given, or zero-padded / truncated to one block.
    Raw {
        pad_to_block: bool,
        fix_checksum: bool,
        /// Expect exactly what the header says (fsid, block, generation, owner, level).
        expect_from_header: bool,
        bytes: Vec<u8>,
    },
    /// A node built from arbitrary items or children, encoded, then damaged.
    Encoded {
        level: u8,
        leaf_items: Vec<((u64, u8, u64), Vec<u8>)>,
        children: Vec<((u64, u8, u64), u64, u64)>,
        /// (position, xor mask) pairs applied to the encoded block.
        flips: Vec<(u16, u8)>,
        fix_checksum: bool,
        /// Decode expecting the arbitrary level of `Input::expect` instead of the node's own.
        use_other_level: bool,
    },
}

#[derive(Arbitrary, Debug)]
struct Input {
    expect: Expect,
    source: Source,
}

fn le_u64(b: &[u8], at: usize) -> u64 {
    let mut a = [0u8; 8];
    a.copy_from_slice(&b[at..at + 8]);
    u64::from_le_bytes(a)
}

fn fix_checksum(b: &mut [u8]) {
    if b.len() >= 32 {
        let c = crc32c(&b[32..]);
        b[0..4].copy_from_slice(&c.to_le_bytes());
    }
}

/// Builds a node that `encode` accepts: sorted distinct keys, fits in a block, children
/// pointing inside the image and not newer than the node.
fn build(
    level: u8,
    leaf_items: Vec<((u64, u8, u64), Vec<u8>)>,
    children: Vec<((u64, u8, u64), u64, u64)>,
    e: &Expect,
) -> Node {
    let level = level % (MAX_TREE_LEVEL + 1);
    let body = if level == 0 {
        let mut items: Vec<(Key, Vec<u8>)> =
            leaf_items.into_iter().map(|((o, k, f), v)| (Key::new(o, k, f), v)).collect();
        items.sort_by_key(|a| a.0);
        items.dedup_by(|a, b| a.0 == b.0);
        while !(Node { owner: e.owner, level, body: Body::Leaf(items.clone()) }).fits() {
            items.pop();
        }
        Body::Leaf(items)
    } else {
        let total = e.total_blocks.max(1);
        let mut kids: Vec<(Key, ChildPtr)> = children
            .into_iter()
            .map(|((o, k, f), b, g)| {
                (Key::new(o, k, f), ChildPtr::Disk {
                        block: b % total,
                        twin: Some((b >> 7) % total).filter(|&t| t != b % total).unwrap_or(0),
                        generation: g % e.generation.saturating_add(1),
                    })
            })
            .collect();
        kids.sort_by_key(|a| a.0);
        kids.dedup_by(|a, b| a.0 == b.0);
        kids.truncate(INTERNAL_CAPACITY);
        if kids.is_empty() {
            kids.push((Key::MIN, ChildPtr::Disk { block: 0, twin: 0, generation: 0 }));
        }
        Body::Internal(kids)
    };
    Node { owner: e.owner, level, body }
}

fuzz_target!(|input: Input| {
    let Input { expect: e, source } = input;
    let (bytes, fsid, ptr, owner) = match source {
        Source::Raw { pad_to_block, fix_checksum: fix, expect_from_header, mut bytes } => {
            if pad_to_block {
                bytes.resize(BLOCK_SIZE, 0);
            }
            if fix {
                fix_checksum(&mut bytes);
            }
            if expect_from_header && bytes.len() >= 80 {
                let mut fsid = [0u8; 16];
                fsid.copy_from_slice(&bytes[32..48]);
                let ptr = BlockPtr { block: le_u64(&bytes, 48), twin: 0, generation: le_u64(&bytes, 56), level: bytes[72] };
                let owner = le_u64(&bytes, 64);
                (bytes, fsid, ptr, owner)
            } else {
                (bytes, e.fsid, BlockPtr { block: e.block, twin: 0, generation: e.generation, level: e.level }, e.owner)
            }
        }
        Source::Encoded { level, leaf_items, children, flips, fix_checksum: fix, use_other_level } => {
            let node = build(level, leaf_items, children, &e);
            let mut bytes = node.encode(&e.fsid, e.block, e.generation);
            // The undamaged encoding must decode to the node it came from.
            let ptr = BlockPtr { block: e.block, twin: 0, generation: e.generation, level: node.level };
            match Node::decode(&bytes, &e.fsid, &ptr, e.owner, e.total_blocks.max(1)) {
                Ok(back) => assert_eq!(back, node, "encode/decode roundtrip of a built node"),
                Err(err) => panic!("a node built to be valid does not decode: {err}\nnode: {node:?}"),
            }
            for (at, mask) in flips {
                let at = usize::from(at) % BLOCK_SIZE;
                bytes[at] ^= mask;
            }
            if fix {
                fix_checksum(&mut bytes);
            }
            let ptr = if use_other_level { BlockPtr { level: e.level, ..ptr } } else { ptr };
            (bytes, e.fsid, ptr, e.owner)
        }
    };
    let total_blocks = e.total_blocks.max(1);
    let Ok(node) = Node::decode(&bytes, &fsid, &ptr, owner, total_blocks) else { return };

    // Accepted: it is a well-formed node for exactly these expectations.
    assert_eq!(node.owner, owner);
    assert_eq!(node.level, ptr.level);
    assert!(node.fits(), "decoded node does not fit a block: {node:?}");
    let again = node.encode(&fsid, ptr.block, ptr.generation);
    match Node::decode(&again, &fsid, &ptr, owner, total_blocks) {
        Ok(n) => assert_eq!(n, node, "re-encoded node decodes differently"),
        Err(err) => panic!("re-encoded node does not decode: {err}\nnode: {node:?}"),
    }
    assert!(again == bytes, "decode accepted a non-canonical encoding of {node:?}");
});
