//! Reads carried out off the store's thread (`Store::plan_read`, `ReadPlan::run`):
//! - a plan reads what the file held when it was planned, however much the store writes,
//!   frees and commits meanwhile on an image small enough that freed blocks must be
//!   reused (the pin keeps the plan's blocks out of the allocator), and those blocks go
//!   back to it once the plan is dropped;
//! - a plan made right after a write (io_uring: the write may still be queued) reads it;
//! - a plan finds a bad block and answers `None`; the store's own read then repairs it
//!   from its second copy, or reports it.
//!
//! Offsets, lengths and contents are seeded (`CREST_READPLAN_SEED`, printed).

mod common;

use common::t;
use crest_nvlist::{NvList, Value};
use crest_rng::Stream;
use crest_store::datasets::root_of;
use crest_store::{Disk, FileDisk, FileKind, MkfsOptions, Planned, ReadPlan, Store, UringDisk, ROOT_INO};

const MIB: u64 = 1 << 20;

fn seed() -> u64 {
    let seed =
        std::env::var("CREST_READPLAN_SEED").ok().and_then(|s| s.parse().ok()).unwrap_or_else(crest_rng::next_u64);
    println!("CREST_READPLAN_SEED={seed}");
    seed
}

fn bytes(rng: &mut Stream, n: usize) -> Vec<u8> {
    let mut v = vec![0u8; n];
    for chunk in v.chunks_mut(8) {
        let x = rng.next_u64().to_le_bytes();
        chunk.copy_from_slice(&x[..chunk.len()]);
    }
    v
}

/// A fresh image file of `mib` MiB (one metadata copy) opened on `disk`'s backend.
fn image(dir: &tempfile::TempDir, mib: u64, uring: bool) -> Store {
    let path = dir.path().join("img");
    let opts = MkfsOptions { now: t(1), fsid: Some([3; 16]), seed: Some(1), meta_copies: 1 };
    Store::mkfs(Box::new(FileDisk::create(&path, mib * MIB).expect("create")), &opts).expect("mkfs");
    let disk: Box<dyn Disk> = if uring {
        Box::new(UringDisk::open(&path).expect("uring"))
    } else {
        Box::new(FileDisk::open(&path).expect("open"))
    };
    Store::open(disk).expect("open store")
}

fn uring_available() -> bool {
    UringDisk::available().is_ok()
}

fn elsewhere(p: Planned) -> ReadPlan {
    match p {
        Planned::Elsewhere(plan) => plan,
        Planned::Read(_) => panic!("a read of disk blocks on a file image was not planned for elsewhere"),
        Planned::Located(_) => panic!("a read located in objects on an image without any"),
    }
}

fn new_file(s: &mut Store, dir: u64, name: &str, data: &[u8], sec: i64) -> u64 {
    let ino = s.create(dir, name.as_bytes(), FileKind::Regular, 0o644, 0, 0, 0, t(sec)).expect("create").ino;
    s.write(ino, 0, data, t(sec)).expect("write");
    ino
}

fn a_plan_outlives_the_reuse_of_its_blocks(uring: bool) {
    let seed = seed();
    let mut rng = Stream::from_seed_u64(seed);
    let dir = tempfile::tempdir().expect("tempdir");
    // 24 MiB: the churn below writes ~100 MiB, so freed blocks are taken again and again.
    let mut s = image(&dir, 24, uring);
    let size = 256 * 1024 + rng.below(256 * 1024) as usize;
    let old = bytes(&mut rng, size);
    let a = new_file(&mut s, ROOT_INO, "a", &old, 2);
    s.commit().expect("commit");
    let offset = rng.below(size as u64 / 2);
    let len = 1 + rng.below(size as u64 - offset);
    let plan = elsewhere(s.plan_read(a, offset, len, 0).expect("plan"));
    let want = &old[offset as usize..(offset + len) as usize];
    for round in 0..40 {
        // `a` rewritten whole (its old blocks freed), others written and removed.
        s.write(a, 0, &bytes(&mut rng, size), t(3 + round)).expect("rewrite");
        let n = (MIB / 2 + rng.below(2 * MIB)) as usize;
        new_file(&mut s, ROOT_INO, "churn", &bytes(&mut rng, n), 3 + round);
        s.commit().expect("commit");
        s.unlink(ROOT_INO, b"churn", t(3 + round)).expect("unlink");
        s.commit().expect("commit");
    }
    // The blocks the plan reads wait for it (and only those, or the churn would have
    // found no room).
    let planned_blocks = (offset + len).div_ceil(4096) - offset / 4096;
    assert!(s.pending_free_blocks() >= planned_blocks, "seed {seed}: the plan's blocks went back");
    let got = plan.run();
    assert!(got.as_deref() == Some(want), "seed {seed}: the plan read other bytes than the file held when planned");
    drop(plan);
    // Once it is dropped they go back with the next commit (and what that one frees, the
    // one after).
    s.commit().expect("commit");
    s.commit().expect("commit");
    assert_eq!(s.pending_free_blocks(), 0, "seed {seed}: blocks held after the plan was dropped");
    let now = s.read(a, 0, size as u64).expect("read");
    assert_eq!(now.len(), size);
}

