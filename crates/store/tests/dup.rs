//! Metadata in two copies (DUP, the default): every tree node is written to two blocks and
//! every superblock copy to its slot and a mirror. One damaged copy never shows: reads use
//! the twin and rewrite the bad copy, fsck reports it (and only it), scrub and
//! `repair_all` (fsck --repair) put the original bytes back; two damaged copies of
//! the same node are corruption as with one copy, never wrong data.
//!
//! How. A seeded image with datasets, a snapshot and enough files for three-level trees is
//! built in memory. Node copies are found without the store's help: a node block is one
//! whose header names the image's fsid and whose checksum holds, and its twin is the other
//! block with the same bytes (stale copies of old generations are found too: damaging
//! those must change nothing at all). Each round damages one random byte of one random
//! copy (`CREST_DUP_SEED`, `CREST_DUP_ROUNDS`; the seed is printed).

mod common;
use common::*;

use std::collections::HashMap;

use crest_nvlist::NvList;
use crest_rng::Stream;
use crest_store::checksum::crc32c;
use crest_store::datasets::root_of;
use crest_store::limits::{BLOCK_SIZE, SUPERBLOCK_MIRROR_OFFSETS, SUPERBLOCK_OFFSETS};
use crest_store::superblock::Superblock;
use crest_store::{check, FileKind, MemDisk, Store, ROOT_INO};

const FSID: [u8; 16] = [7; 16];

fn build() -> (MemDisk, Dump) {
    let disk = fresh(24);
    let mut s = open(&disk);
    let a = s.create_dataset("a", NvList::new(), (0, 0, 0o755), t(2)).expect("dataset");
    for (root, n) in [(ROOT_INO, 1500usize), (root_of(a), 300)] {
        let dir = s.create(root, b"d", FileKind::Directory, 0o755, 0, 0, 0, t(3)).expect("mkdir").ino;
        for i in 0..n {
            let f = s.create(dir, format!("f{i:05}").as_bytes(), FileKind::Regular, 0o644, 0, 0, 0, t(3));
            let len = [20, 1500, 9000][i % 3];
            s.write(f.expect("create").ino, 0, &vec![i as u8; len], t(3)).expect("write");
        }
        if root == ROOT_INO {
            s.commit().expect("commit");
        }
    }
    s.create_snapshots(&["a@s".to_string()]).expect("snapshot");
    s.commit().expect("commit");
    let want = dump(&mut s);
    drop(s.close().expect("close"));
    (disk, want)
}

/// Blocks holding a valid node of this image, grouped by identical bytes: each group is
/// one node's copies (two for a live node; stale ones may have lost one to reuse).
fn node_copies(img: &[u8]) -> Vec<Vec<u64>> {
    let mut by_bytes: HashMap<&[u8], Vec<u64>> = HashMap::new();
    for (b, block) in img.chunks_exact(BLOCK_SIZE).enumerate() {
        let sum = u32::from_le_bytes([block[0], block[1], block[2], block[3]]);
        if block[32..48] == FSID && sum == crc32c(&block[32..]) {
            by_bytes.entry(block).or_default().push(b as u64);
        }
    }
    let mut groups: Vec<Vec<u64>> = by_bytes.into_values().collect();
    groups.sort();
    groups
}

fn newest_superblock(img: &[u8]) -> Superblock {
    let blocks = img.len() as u64 / BLOCK_SIZE as u64;
    (0..2)
        .filter_map(|c| Superblock::decode(&img[SUPERBLOCK_OFFSETS[c] as usize..][..BLOCK_SIZE], c, blocks).ok())
        .max_by_key(|s| s.generation)
        .expect("a superblock")
}

/// A scrub from the start to its end, `step` data blocks at a time.
fn full_scrub(s: &mut Store, step: u64) -> crest_store::scrub::Scrub {
    s.scrub_restart().expect("restart");
    loop {
        let st = s.scrub_step(step).expect("scrub");
        if st.done {
            return st;
        }
    }
}

fn seed() -> u64 {
    let seed = std::env::var("CREST_DUP_SEED").ok().and_then(|s| s.parse().ok()).unwrap_or_else(crest_rng::next_u64);
    println!("CREST_DUP_SEED={seed}");
    seed
}

fn rounds() -> usize {
    std::env::var("CREST_DUP_ROUNDS").ok().and_then(|s| s.parse().ok()).unwrap_or(40)
}

fn damage(img: &mut [u8], block: u64, rng: &mut Stream) -> usize {
    let at = block as usize * BLOCK_SIZE + rng.below(BLOCK_SIZE as u64) as usize;
    img[at] ^= 1 << rng.below(8);
    at
}

