//! On-disk format versions: version 3 commits a small transaction with one flush (its
//! superblock lists the data it wrote), a bigger one with two; a version-2 image keeps
//! two flushes per commit until upgraded, and an upgrade leaves no version-2 copy behind.
//! (Power loss at every write of both kinds of commit: tests/crash.rs.)

mod common;
use common::*;
use crest_rng::Stream;
use crest_store::crash::{image_at, CrashPoint, Event, RecordingDisk};
use crest_store::limits::{SUPERBLOCK_MIRROR_OFFSETS, SUPERBLOCK_OFFSETS};
use crest_store::superblock::{FORMAT_VERSION, MANIFEST_MAX_BLOCKS, OLDEST_FORMAT_VERSION};
use crest_store::{Disk, FileKind, MemDisk, MkfsOptions, Store, ROOT_INO};

/// Flushes the disk saw while `f` ran.
fn flushes_during(rec: &RecordingDisk, f: impl FnOnce()) -> usize {
    let before = rec.events().len();
    f();
    rec.events()[before..].iter().filter(|e| matches!(e, Event::Flush)).count()
}

/// The format version field of superblock slot `copy`.
fn slot_version(disk: &MemDisk, copy: usize) -> u32 {
    let img = disk.snapshot();
    let at = SUPERBLOCK_OFFSETS[copy] as usize + 40;
    u32::from_le_bytes(img[at..at + 4].try_into().expect("4 bytes"))
}

fn image(version: u32) -> MemDisk {
    let disk = MemDisk::new(16 << 20);
    let opts = MkfsOptions { now: t(1), fsid: Some([7; 16]), seed: None, meta_copies: 2 };
    Store::mkfs_in_format(Box::new(disk.clone()), &opts, version).expect("mkfs");
    disk
}

/// Writes `blocks` 4 KiB blocks of fresh data (new file `name`) and commits; the flushes.
fn write_and_commit(store: &mut Store, rec: &RecordingDisk, name: &str, blocks: usize, rng: &mut Stream) -> usize {
    let data: Vec<u8> = (0..blocks * 4096).map(|_| rng.below(256) as u8).collect();
    let ino = store.create(ROOT_INO, name.as_bytes(), FileKind::Regular, 0o644, 0, 0, 0, t(2)).expect("create").ino;
    store.write(ino, 0, &data, t(2)).expect("write");
    flushes_during(rec, || store.commit().expect("commit"))
}

#[test]
fn a_small_commit_flushes_once_and_a_big_one_twice() {
    let seed = std::env::var("CREST_SEED").ok().and_then(|s| s.parse().ok()).unwrap_or(0x5EED_F1A5_u64);
    println!("seed {seed}");
    let mut rng = Stream::from_seed_u64(seed);
    let disk = image(FORMAT_VERSION);
    let rec = RecordingDisk::new(disk.snapshot());
    let mut store = Store::open(Box::new(rec.clone())).expect("open");
    assert_eq!(store.format_version(), FORMAT_VERSION);
    // The first commit after an open flushes twice (why: `Store::open_keeping_orphans`).
    assert_eq!(write_and_commit(&mut store, &rec, "first", 1, &mut rng), 2, "first after open");
    // Two copies of each data block (`copies` 1 here: one), so MANIFEST_MAX_BLOCKS blocks fit.
    let small = 1 + rng.below(MANIFEST_MAX_BLOCKS as u64) as usize;
    assert_eq!(write_and_commit(&mut store, &rec, "small", small, &mut rng), 1, "{small} blocks");
    let big = MANIFEST_MAX_BLOCKS + 1 + rng.below(40) as usize;
    assert_eq!(write_and_commit(&mut store, &rec, "big", big, &mut rng), 2, "{big} blocks");
    assert_eq!(write_and_commit(&mut store, &rec, "after", 1, &mut rng), 1, "back to one flush");
    // What was committed reads back after a reopen of the image as it is on disk.
    drop(store);
    let mut again = Store::open(Box::new(MemDisk::from_bytes(rec.current()))).expect("reopen");
    for name in ["small", "big", "after"] {
        again.lookup(ROOT_INO, name.as_bytes()).expect("committed file");
    }
    assert!(fsck_bytes(rec.current()).is_clean());
}