#[test]
fn a_plan_outlives_the_reuse_of_its_blocks_file() {
    a_plan_outlives_the_reuse_of_its_blocks(false);
}

#[test]
fn a_plan_outlives_the_reuse_of_its_blocks_uring() {
    if uring_available() {
        a_plan_outlives_the_reuse_of_its_blocks(true);
    }
}

#[test]
fn a_plan_made_right_after_a_write_reads_it() {
    if !uring_available() {
        return;
    }
    let seed = seed();
    let mut rng = Stream::from_seed_u64(seed);
    let dir = tempfile::tempdir().expect("tempdir");
    let mut s = image(&dir, 64, true);
    let a = new_file(&mut s, ROOT_INO, "a", &[], 2);
    let mut model = Vec::new();
    for round in 0..200 {
        let off = rng.below(model.len() as u64 + 100_000) as usize;
        let n = 1 + rng.below(300_000) as usize;
        let data = bytes(&mut rng, n);
        s.write(a, off as u64, &data, t(3 + round)).expect("write");
        if model.len() < off + data.len() {
            model.resize(off + data.len(), 0);
        }
        model[off..off + data.len()].copy_from_slice(&data);
        // Straight after: the write may still wait in the ring.
        let (o, l) = (off.saturating_sub(5_000) as u64, data.len() as u64 + 10_000);
        let got = match s.plan_read(a, o, l, 0).expect("plan") {
            Planned::Elsewhere(plan) => plan.run(),
            Planned::Read(bytes) => Some(bytes),
            Planned::Located(_) => panic!("a read located in objects on an image without any"),
        };
        let end = model.len().min((o + l) as usize);
        assert!(
            got.as_deref() == Some(&model[o as usize..end]),
            "seed {seed}, round {round}: a plan after a write of {} bytes at {off} read other bytes",
            data.len()
        );
        if rng.below(8) == 0 {
            s.commit().expect("commit");
        }
    }
}

/// The image's blocks holding `needle` (a data block's first bytes).
fn blocks_with(path: &std::path::Path, needle: &[u8]) -> Vec<u64> {
    let img = std::fs::read(path).expect("read image");
    img.chunks_exact(4096).enumerate().filter(|(_, b)| b.starts_with(needle)).map(|(i, _)| i as u64).collect()
}

/// Flips a bit of `block` in the image file; returns where and which, for `unflip`.
fn flip(path: &std::path::Path, block: u64, rng: &mut Stream) -> (u64, u8) {
    let at = block * 4096 + 64 + rng.below(4000);
    let bit = 1 << rng.below(8);
    unflip(path, (at, bit));
    (at, bit)
}

fn unflip(path: &std::path::Path, (at, bit): (u64, u8)) {
    use std::os::unix::fs::FileExt;
    let f = std::fs::OpenOptions::new().read(true).write(true).open(path).expect("open image");
    let mut b = [0u8];
    f.read_exact_at(&mut b, at).expect("read");
    b[0] ^= bit;
    f.write_all_at(&b, at).expect("write");
}

#[test]
fn a_plan_that_finds_a_bad_block_leaves_it_to_the_store() {
    let seed = seed();
    let mut rng = Stream::from_seed_u64(seed);
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("img");
    let mut s = image(&dir, 64, false);
    let mut props = NvList::new();
    props.add("copies", Value::U64(2)).expect("prop");
    let two = root_of(s.create_dataset("two", props, (0, 0, 0o755), t(2)).expect("dataset"));
    let blocks = 2 + rng.below(30) as usize;
    let tagged = |salt: u8| -> Vec<u8> {
        (0..blocks)
            .flat_map(|b| {
                let mut v = vec![salt; 4096];
                v[..8].copy_from_slice(b"PLANTEST");
                v[8] = salt;
                v[9..17].copy_from_slice(&(b as u64).to_le_bytes());
                v
            })
            .collect()
    };
    let (one_data, two_data) = (tagged(1), tagged(2));
    let one = new_file(&mut s, ROOT_INO, "one", &one_data, 3);
    let dup = new_file(&mut s, two, "dup", &two_data, 3);
    s.commit().expect("commit");
    let bad = rng.below(blocks as u64);
    let mut needle = b"PLANTEST".to_vec();
    needle.push(1);
    needle.extend(bad.to_le_bytes());
    let found = blocks_with(&path, &needle);
    assert_eq!(found.len(), 1, "one copy of block {bad} of a copies=1 file");
    flip(&path, found[0], &mut rng);
    let plan = elsewhere(s.plan_read(one, 0, one_data.len() as u64, 0).expect("plan"));
    assert!(plan.run().is_none(), "seed {seed}: a plan read a bad block of a copies=1 file as good");
    drop(plan);
    let err = s.read(one, 0, one_data.len() as u64).expect_err("a bad block read as good");
    assert!(matches!(err, crest_store::Error::DataChecksum { .. }), "{err:?}");

    // copies=2: the copy a plan reads bad (which of the two is the first is found by
    // trying), the plan gives up, the store's read repairs it, a new plan reads it.
    needle[8] = 2;
    let found = blocks_with(&path, &needle);
    assert_eq!(found.len(), 2, "two copies of block {bad} of a copies=2 file");
    let flipped = flip(&path, found[0], &mut rng);
    let plan = elsewhere(s.plan_read(dup, 0, two_data.len() as u64, 0).expect("plan"));
    if plan.run().is_some() {
        // That was the second copy, which the plan does not read: the first instead.
        assert_eq!(plan.run().as_deref(), Some(&two_data[..]), "seed {seed}");
        unflip(&path, flipped);
        flip(&path, found[1], &mut rng);
    }
    drop(plan);
    let plan = elsewhere(s.plan_read(dup, 0, two_data.len() as u64, 0).expect("plan"));
    assert!(plan.run().is_none(), "seed {seed}: a plan read a bad first copy as good");
    drop(plan);
    assert_eq!(s.read(dup, 0, two_data.len() as u64).expect("read from the second copy"), two_data);
    let plan = elsewhere(s.plan_read(dup, 0, two_data.len() as u64, 0).expect("plan"));
    assert_eq!(plan.run().as_deref(), Some(&two_data[..]), "seed {seed}: the repaired block");
}