#[test]
fn one_bad_copy_of_any_node_is_read_from_its_twin_and_repaired() {
    let seed = seed();
    let mut rng = Stream::from_seed_u64(seed);
    let (disk, want) = build();
    let pristine = disk.snapshot();
    let groups = node_copies(&pristine);
    let pairs: Vec<&Vec<u64>> = groups.iter().filter(|g| g.len() == 2).collect();
    assert!(pairs.len() > 100, "seed {seed}: {} nodes in two copies", pairs.len());
    assert!(groups.iter().all(|g| g.len() <= 2), "seed {seed}: no node in more than two blocks");
    assert!(check::fsck(Box::new(MemDisk::from_bytes(pristine.clone()))).expect("fsck").is_clean());
    let mut live_damaged = 0;
    for round in 0..rounds() {
        let pair = pairs[rng.below(pairs.len() as u64) as usize];
        let victim = pair[rng.below(2) as usize];
        let mut img = pristine.clone();
        let at = damage(&mut img, victim, &mut rng);
        let ctx = format!("seed {seed} round {round}: byte {at} of block {victim} (copies {pair:?})");
        // fsck reads without writing: the bad copy is its only problem (none if stale).
        let report = check::fsck(Box::new(MemDisk::from_bytes(img.clone()))).expect("fsck");
        let live = !report.is_clean();
        assert!(
            report.problems.iter().all(|p| p.contains(&format!("copy at block {victim} "))),
            "{ctx}: fsck says {:?}",
            report.problems
        );
        live_damaged += usize::from(live);
        // Offline repair puts the original bytes back and leaves fsck clean.
        let repaired = MemDisk::from_bytes(img.clone());
        let mut s = Store::open_keeping_orphans(Box::new(repaired.clone())).expect("open for repair");
        let st = s.repair_all().expect("repair");
        assert!(st.bad.is_empty(), "{ctx}: {:?}", st.bad);
        drop(s.abandon());
        let fixed = repaired.snapshot();
        if live {
            assert_eq!(fixed[at], pristine[at], "{ctx}: repaired byte");
        }
        let after = check::fsck(Box::new(MemDisk::from_bytes(fixed))).expect("fsck");
        assert!(after.is_clean(), "{ctx}: after repair: {:?}", after.problems);
        // Online: everything reads as before, and scrub leaves the image clean.
        let online = MemDisk::from_bytes(img);
        let mut s = open(&online);
        assert_same(&dump(&mut s), &want, &ctx);
        let st = full_scrub(&mut s, 500);
        assert!(st.bad.is_empty(), "{ctx}: scrub {:?}", st.bad);
        drop(s.close().expect("close"));
        let after = check::fsck(Box::new(MemDisk::from_bytes(online.snapshot()))).expect("fsck");
        assert!(after.is_clean(), "{ctx}: after scrub: {:?}", after.problems);
    }
    println!("{live_damaged} of {} rounds damaged a live node", rounds());
}

#[test]
fn a_bad_node_copy_is_rewritten_by_the_read_that_finds_it() {
    let (disk, want) = build();
    let pristine = disk.snapshot();
    // The root tree's root: the first node every open reads.
    let newest = newest_superblock(&pristine);
    let root = newest.root_tree;
    assert_ne!(root.twin, 0, "the root tree's root has a second copy");
    let mut img = pristine.clone();
    let at = root.block as usize * BLOCK_SIZE + 40;
    img[at] ^= 0xff;
    let online = MemDisk::from_bytes(img);
    let mut s = open(&online);
    assert_same(&dump(&mut s), &want, "read through the twin");
    assert_eq!(online.snapshot()[at], pristine[at], "the read rewrote the bad copy");
    // Both copies bad: corruption, as with one copy — never another tree.
    let mut img = pristine.clone();
    img[root.block as usize * BLOCK_SIZE + 40] ^= 0xff;
    img[root.twin as usize * BLOCK_SIZE + 40] ^= 0xff;
    if let Ok(mut s) = Store::open(Box::new(MemDisk::from_bytes(img))) {
        // (Open may fall back to the older superblock generation: then it is that one.)
        assert!(s.generation() < newest.generation, "both copies bad cannot open the newest generation");
        let _ = dump(&mut s);
    }
}

