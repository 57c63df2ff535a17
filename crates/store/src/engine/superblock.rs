//! The superblock: the one place a commit overwrites in place. Two copies live at fixed
//! offsets; commit of generation `g` writes copy `g % 2` only, so the other copy always
//! holds the previous generation intact. At open the newest copy that verifies wins.
//! An image with two metadata copies (`meta_copies = 2`, the default) also writes each
//! copy to a mirror slot, so a damaged copy still has a twin of the same generation.
//!
//! Version 3 adds feature flags and the commit manifest: a generation committed with one
//! flush (its nodes, data and superblock written together, then flushed) lists the data
//! blocks it wrote, with their checksums, so `open` can tell whether all of it reached the
//! disk before trusting it (docs/format.md §7.3).
//!
//! Invariants:
//! - a superblock without a manifest is written only after every node it points to is
//!   durable (flush first); one with a manifest names every data block its generation
//!   wrote, and its nodes are those whose pointers carry its generation;
//! - both copies share magic, version, fsid and size; they differ only in generation,
//!   roots and counters;
//! - a copy whose checksum, magic, version, own copy index or geometry is wrong is ignored
//!   (with the reason kept for the error message if no copy is usable).

use crate::engine::checksum::{crc32c, CSUM_CRC32C};
use crate::engine::node::BlockPtr;
use crate::error::{Error, Result};
use crate::limits::{BLOCK_SIZE, SUPERBLOCK_OFFSETS};

/// "CRESTFS1" — the magic number.
pub const MAGIC: [u8; 8] = *b"CRESTFS1";
/// Format version this code writes (`crest mkfs`, `Store::upgrade_format`).
pub const FORMAT_VERSION: u32 = 3;
/// The oldest format version this code reads (and keeps writing until upgraded).
pub const OLDEST_FORMAT_VERSION: u32 = 2;
/// Version-3 incompatible feature: commits may be made durable with one flush, their
/// superblock carrying a manifest (a reader that does not check it could trust a
/// generation that only partly reached the disk).
pub const FEATURE_ONE_FLUSH: u32 = 1;
/// Every incompatible feature this code understands.
pub const KNOWN_FEATURES: u32 = FEATURE_ONE_FLUSH;
/// The most data blocks a manifest lists: what fits in the superblock's first 512-byte
/// sector, where all of its fields are, so that a write torn at a sector boundary leaves
/// a copy whole or as it was, never half new (a commit that wrote more data flushes twice).
pub const MANIFEST_MAX_BLOCKS: usize = (SECTOR_BYTES - OFF_MANIFEST) / MANIFEST_ENTRY_BYTES;
const SECTOR_BYTES: usize = 512;
/// Bytes of a superblock on disk (one block; the tail is zero).
pub const SUPERBLOCK_BYTES: usize = BLOCK_SIZE;

/// A one-flush commit's data blocks and their CRC-32C.
pub type Manifest = Vec<(u64, u32)>;

/// Decoded superblock.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Superblock {
    /// Identifies this file system; every node carries it.
    pub fsid: [u8; 16],
    /// Generation of the last commit.
    pub generation: u64,
    /// Blocks in the image.
    pub total_blocks: u64,
    /// Blocks in use (metadata nodes, data extents, reserved area) at this generation.
    pub used_blocks: u64,
    /// Root of the root tree (datasets).
    pub root_tree: BlockPtr,
    /// Root of the refcount tree (data extent references).
    pub refcount_tree: BlockPtr,
    /// Checksum algorithm for nodes and data (`CSUM_CRC32C`).
    pub csum_type: u8,
    /// Copies of every tree node and of each superblock copy: 1, or 2 (DUP).
    pub meta_copies: u8,
    /// The format version this image is written in: `OLDEST_FORMAT_VERSION` until
    /// upgraded, then `FORMAT_VERSION`.
    pub version: u32,
    /// Incompatible features (version 3; 0 in version 2).
    pub features: u32,
    /// Set when this generation was committed with one flush: each data block it wrote,
    /// with the CRC-32C of its 4096 bytes (`open` checks them, and that each node whose
    /// pointer carries this generation has a good copy, before trusting it).
    pub manifest: Option<Manifest>,
}

