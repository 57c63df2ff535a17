//! Every item decoder on the same arbitrary bytes: `Superblock::decode`, `Inode::decode`,
//! `dirent::decode_entries`, `dirent::decode_index`, `xattr::decode` and `Extent::decode`.
//! None may panic. Whatever one accepts must roundtrip through its encoder: the
//! re-encoded value decodes to the same thing, and for the item encodings (each byte
//! meaningful or checked to be zero) it is byte for byte what was decoded.
//!
//! Items keyed by a name hash (directory entries, xattrs) are only accepted when the key
//! matches the name, which random keys never do: `hash_key` derives the key's offset
//! from the first name in the bytes instead. `fix_checksum` does the same for the
//! superblock's CRC-32C.

#![no_main]

use arbitrary::Arbitrary;
use crest_store::checksum::crc32c;
use crest_store::fs::dirent::{decode_entries, decode_index, encode_entries, encode_index};
use crest_store::fs::extent::Extent;
use crest_store::fs::xattr;
use crest_store::key::{name_hash, Key};
use crest_store::superblock::{Superblock, SUPERBLOCK_BYTES};
use crest_store::Inode;
use libfuzzer_sys::fuzz_target;

#[derive(Arbitrary, Debug)]
struct Input {
    objectid: u64,
    kind: u8,
    offset: u64,
    /// Image size for the superblock, file system size for extents.
    blocks: u64,
    /// Block number the item was "read from" (only used in error messages).
    block: u64,
    hash_key: bool,
    /// Superblock: which copy is expected (0 or 1).
    second_copy: bool,
    /// Superblock: zero-pad / truncate the bytes to one block first.
    pad_superblock: bool,
    fix_checksum: bool,
    bytes: Vec<u8>,
}

fn superblock(input: &Input) {
    let mut b = input.bytes.clone();
    if input.pad_superblock {
        b.resize(SUPERBLOCK_BYTES, 0);
    }
    if input.fix_checksum && b.len() >= 32 {
        let c = crc32c(&b[32..]);
        b[0..4].copy_from_slice(&c.to_le_bytes());
    }
    let copy = usize::from(input.second_copy);
    let Ok(sb) = Superblock::decode(&b, copy, input.blocks) else { return };
    assert!(sb.used_blocks <= sb.total_blocks && sb.total_blocks <= input.blocks, "{sb:?}");
    let again = sb.encode(copy);
    match Superblock::decode(&again, copy, input.blocks) {
        Ok(s) => assert_eq!(s, sb, "superblock roundtrip"),
        Err(e) => panic!("re-encoded superblock {sb:?} does not decode: {e}"),
    }
    // Decode does not check that bytes 46..48 (padding before the block size) and the
    // tail past byte 126 are zero (the checksum covers them), so only the fields are
    // compared byte for byte.
    assert_eq!(again[32..46], b[32..46], "superblock fields re-encode differently");
    assert_eq!(again[48..126], b[48..126], "superblock fields re-encode differently");
}

fn inode(input: &Input) {
    let b = &input.bytes;
    let Ok(i) = Inode::decode(input.objectid, b, input.block) else { return };
    assert_eq!(i.ino, input.objectid);
    let again = i.encode();
    match Inode::decode(input.objectid, &again, input.block) {
        Ok(j) => assert_eq!(j, i, "inode roundtrip"),
        Err(e) => panic!("re-encoded inode {i:?} does not decode: {e}"),
    }
    assert!(&again == b, "inode decode accepted a non-canonical encoding of {i:?}");
}

/// The first name of a DIR_ENTRY value: ino u64, index u64, kind u8, len u8, name.
fn first_entry_name(b: &[u8]) -> &[u8] {
    match b.get(17) {
        Some(&len) => &b[18..(18 + usize::from(len)).min(b.len())],
        None => &[],
    }
}

/// The first name of an XATTR value: name_len u8, value_len u16, name, value.
fn first_xattr_name(b: &[u8]) -> &[u8] {
    match b.first() {
        Some(&len) if b.len() >= 3 => &b[3..(3 + usize::from(len)).min(b.len())],
        _ => &[],
    }
}

fn key_for(input: &Input, name: &[u8]) -> Key {
    let offset = if input.hash_key { name_hash(name) } else { input.offset };
    Key::new(input.objectid, input.kind, offset)
}

fn dir_entries(input: &Input) {
    let b = &input.bytes;
    let key = key_for(input, first_entry_name(b));
    let Ok(entries) = decode_entries(key, b, input.block) else { return };
    assert!(!entries.is_empty());
    for e in &entries {
        assert_eq!(name_hash(&e.name), key.offset, "entry {e:?} accepted under the wrong hash");
    }
    let again = encode_entries(&entries);
    match decode_entries(key, &again, input.block) {
        Ok(es) => assert_eq!(es, entries, "dir entry roundtrip"),
        Err(e) => panic!("re-encoded entries {entries:?} do not decode: {e}"),
    }
    assert!(&again == b, "decode_entries accepted a non-canonical encoding of {entries:?}");
}

fn dir_index(input: &Input) {
    let b = &input.bytes;
    let key = Key::new(input.objectid, input.kind, input.offset);
    let Ok(entry) = decode_index(key, b, input.block) else { return };
    assert_eq!(entry.index, key.offset);
    let again = encode_index(&entry);
    match decode_index(key, &again, input.block) {
        Ok(e) => assert_eq!(e, entry, "dir index roundtrip"),
        Err(e) => panic!("re-encoded index entry {entry:?} does not decode: {e}"),
    }
    assert!(&again == b, "decode_index accepted a non-canonical encoding of {entry:?}");
}

fn xattrs(input: &Input) {
    let b = &input.bytes;
    let key = key_for(input, first_xattr_name(b));
    let Ok(pairs) = xattr::decode(key, b, input.block) else { return };
    assert!(!pairs.is_empty());
    let again = xattr::encode(&pairs);
    match xattr::decode(key, &again, input.block) {
        Ok(p) => assert_eq!(p, pairs, "xattr roundtrip"),
        Err(e) => panic!("re-encoded xattrs {pairs:?} do not decode: {e}"),
    }
    assert!(&again == b, "xattr::decode accepted a non-canonical encoding of {pairs:?}");
}

fn extent(input: &Input) {
    let b = &input.bytes;
    let key = Key::new(input.objectid, input.kind, input.offset);
    let Ok(ext) = Extent::decode(key, b, input.blocks) else { return };
    if let Extent::Regular { disk_block, csums } = &ext {
        assert!(!csums.is_empty());
        assert!(disk_block.checked_add(csums.len() as u64).is_some_and(|e| e <= input.blocks));
    }
    let again = ext.encode();
    match Extent::decode(key, &again, input.blocks) {
        Ok(e) => assert_eq!(e, ext, "extent roundtrip"),
        Err(e) => panic!("re-encoded extent {ext:?} does not decode: {e}"),
    }
    assert!(&again == b, "Extent::decode accepted a non-canonical encoding of {ext:?}");
}

fuzz_target!(|input: Input| {
    superblock(&input);
    inode(&input);
    dir_entries(&input);
    dir_index(&input);
    xattrs(&input);
    extent(&input);
});