#[test]
fn a_bad_superblock_copy_is_read_from_its_mirror_and_repaired() {
    let (disk, want) = build();
    let pristine = disk.snapshot();
    let mut rng = Stream::from_seed_u64(seed());
    for copy in 0..2 {
        for place in [SUPERBLOCK_OFFSETS[copy], SUPERBLOCK_MIRROR_OFFSETS[copy]] {
            let mut img = pristine.clone();
            let at = place as usize + rng.below(200) as usize;
            img[at] ^= 0x5a;
            let gen = open(&MemDisk::from_bytes(pristine.clone())).generation();
            let report = check::fsck(Box::new(MemDisk::from_bytes(img.clone()))).expect("fsck");
            assert!(
                report.problems.iter().any(|p| p.contains(&format!("at byte {place}"))),
                "copy {copy} at {place}: {:?}",
                report.problems
            );
            let online = MemDisk::from_bytes(img);
            let mut s = open(&online);
            assert_eq!(s.generation(), gen, "copy {copy} at {place}: the same generation opens");
            assert_same(&dump(&mut s), &want, "after a bad superblock copy");
            let st = s.repair_all().expect("repair");
            assert!(st.repaired >= 1 && st.bad.is_empty(), "copy {copy} at {place}: {st:?}");
            assert_eq!(online.snapshot()[at], pristine[at], "copy {copy} at {place}: rewritten");
        }
    }
}

/// Every block of a `copies=2` file's data starts with this tag, its inode and file block,
/// so its two copies can be found in the image without the store's help.
fn tagged_block(ino: u64, block: u64, salt: u8) -> Vec<u8> {
    let mut b: Vec<u8> = (0..BLOCK_SIZE).map(|i| (i as u8).wrapping_mul(31) ^ salt).collect();
    b[..8].copy_from_slice(b"DUPDATA!");
    b[8..16].copy_from_slice(&ino.to_le_bytes());
    b[16..24].copy_from_slice(&block.to_le_bytes());
    b
}