// Byte layout (all little-endian): see docs/format.md.
const OFF_CSUM: usize = 0; // 32 bytes, crc32c in the first 4, of bytes 32..4096
const OFF_MAGIC: usize = 32;
const OFF_VERSION: usize = 40;
const OFF_COPY: usize = 44; // which copy this is (0 or 1)
const OFF_CSUM_TYPE: usize = 45;
const OFF_META_COPIES: usize = 46;
const OFF_BLOCK_SIZE: usize = 48;
const OFF_FSID: usize = 52;
const OFF_GENERATION: usize = 68;
const OFF_TOTAL_BLOCKS: usize = 76;
const OFF_USED_BLOCKS: usize = 84;
const OFF_ROOT_TREE: usize = 92; // block u64, generation u64, level u8
const OFF_REFCOUNT_TREE: usize = 109;
const OFF_ROOT_TWIN: usize = 126; // block of the root tree root's second copy (0: none)
const OFF_REFCOUNT_TWIN: usize = 134;
const END_V2: usize = 142;
const OFF_FEATURES: usize = 142; // u32, incompatible features (version 3)
const OFF_ONE_FLUSH: usize = 146; // u8: 1 = committed with one flush, a manifest follows
const OFF_MANIFEST_LEN: usize = 148; // u16, entries
const OFF_MANIFEST: usize = 150; // entries: block u64, crc32c u32
const MANIFEST_ENTRY_BYTES: usize = 12;

fn get_u64(b: &[u8], off: usize) -> u64 {
    let mut a = [0u8; 8];
    a.copy_from_slice(&b[off..off + 8]);
    u64::from_le_bytes(a)
}

fn get_u32(b: &[u8], off: usize) -> u32 {
    let mut a = [0u8; 4];
    a.copy_from_slice(&b[off..off + 4]);
    u32::from_le_bytes(a)
}

fn put_ptr(b: &mut [u8], off: usize, p: &BlockPtr) {
    b[off..off + 8].copy_from_slice(&p.block.to_le_bytes());
    b[off + 8..off + 16].copy_from_slice(&p.generation.to_le_bytes());
    b[off + 16] = p.level;
}

fn get_ptr(b: &[u8], off: usize, twin_off: usize) -> BlockPtr {
    BlockPtr { block: get_u64(b, off), twin: get_u64(b, twin_off), generation: get_u64(b, off + 8), level: b[off + 16] }
}

impl Superblock {
    /// Block number of copy `copy`.
    pub fn block_of_copy(copy: usize) -> u64 {
        SUPERBLOCK_OFFSETS[copy] / BLOCK_SIZE as u64
    }

    /// The copy a commit of this generation writes.
    pub fn copy_for_generation(generation: u64) -> usize {
        (generation % 2) as usize
    }

    /// Encodes copy `copy` with its checksum.
    pub fn encode(&self, copy: usize) -> Vec<u8> {
        let mut b = vec![0u8; SUPERBLOCK_BYTES];
        b[OFF_MAGIC..OFF_MAGIC + 8].copy_from_slice(&MAGIC);
        b[OFF_VERSION..OFF_VERSION + 4].copy_from_slice(&self.version.to_le_bytes());
        b[OFF_COPY] = copy as u8;
        b[OFF_CSUM_TYPE] = self.csum_type;
        b[OFF_META_COPIES] = self.meta_copies;
        b[OFF_BLOCK_SIZE..OFF_BLOCK_SIZE + 4].copy_from_slice(&(BLOCK_SIZE as u32).to_le_bytes());
        b[OFF_FSID..OFF_FSID + 16].copy_from_slice(&self.fsid);
        b[OFF_GENERATION..OFF_GENERATION + 8].copy_from_slice(&self.generation.to_le_bytes());
        b[OFF_TOTAL_BLOCKS..OFF_TOTAL_BLOCKS + 8].copy_from_slice(&self.total_blocks.to_le_bytes());
        b[OFF_USED_BLOCKS..OFF_USED_BLOCKS + 8].copy_from_slice(&self.used_blocks.to_le_bytes());
        put_ptr(&mut b, OFF_ROOT_TREE, &self.root_tree);
        put_ptr(&mut b, OFF_REFCOUNT_TREE, &self.refcount_tree);
        b[OFF_ROOT_TWIN..OFF_ROOT_TWIN + 8].copy_from_slice(&self.root_tree.twin.to_le_bytes());
        b[OFF_REFCOUNT_TWIN..OFF_REFCOUNT_TWIN + 8].copy_from_slice(&self.refcount_tree.twin.to_le_bytes());
        if self.version >= 3 {
            b[OFF_FEATURES..OFF_FEATURES + 4].copy_from_slice(&self.features.to_le_bytes());
            if let Some(list) = &self.manifest {
                b[OFF_ONE_FLUSH] = 1;
                // (The committer keeps a manifest within MANIFEST_MAX_BLOCKS.)
                let list = &list[..list.len().min(MANIFEST_MAX_BLOCKS)];
                b[OFF_MANIFEST_LEN..OFF_MANIFEST_LEN + 2].copy_from_slice(&(list.len() as u16).to_le_bytes());
                for (i, (block, crc)) in list.iter().enumerate() {
                    let at = OFF_MANIFEST + i * MANIFEST_ENTRY_BYTES;
                    b[at..at + 8].copy_from_slice(&block.to_le_bytes());
                    b[at + 8..at + 12].copy_from_slice(&crc.to_le_bytes());
                }
            }
        }
        const { assert!(OFF_MANIFEST + MANIFEST_MAX_BLOCKS * MANIFEST_ENTRY_BYTES <= SECTOR_BYTES) };
        let csum = crc32c(&b[32..]);
        b[OFF_CSUM..OFF_CSUM + 4].copy_from_slice(&csum.to_le_bytes());
        b
    }