#[test]
fn small_reads_and_holes_are_read_on_the_spot() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut s = image(&dir, 16, false);
    let small = new_file(&mut s, ROOT_INO, "small", b"inline bytes", 2);
    assert!(matches!(s.plan_read(small, 0, 100, 0).expect("plan"), Planned::Read(b) if b == b"inline bytes"));
    let big = new_file(&mut s, ROOT_INO, "big", &vec![7u8; 200_000], 2);
    assert!(matches!(s.plan_read(big, 0, 8192, 65536).expect("plan"), Planned::Read(b) if b == vec![7u8; 8192]));
    assert!(matches!(s.plan_read(big, 0, 131072, 65536).expect("plan"), Planned::Elsewhere(_)));
    // A hole's bytes come from nowhere.
    let sparse = new_file(&mut s, ROOT_INO, "sparse", &[], 2);
    s.write(sparse, 10 << 20, b"end", t(3)).expect("write");
    assert!(matches!(s.plan_read(sparse, 0, 1 << 20, 1).expect("plan"), Planned::Read(b) if b == vec![0u8; 1 << 20]));
    assert!(matches!(s.plan_read(ROOT_INO, 0, 10, 0), Err(crest_store::Error::IsDir(_))));
}

#[test]
fn sums_computed_elsewhere_are_recorded_as_given() {
    use crest_store::checksum::block_sums;
    let seed = seed();
    let mut rng = Stream::from_seed_u64(seed);
    let dir = tempfile::tempdir().expect("tempdir");
    let mut s = image(&dir, 32, false);
    let a = new_file(&mut s, ROOT_INO, "a", &[], 2);
    // Whole blocks with their sums: read back whole, here and by a plan.
    let blocks = 1 + rng.below(200) as usize;
    let at = rng.below(100) * 4096;
    let data = bytes(&mut rng, blocks * 4096);
    s.write_summed(a, at, &data, Some(&block_sums(&data)), t(3)).expect("write");
    assert_eq!(s.read(a, at, data.len() as u64).expect("read"), data, "seed {seed}");
    let plan = elsewhere(s.plan_read(a, at, data.len() as u64, 0).expect("plan"));
    assert_eq!(plan.run().as_deref(), Some(&data[..]), "seed {seed}");
    drop(plan);
    // A list of the wrong length, or a write not of whole blocks: the store sums itself.
    let odd = bytes(&mut rng, 5000);
    s.write_summed(a, at + 1, &odd, Some(&[1, 2, 3]), t(5)).expect("write");
    assert_eq!(s.read(a, at + 1, 5000).expect("read"), odd, "seed {seed}");
    let other = bytes(&mut rng, 4096 * 2);
    s.write_summed(a, at, &other, Some(&[7]), t(6)).expect("write");
    assert_eq!(s.read(a, at, 8192).expect("read"), other, "seed {seed}");
    // Sums of other bytes: those blocks read as damaged (the store does not check them).
    let mut wrong = block_sums(&other);
    wrong[1] ^= 1;
    s.write_summed(a, at, &other, Some(&wrong), t(4)).expect("write");
    assert_eq!(s.read(a, at, 4096).expect("the block whose sum is right"), other[..4096]);
    assert!(matches!(s.read(a, at + 4096, 4096), Err(crest_store::Error::DataChecksum { .. })), "seed {seed}");
}
