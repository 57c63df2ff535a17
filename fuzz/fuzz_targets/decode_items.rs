//! Every item decoder on the same arbitrary bytes: `Superblock::decode`, `Inode::decode`,
//! `dirent::decode_entries`, `dirent::decode_index`, `xattr::decode` and `Extent::decode`.
//! None may panic. Whatever one accepts must roundtrip through its encoder: the
//! re-encoded value decodes to the same thing, and for the item encodings (each byte
//! meaningful or checked to be zero) it is byte for byte what was decoded.
//!
//! Items keyed by a name hash (directory entries, xattrs) are only accepted when the key
//! matches the name, which random keys never do: `hash_key` derives the key's offset
//! from the first name in the bytes instead. `fix_checksum` does the same for the
//! superblock's CRC-32C. Besides raw bytes, the input can start from a well-formed
//! encoding of any of the items (built from arbitrary fields) with bytes flipped in it,
//! so that every decoder's success path and its checks on nearly valid input are reached.

#![no_main]

use arbitrary::Arbitrary;
use crest_store::checksum::crc32c;
use crest_store::fs::dirent::{decode_entries, decode_index, encode_entries, encode_index, DirEntry};
use crest_store::fs::extent::Extent;
use crest_store::fs::xattr;
use crest_store::key::{name_hash, Key};
use crest_store::limits::{MAX_EXTENT_BLOCKS, MAX_INLINE_BYTES, RESERVED_BLOCKS};
use crest_store::node::BlockPtr;
use crest_store::superblock::{Superblock, MANIFEST_MAX_BLOCKS, SUPERBLOCK_BYTES};
use crest_store::{FileKind, Inode, Timespec};
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
    /// Where the bytes come from.
    template: Template,
    /// (position, xor mask) pairs applied to a template's encoding.
    flips: Vec<(u16, u8)>,
    /// The bytes when there is no template.
    bytes: Vec<u8>,
}

/// A well-formed item built from arbitrary fields (made valid where they are not).
#[derive(Arbitrary, Debug)]
enum Template {
    None,
    Superblock {
        fsid: [u8; 16],
        generation: u64,
        total: u64,
        used: u64,
        roots: [(u64, u64, u8); 2],
        version3: bool,
        manifest: Option<Vec<(u64, u32)>>,
    },
    Inode { fields: [u64; 6], small: [u32; 5], times: [(i64, u32); 4], kind: u8 },
    Entries(Vec<(u64, u64, u8, Vec<u8>)>),
    Index { ino: u64, kind: u8, name: Vec<u8> },
    Xattrs(Vec<(Vec<u8>, Vec<u8>)>),
    Inline(Vec<u8>),
    Regular { disk_block: u64, csums: Vec<u32> },
}

fn kind_of(k: u8) -> FileKind {
    FileKind::from_u8(1 + k % 7).expect("1..=7 are kinds")
}

/// A name `check_name` accepts.
fn valid_name(mut n: Vec<u8>) -> Vec<u8> {
    n.truncate(255);
    for b in &mut n {
        if *b == b'/' || *b == 0 {
            *b = b'x';
        }
    }
    if n.is_empty() || n == b"." || n == b".." {
        n.push(b'x');
    }
    n
}