    /// Decodes and verifies copy `copy` read from its fixed place in an image of
    /// `image_blocks` blocks. Errors say exactly what is wrong.
    pub fn decode(b: &[u8], copy: usize, image_blocks: u64) -> Result<Superblock> {
        let block = Superblock::block_of_copy(copy);
        let bad = |detail: String| Error::corrupt("superblock", block, detail);
        if b.len() != SUPERBLOCK_BYTES {
            return Err(bad(format!("{} bytes, expected {SUPERBLOCK_BYTES}", b.len())));
        }
        if b[OFF_MAGIC..OFF_MAGIC + 8] != MAGIC {
            return Err(bad(format!("bad magic {:02x?} (not a crest image?)", &b[OFF_MAGIC..OFF_MAGIC + 8])));
        }
        let stored = get_u32(b, OFF_CSUM);
        let computed = crc32c(&b[32..]);
        if stored != computed {
            return Err(bad(format!("checksum mismatch: stored {stored:#010x}, computed {computed:#010x}")));
        }
        // (After the checksum: a torn copy is damage, a valid one of a newer format is an
        // image this crest must not open at all — `Error::NotSupported`.)
        let version = get_u32(b, OFF_VERSION);
        if !(OLDEST_FORMAT_VERSION..=FORMAT_VERSION).contains(&version) {
            return Err(Error::NotSupported(format!(
                "the image is in on-disk format version {version}; this crest reads versions \
                 {OLDEST_FORMAT_VERSION} to {FORMAT_VERSION} (a newer crest made or upgraded it)"
            )));
        }
        let unknown = if version >= 3 { get_u32(b, OFF_FEATURES) & !KNOWN_FEATURES } else { 0 };
        if unknown != 0 {
            return Err(Error::NotSupported(format!(
                "the image uses on-disk features {unknown:#x} this crest does not know (a newer crest made it)"
            )));
        }
        let (features, manifest, end) = if version >= 3 { decode_v3(b).map_err(bad)? } else { (0, None, END_V2) };
        if b[OFF_CSUM + 4..OFF_CSUM + 32].iter().chain(&b[47..48]).chain(&b[end..]).any(|&x| x != 0) {
            return Err(bad("non-zero reserved bytes".into()));
        }
        if usize::from(b[OFF_COPY]) != copy {
            return Err(bad(format!(
                "copy index {} found where copy {copy} belongs (misdirected write?)",
                b[OFF_COPY]
            )));
        }
        let csum_type = b[OFF_CSUM_TYPE];
        if csum_type != CSUM_CRC32C {
            return Err(bad(format!("unknown checksum type {csum_type}")));
        }
        let meta_copies = b[OFF_META_COPIES];
        if !(1..=2).contains(&meta_copies) {
            return Err(bad(format!("{meta_copies} metadata copies (1 or 2)")));
        }
        let block_size = get_u32(b, OFF_BLOCK_SIZE);
        if block_size as usize != BLOCK_SIZE {
            return Err(bad(format!("block size {block_size}, expected {BLOCK_SIZE}")));
        }
        let total_blocks = get_u64(b, OFF_TOTAL_BLOCKS);
        if total_blocks > image_blocks {
            return Err(bad(format!(
                "file system has {total_blocks} blocks but the image holds only {image_blocks} (truncated image?)"
            )));
        }
        let used_blocks = get_u64(b, OFF_USED_BLOCKS);
        if used_blocks > total_blocks {
            return Err(bad(format!("{used_blocks} used blocks of {total_blocks}")));
        }
        let mut fsid = [0u8; 16];
        fsid.copy_from_slice(&b[OFF_FSID..OFF_FSID + 16]);
        let sb = Superblock {
            fsid,
            generation: get_u64(b, OFF_GENERATION),
            total_blocks,
            used_blocks,
            root_tree: get_ptr(b, OFF_ROOT_TREE, OFF_ROOT_TWIN),
            refcount_tree: get_ptr(b, OFF_REFCOUNT_TREE, OFF_REFCOUNT_TWIN),
            csum_type,
            meta_copies,
            version,
            features,
            manifest,
        };
        let usable = |b: u64| (crate::limits::RESERVED_BLOCKS..total_blocks).contains(&b);
        if let Some(bad_block) = sb.manifest.iter().flatten().map(|e| e.0).find(|&b| !usable(b)) {
            return Err(bad(format!("manifest names block {bad_block}, outside the image's data blocks")));
        }
        for (name, p) in [("root tree", &sb.root_tree), ("refcount tree", &sb.refcount_tree)] {
            if !usable(p.block) || p.generation > sb.generation {
                return Err(bad(format!(
                    "{name} root {p:?} outside the image or newer than generation {}",
                    sb.generation
                )));
            }
            let twin_ok = if meta_copies == 2 { usable(p.twin) && p.twin != p.block } else { p.twin == 0 };
            if !twin_ok {
                return Err(bad(format!("{name} root {p:?}: second copy wrong for {meta_copies} metadata copies")));
            }
        }
        Ok(sb)
    }
}