#[test]
fn a_version_two_image_flushes_twice_until_upgraded_then_both_copies_are_version_three() {
    let mut rng = Stream::from_seed_u64(7);
    let disk = image(OLDEST_FORMAT_VERSION);
    assert_eq!((slot_version(&disk, 0), slot_version(&disk, 1)), (2, 2));
    let rec = RecordingDisk::new(disk.snapshot());
    let mut store = Store::open(Box::new(rec.clone())).expect("open a version-2 image");
    assert_eq!(store.format_version(), 2);
    assert_eq!(write_and_commit(&mut store, &rec, "before", 1, &mut rng), 2, "version 2: two flushes");
    assert!(store.upgrade_format().expect("upgrade"), "upgraded");
    assert!(!store.upgrade_format().expect("upgrade again"), "already upgraded");
    let now = MemDisk::from_bytes(rec.current());
    assert_eq!((slot_version(&now, 0), slot_version(&now, 1)), (3, 3), "no version-2 copy to fall back to");
    assert_eq!(write_and_commit(&mut store, &rec, "after", 1, &mut rng), 1, "version 3: one flush");
    drop(store);
    let report = fsck_bytes(rec.current());
    assert!(report.is_clean(), "{:?}", report.problems);
    let mut again = Store::open(Box::new(MemDisk::from_bytes(rec.current()))).expect("reopen");
    assert_eq!(again.format_version(), 3);
    for name in ["before", "after"] {
        again.lookup(ROOT_INO, name.as_bytes()).expect("file kept across the upgrade");
    }
}

#[test]
fn mkfs_refuses_a_format_it_cannot_write() {
    let disk = MemDisk::new(16 << 20);
    let opts = MkfsOptions { now: t(1), fsid: None, seed: None, meta_copies: 2 };
    for v in [1, FORMAT_VERSION + 1] {
        assert!(Store::mkfs_in_format(Box::new(disk.clone()), &opts, v).is_err(), "version {v}");
    }
}

/// The events after the last flush but one, up to the last: what a power cut
/// during the last commit's final flush may have lost.
fn last_window(events: &[Event]) -> std::ops::Range<usize> {
    let last = events.iter().rposition(|e| matches!(e, Event::Flush)).expect("the commit's flush");
    let durable = events[..last].iter().rposition(|e| matches!(e, Event::Flush)).map_or(0, |f| f + 1);
    durable..last
}

/// The image a crash leaves if, of what the last commit in `rec` wrote after its last
/// flush but one, only the writes `keep` says yes to landed.
fn crash_image(rec: &RecordingDisk, base: &[u8], keep: impl Fn(u64, &[u8]) -> bool) -> Vec<u8> {
    let events = rec.events();
    let window = last_window(&events);
    let durable = window.start;
    let survivors =
        window.filter(|&i| matches!(&events[i], Event::Write { offset, data } if keep(*offset, data))).collect();
    image_at(base, &events, &CrashPoint { durable, survivors })
}

fn is_superblock(offset: u64) -> bool {
    SUPERBLOCK_OFFSETS.contains(&offset) || SUPERBLOCK_MIRROR_OFFSETS.contains(&offset)
}

/// A fresh image (both copies at generation 1, nothing older held) and its recording,
/// which holds the first commit after an open (two flushes) and then directory "b"
/// committed with one flush.
fn b_committed_with_one_flush() -> (Vec<u8>, RecordingDisk) {
    let base = image(FORMAT_VERSION).snapshot();
    let rec = RecordingDisk::new(base.clone());
    let mut store = Store::open(Box::new(rec.clone())).expect("open");
    store.create(ROOT_INO, b"first", FileKind::Directory, 0o755, 0, 0, 0, t(3)).expect("mkdir");
    assert_eq!(flushes_during(&rec, || store.commit().expect("first commit")), 2, "first after open");
    store.create(ROOT_INO, b"b", FileKind::Directory, 0o755, 0, 0, 0, t(3)).expect("mkdir b");
    assert_eq!(flushes_during(&rec, || store.commit().expect("commit b")), 1);
    (base, rec)
}

fn names(store: &mut Store) -> Vec<String> {
    let mut out = Vec::new();
    for n in ["a", "b", "c"] {
        if store.lookup(ROOT_INO, n.as_bytes()).is_ok() {
            out.push(n.to_string());
        }
    }
    out
}

#[test]
fn a_commit_lost_after_one_cut_short_leaves_the_generation_before_both() {
    // "b" committed with one flush; the power fails with its superblock on disk but both
    // copies of one of its nodes lost: open must fall back to the generation before.
    let (base, rec) = b_committed_with_one_flush();
    let lost = rec.events().iter().rev().find_map(|e| match e {
        Event::Write { offset, data } if !is_superblock(*offset) => Some(data.clone()),
        _ => None,
    });
    let lost = lost.expect("a node write");
    let img1 = crash_image(&rec, &base, |off, data| is_superblock(off) || data != &lost[..]);
    let mut s1 = Store::open(Box::new(MemDisk::from_bytes(img1.clone()))).expect("open after the first crash");
    assert!(names(&mut s1).is_empty(), "the commit of b was cut short");
    drop(s1);
    // Again from that image: commit "c" — the same generation number, allocated the same
    // way, so its nodes land where b's did — and lose only its superblock writes.
    let rec2 = RecordingDisk::new(img1.clone());
    let mut store = Store::open(Box::new(rec2.clone())).expect("open");
    store.create(ROOT_INO, b"c", FileKind::Directory, 0o755, 0, 0, 0, t(4)).expect("mkdir c");
    store.commit().expect("commit c");
    drop(store);
    let img2 = crash_image(&rec2, &img1, |off, _| !is_superblock(off));
    let report = fsck_bytes(img2.clone());
    assert!(report.is_clean(), "{:?}", report.problems);
    let mut s2 = Store::open(Box::new(MemDisk::from_bytes(img2))).expect("open after the second crash");
    assert!(names(&mut s2).is_empty(), "neither b nor c was committed: {:?}", names(&mut s2));
}