impl Template {
    fn encode(self, input: &Input) -> Option<Vec<u8>> {
        Some(match self {
            Template::None => return None,
            Template::Superblock { fsid, generation, total, used, roots, version3, manifest } => {
                let total = total % input.blocks.saturating_add(1);
                let ptr = |(b, g, l): (u64, u64, u8)| BlockPtr {
                    block: b % total.max(1),
                    twin: (b >> 7) % total.max(1),
                    generation: g % generation.saturating_add(1),
                    level: l,
                };
                Superblock {
                    fsid,
                    generation,
                    total_blocks: total,
                    used_blocks: used % total.saturating_add(1),
                    root_tree: ptr(roots[0]),
                    refcount_tree: ptr(roots[1]),
                    csum_type: crest_store::checksum::CSUM_CRC32C,
                    meta_copies: 1 + (generation % 2) as u8,
                    version: if version3 { 3 } else { 2 },
                    features: u32::from(version3),
                    manifest: manifest.filter(|_| version3).map(|m| {
                        m.into_iter().take(MANIFEST_MAX_BLOCKS).map(|(b, c)| (b % total.max(1), c)).collect()
                    }),
                }
                .encode(usize::from(input.second_copy))
            }
            Template::Inode { fields, small, times, kind } => {
                let t = |(sec, nsec): (i64, u32)| Timespec::new(sec, nsec % 1_000_000_000);
                Inode {
                    ino: input.objectid,
                    generation: fields[0],
                    kind: kind_of(kind),
                    mode: small[0] & 0o7777,
                    nlink: small[1],
                    uid: small[2],
                    gid: small[3],
                    size: fields[1],
                    blocks: fields[2],
                    rdev: fields[3],
                    atime: t(times[0]),
                    mtime: t(times[1]),
                    ctime: t(times[2]),
                    crtime: t(times[3]),
                    parent: fields[4],
                    next_index: fields[5],
                    flags: small[4],
                }
                .encode()
            }
            Template::Entries(es) => encode_entries(
                &es.into_iter()
                    .map(|(ino, index, kind, name)| DirEntry {
                        name: valid_name(name),
                        ino,
                        kind: kind_of(kind),
                        index,
                    })
                    .collect::<Vec<_>>(),
            ),
            Template::Index { ino, kind, name } => {
                encode_index(&DirEntry { name: valid_name(name), ino, kind: kind_of(kind), index: input.offset })
            }
            Template::Xattrs(pairs) => xattr::encode(
                &pairs
                    .into_iter()
                    .map(|(mut n, mut v)| {
                        n.truncate(255);
                        if n.is_empty() {
                            n.push(b'x');
                        }
                        // Inline if small enough, else a record naming chunks.
                        if xattr::is_inline(n.len(), v.len()) {
                            xattr::Entry { name: n, value: xattr::Value::Inline(v) }
                        } else {
                            v.truncate(65_536);
                            xattr::Entry { name: n, value: xattr::Value::Chunked { len: v.len() as u32, id: v.len() as u64 } }
                        }
                    })
                    .collect::<Vec<_>>(),
            ),
            Template::Inline(mut data) => {
                data.truncate(MAX_INLINE_BYTES);
                Extent::Inline(data).encode()
            }
            Template::Regular { disk_block, mut csums } => {
                csums.truncate(MAX_EXTENT_BLOCKS as usize);
                if csums.is_empty() {
                    csums.push(0);
                }
                let room = input.blocks.saturating_sub(RESERVED_BLOCKS + csums.len() as u64).saturating_add(1);
                Extent::Regular { disk_block: RESERVED_BLOCKS + disk_block % room, twin: 0, csums }.encode()
            }
        })
    }
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
    // Version 3's features and manifest (every field is in the first sector).
    assert_eq!(again[126..512], b[126..512], "superblock fields re-encode differently");
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
/// The first record's name: inline `[len][u16][name]`, out of line `[0][len][u32][u64][name]`.
fn first_xattr_name(b: &[u8]) -> &[u8] {
    match b.first() {
        Some(0) if b.len() >= 14 => &b[14..(14 + usize::from(b[1])).min(b.len())],
        Some(&len) if len != 0 && b.len() >= 3 => &b[3..(3 + usize::from(len)).min(b.len())],
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
    if let Extent::Regular { disk_block, twin, csums } = &ext {
        assert!(!csums.is_empty());
        let n = csums.len() as u64;
        // Inside the image, or blocks of one object of the data store (no second copy).
        let in_object = crest_store::fs::objects::within_one_object(*disk_block, n);
        assert!(in_object && *twin == 0 || disk_block.checked_add(n).is_some_and(|e| e <= input.blocks));
        // A second copy lies inside the image and apart from the first.
        assert!(*twin == 0 || (twin + n <= input.blocks && (twin + n <= *disk_block || disk_block + n <= *twin)));
    }
    let again = ext.encode();
    match Extent::decode(key, &again, input.blocks) {
        Ok(e) => assert_eq!(e, ext, "extent roundtrip"),
        Err(e) => panic!("re-encoded extent {ext:?} does not decode: {e}"),
    }
    assert!(&again == b, "Extent::decode accepted a non-canonical encoding of {ext:?}");
}

fuzz_target!(|input: Input| {
    let mut input = input;
    let template = std::mem::replace(&mut input.template, Template::None);
    if let Some(mut b) = template.encode(&input) {
        if !b.is_empty() {
            for &(at, mask) in &input.flips {
                let at = usize::from(at) % b.len();
                b[at] ^= mask;
            }
        }
        input.bytes = b;
    }
    superblock(&input);
    inode(&input);
    dir_entries(&input);
    dir_index(&input);
    xattrs(&input);
    extent(&input);
});