/// A version-3 superblock's features and manifest, and where its used bytes end.
fn decode_v3(b: &[u8]) -> std::result::Result<(u32, Option<Manifest>, usize), String> {
    let features = get_u32(b, OFF_FEATURES);
    let one_flush = b[OFF_ONE_FLUSH];
    if b[OFF_ONE_FLUSH + 1] != 0 {
        return Err("non-zero reserved bytes".into());
    }
    let len = usize::from(u16::from_le_bytes([b[OFF_MANIFEST_LEN], b[OFF_MANIFEST_LEN + 1]]));
    match one_flush {
        0 if len == 0 => Ok((features, None, OFF_ONE_FLUSH)),
        1 if features & FEATURE_ONE_FLUSH == 0 => Err("a manifest without the one-flush feature".into()),
        1 if len <= MANIFEST_MAX_BLOCKS => {
            let list = (0..len)
                .map(|i| {
                    let at = OFF_MANIFEST + i * MANIFEST_ENTRY_BYTES;
                    (get_u64(b, at), get_u32(b, at + 8))
                })
                .collect();
            Ok((features, Some(list), OFF_MANIFEST + len * MANIFEST_ENTRY_BYTES))
        }
        _ => Err(format!("manifest flag {one_flush} with {len} entries")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> Superblock {
        Superblock {
            fsid: [7; 16],
            generation: 42,
            total_blocks: 10_000,
            used_blocks: 300,
            root_tree: BlockPtr { block: 300, twin: 5000, generation: 41, level: 0 },
            refcount_tree: BlockPtr { block: 301, twin: 5001, generation: 42, level: 1 },
            csum_type: CSUM_CRC32C,
            meta_copies: 2,
            version: FORMAT_VERSION,
            features: FEATURE_ONE_FLUSH,
            manifest: Some(vec![(400, 0xdead_beef), (9_999, 7)]),
        }
    }

    #[test]
    fn versions_two_and_three_round_trip_with_and_without_a_manifest() {
        let v2 = Superblock { version: 2, features: 0, manifest: None, ..sample() };
        let v3_two_flushes = Superblock { manifest: None, ..sample() };
        let full = (0..MANIFEST_MAX_BLOCKS as u64).map(|i| (300 + i, i as u32 * 31)).collect();
        let v3_full = Superblock { manifest: Some(full), ..sample() };
        let v3_empty = Superblock { manifest: Some(Vec::new()), ..sample() };
        for sb in [v2, v3_two_flushes, v3_full, v3_empty, sample()] {
            for copy in 0..2 {
                assert_eq!(Superblock::decode(&sb.encode(copy), copy, 10_000).ok(), Some(sb.clone()));
            }
        }
    }

    /// Re-seals `b` after an edit (a valid checksum over wrong contents).
    fn reseal(b: &mut [u8]) {
        let csum = crc32c(&b[32..]);
        b[OFF_CSUM..OFF_CSUM + 4].copy_from_slice(&csum.to_le_bytes());
    }

    #[test]
    fn a_newer_format_or_unknown_feature_is_not_supported_and_bad_manifests_are_damage() {
        let mut b = sample().encode(0);
        b[OFF_VERSION..OFF_VERSION + 4].copy_from_slice(&(FORMAT_VERSION + 1).to_le_bytes());
        reseal(&mut b);
        assert!(matches!(Superblock::decode(&b, 0, 10_000), Err(Error::NotSupported(m)) if m.contains("version 4")));
        let mut b = sample().encode(0);
        b[OFF_FEATURES] |= 0x80;
        reseal(&mut b);
        assert!(matches!(Superblock::decode(&b, 0, 10_000), Err(Error::NotSupported(m)) if m.contains("0x80")));
        // Damage, not a newer format: the copy is passed over.
        let edits: [(usize, u8); 5] = [
            (OFF_MANIFEST_LEN, 0xff),                     // more entries than fit
            (OFF_ONE_FLUSH, 2),                           // an unknown flag value
            (OFF_ONE_FLUSH + 1, 1),                       // reserved
            (OFF_MANIFEST + 2 * MANIFEST_ENTRY_BYTES, 1), // past the last entry
            (OFF_MANIFEST + MANIFEST_ENTRY_BYTES + 7, 1), // a block past the image
        ];
        for (at, v) in edits {
            let mut b = sample().encode(0);
            b[at] = v;
            reseal(&mut b);
            assert!(
                matches!(Superblock::decode(&b, 0, 10_000), Err(Error::Corrupt { .. })),
                "byte {at} = {v} accepted"
            );
        }
        let mut no_feature = sample().encode(0);
        no_feature[OFF_FEATURES] = 0;
        reseal(&mut no_feature);
        assert!(matches!(Superblock::decode(&no_feature, 0, 10_000), Err(Error::Corrupt { .. })));
        // Version 2 keeps every byte past its fields zero.
        let mut v2 = Superblock { version: 2, features: 0, manifest: None, ..sample() }.encode(0);
        v2[OFF_FEATURES] = 1;
        reseal(&mut v2);
        assert!(matches!(Superblock::decode(&v2, 0, 10_000), Err(Error::Corrupt { .. })));
    }

    #[test]
    fn roundtrip_both_copies() {
        for copy in 0..2 {
            let b = sample().encode(copy);
            assert_eq!(Superblock::decode(&b, copy, 10_000).ok(), Some(sample()));
        }
    }

    #[test]
    fn every_single_byte_flip_is_caught() {
        let good = sample().encode(0);
        for i in 0..good.len() {
            let mut b = good.clone();
            b[i] ^= 0x10;
            assert!(Superblock::decode(&b, 0, 10_000).is_err(), "flip at byte {i} accepted");
        }
    }

    #[test]
    fn misplaced_copy_and_truncated_image_are_refused() {
        let b = sample().encode(0);
        let e = Superblock::decode(&b, 1, 10_000).err().map(|e| e.to_string());
        assert!(e.is_some_and(|m| m.contains("misdirected")));
        let e = Superblock::decode(&b, 0, 5_000).err().map(|e| e.to_string());
        assert!(e.is_some_and(|m| m.contains("truncated")));
        let e = Superblock::decode(&b[..100], 0, 10_000).err().map(|e| e.to_string());
        assert!(e.is_some_and(|m| m.contains("bytes")));
        let e = Superblock::decode(&[0u8; SUPERBLOCK_BYTES], 0, 10_000).err().map(|e| e.to_string());
        assert!(e.is_some_and(|m| m.contains("magic")));
    }
}