#[test]
fn nodes_of_a_commit_whose_superblock_never_landed_are_not_taken_for_the_next_ones() {
    // Commit "b" with one flush; the power fails with its nodes on disk, its superblock
    // not. The next commit after reopening ("c") takes the same generation number and,
    // allocating the same way, the same blocks; the power fails again with its superblock
    // on disk and one of its nodes lost, where b's node of that generation still is.
    let (base, rec) = b_committed_with_one_flush();
    let img1 = crash_image(&rec, &base, |off, _| !is_superblock(off));
    let rec2 = RecordingDisk::new(img1.clone());
    let mut store = Store::open(Box::new(rec2.clone())).expect("open after the first crash");
    assert!(names(&mut store).is_empty());
    store.create(ROOT_INO, b"c", FileKind::Directory, 0o755, 0, 0, 0, t(4)).expect("mkdir c");
    store.commit().expect("commit c");
    drop(store);
    // Of what c's commit wrote after its last flush but one, lose each write in turn
    // (both copies of a node: the same bytes): never a tree that mixes b's nodes into c's.
    let events = rec2.events();
    let window: Vec<Vec<u8>> = events[last_window(&events)]
        .iter()
        .filter_map(|e| match e {
            Event::Write { data, .. } => Some(data.clone()),
            Event::Flush => None,
        })
        .collect();
    for lost in &window {
        let img2 = crash_image(&rec2, &img1, |_, data| data != &lost[..]);
        let report = fsck_bytes(img2.clone());
        assert!(report.is_clean(), "{:?}", report.problems);
        let disk2 = MemDisk::from_bytes(img2);
        let mut s2 = Store::open(Box::new(disk2.clone())).expect("open after the second crash");
        let got = names(&mut s2);
        assert!(got.is_empty() || got == ["c"], "a tree of both commits: {got:?}");
        drop(s2);
        let report = fsck_bytes(disk2.snapshot());
        assert!(report.is_clean(), "after reopening: {:?}", report.problems);
    }
}

/// A disk whose next flush fails once `fail` is set (every write lands, as in a page cache
/// that keeps serving what failed to go back to the device).
#[derive(Clone)]
struct FlushFails {
    inner: MemDisk,
    fail: std::sync::Arc<std::sync::atomic::AtomicBool>,
}

impl Disk for FlushFails {
    fn read_at(&self, offset: u64, buf: &mut [u8]) -> std::io::Result<()> {
        self.inner.read_at(offset, buf)
    }
    fn write_at(&mut self, offset: u64, buf: &[u8]) -> std::io::Result<()> {
        self.inner.write_at(offset, buf)
    }
    fn flush(&mut self) -> std::io::Result<()> {
        if self.fail.swap(false, std::sync::atomic::Ordering::SeqCst) {
            return Err(std::io::Error::other("injected: a block's write-back failed"));
        }
        self.inner.flush()
    }
    fn size_bytes(&self) -> u64 {
        self.inner.size_bytes()
    }
    fn reader(&self, offset: u64, len: usize) -> std::io::Result<Option<crest_store::SharedReader>> {
        self.inner.reader(offset, len)
    }
}

#[test]
fn a_one_flush_commit_whose_flush_fails_puts_the_last_good_superblock_back() {
    let disk = image(FORMAT_VERSION);
    let fail = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let mut store = Store::open(Box::new(FlushFails { inner: disk.clone(), fail: fail.clone() })).expect("open");
    store.create(ROOT_INO, b"a", FileKind::Directory, 0o755, 0, 0, 0, t(2)).expect("mkdir a");
    store.commit().expect("first commit after open (two flushes)");
    let good = store.generation();
    let ino = store.create(ROOT_INO, b"b", FileKind::Regular, 0o644, 0, 0, 0, t(3)).expect("create b").ino;
    store.write(ino, 0, &[5; 4096], t(3)).expect("write b");
    fail.store(true, std::sync::atomic::Ordering::SeqCst);
    assert!(store.commit().is_err(), "the commit's one flush failed");
    drop(store);
    // Every write of the failed commit is in the image (the page cache, until a reboot,
    // serves it so), yet it must not open as committed.
    let mut again = Store::open(Box::new(MemDisk::from_bytes(disk.snapshot()))).expect("reopen");
    assert_eq!(again.generation(), good, "the failed commit's superblock was left in place");
    assert!(again.lookup(ROOT_INO, b"b").is_err() && again.lookup(ROOT_INO, b"a").is_ok());
}
