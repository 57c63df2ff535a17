//! Metadata in two copies (DUP, the default): every tree node is written to two blocks and
//! every superblock copy to its slot and a mirror. One damaged copy never shows: reads use
//! the twin and rewrite the bad copy, fsck reports it (and only it), scrub and
//! `repair_metadata` (fsck --repair) put the original bytes back; two damaged copies of
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
        let st = s.repair_metadata().expect("repair");
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
        s.scrub_restart().expect("restart");
        let st = loop {
            let st = s.scrub_step(500).expect("scrub");
            if st.done {
                break st;
            }
        };
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
            let st = s.repair_metadata().expect("repair");
            assert!(st.repaired >= 1 && st.bad.is_empty(), "copy {copy} at {place}: {st:?}");
            assert_eq!(online.snapshot()[at], pristine[at], "copy {copy} at {place}: rewritten");
        }
    }
}