#[test]
fn a_copies_2_file_survives_one_bad_copy_of_any_block() {
    use crest_nvlist::Value;
    use crest_store::{FallocateMode, SetAttr};
    let seed = seed();
    let mut rng = Stream::from_seed_u64(seed);
    let disk = fresh(32);
    let mut s = open(&disk);
    let mut props = NvList::new();
    props.add("copies", Value::U64(2)).expect("prop");
    let d = s.create_dataset("c2", props, (0, 0, 0o755), t(2)).expect("dataset");
    let root = root_of(d);
    // Files written whole, then partly rewritten, truncated, punched and extended, so
    // extents are split and merged with their second copies.
    let mut files = Vec::new();
    for f in 0..12u64 {
        let ino =
            s.create(root, format!("f{f}").as_bytes(), FileKind::Regular, 0o644, 0, 0, 0, t(3)).expect("create").ino;
        let blocks = 1 + rng.below(40);
        let data: Vec<u8> = (0..blocks).flat_map(|b| tagged_block(ino, b, 1)).collect();
        s.write(ino, 0, &data, t(3)).expect("write");
        files.push((ino, blocks));
    }
    s.commit().expect("commit");
    s.create_snapshots(&["c2@before".to_string()]).expect("snapshot");
    for &(ino, blocks) in &files {
        match rng.below(4) {
            0 => {
                let b = rng.below(blocks);
                s.write(ino, b * 4096, &tagged_block(ino, b, 2), t(4)).expect("rewrite");
            }
            1 if blocks > 2 => {
                let attr = SetAttr { size: Some((blocks - 1) * 4096), ..SetAttr::default() };
                s.setattr(ino, &attr, t(4)).expect("truncate");
            }
            2 if blocks > 3 => {
                let punch = FallocateMode { keep_size: true, punch_hole: true, ..FallocateMode::default() };
                s.fallocate(ino, 4096, 4096, punch, t(4)).expect("punch");
            }
            _ => {
                let data: Vec<u8> = (blocks..blocks + 3).flat_map(|b| tagged_block(ino, b, 3)).collect();
                s.write(ino, blocks * 4096, &data, t(4)).expect("extend");
            }
        }
    }
    s.commit().expect("commit");
    let want = dump(&mut s);
    drop(s.close().expect("close"));
    let pristine = disk.snapshot();
    assert!(check::fsck(Box::new(MemDisk::from_bytes(pristine.clone()))).expect("fsck").is_clean());
    // Live data blocks of the dataset: a tag whose two copies are alike.
    let mut by_bytes: HashMap<&[u8], Vec<u64>> = HashMap::new();
    for (b, block) in pristine.chunks_exact(BLOCK_SIZE).enumerate() {
        if &block[..8] == b"DUPDATA!" {
            by_bytes.entry(block).or_default().push(b as u64);
        }
    }
    let pairs: Vec<Vec<u64>> = by_bytes.into_values().filter(|v| v.len() == 2).collect();
    assert!(pairs.len() > 50, "seed {seed}: {} data blocks in two copies", pairs.len());
    for round in 0..rounds() {
        let pair = &pairs[rng.below(pairs.len() as u64) as usize];
        let victim = pair[rng.below(2) as usize];
        let mut img = pristine.clone();
        let at = damage(&mut img, victim, &mut rng);
        let ctx = format!("seed {seed} round {round}: byte {at} of data block {victim} (copies {pair:?})");
        // Reads give the original bytes (from the good copy, whichever is bad).
        let online = MemDisk::from_bytes(img.clone());
        let mut s = open(&online);
        assert_same(&dump(&mut s), &want, &ctx);
        // Scrub repairs what a read did not touch (a bad second copy), fsck is clean.
        let st = full_scrub(&mut s, 64);
        assert!(st.bad.is_empty(), "{ctx}: {:?}", st.bad);
        drop(s.close().expect("close"));
        assert_eq!(online.snapshot()[at], pristine[at], "{ctx}: repaired online");
        let after = check::fsck(Box::new(MemDisk::from_bytes(online.snapshot()))).expect("fsck");
        assert!(after.is_clean(), "{ctx}: after scrub: {:?}", after.problems);
        // Offline: fsck names the bad copy; repair_all (fsck --repair) rewrites it.
        let report = check::fsck(Box::new(MemDisk::from_bytes(img.clone()))).expect("fsck");
        assert!(
            !report.is_clean() && report.problems.iter().all(|p| p.contains(&format!("disk block {victim})"))),
            "{ctx}: fsck says {:?}",
            report.problems
        );
        let offline = MemDisk::from_bytes(img);
        let mut s = Store::open_keeping_orphans(Box::new(offline.clone())).expect("open");
        let st = s.repair_all().expect("repair");
        assert!(st.repaired >= 1 && st.bad.is_empty(), "{ctx}: {st:?}");
        drop(s.abandon());
        assert_eq!(offline.snapshot()[at], pristine[at], "{ctx}: repaired offline");
    }
    // Both copies of a block bad: EIO (a checksum error), never wrong bytes. (A block the
    // live file still maps: some pairs are the snapshot's alone.)
    let tag =
        |b: u64, at: usize| u64::from_le_bytes(pristine[b as usize * BLOCK_SIZE + at..][..8].try_into().expect("8"));
    let mut s = open(&MemDisk::from_bytes(pristine.clone()));
    let pair = pairs
        .iter()
        .find(|p| {
            let block = &pristine[p[0] as usize * BLOCK_SIZE..][..BLOCK_SIZE];
            s.read(tag(p[0], 8), tag(p[0], 16) * 4096, 4096).is_ok_and(|d| d == block)
        })
        .expect("a block the live file maps");
    let mut img = pristine.clone();
    for &b in pair {
        img[b as usize * BLOCK_SIZE + 100] ^= 0x10;
    }
    let mut s = open(&MemDisk::from_bytes(img));
    let (ino, fblock) = (tag(pair[0], 8), tag(pair[0], 16));
    let err = s.read(ino, fblock * 4096, 4096).expect_err("both copies bad");
    assert!(err.is_corruption(), "seed {seed}: {err}");
}

#[test]
fn a_copies_2_dataset_counts_both_copies_against_its_quota() {
    use crest_nvlist::Value;
    let disk = fresh(32);
    let mut s = open(&disk);
    let mut props = NvList::new();
    props.add("copies", Value::U64(2)).expect("prop");
    props.add("quota", Value::U64(4 << 20)).expect("prop");
    let d = s.create_dataset("q", props, (0, 0, 0o755), t(2)).expect("dataset");
    let f = s.create(root_of(d), b"f", FileKind::Regular, 0o644, 0, 0, 0, t(3)).expect("create").ino;
    s.write(f, 0, &vec![7u8; 1536 << 10], t(3)).expect("1.5 MiB: 3 MiB of the 4 MiB quota");
    let err = s.write(f, 1536 << 10, &vec![7u8; 1 << 20], t(3)).expect_err("1 MiB more: 5 MiB");
    assert!(matches!(err, crest_store::Error::Quota(_)), "{err}");
    assert_eq!(s.dataset_used_blocks(d), 2 * 384, "both copies counted");
    s.commit().expect("commit");
    drop(s.close().expect("close"));
    let s = open(&disk);
    assert_eq!(s.dataset_used_blocks(d), 2 * 384, "counted again at open");
}
