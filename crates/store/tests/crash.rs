//! Crash safety under simulated power loss. A seeded workload runs on a `RecordingDisk`;
//! after each commit the test remembers the namespace. Then, for every flush in the log,
//! it rebuilds the image a power cut would leave — all writes up to that flush, plus each
//! of several subsets of the writes issued after it (none, all, all-but-one, random
//! subsets, and with one write torn at a sector boundary) — and checks that the image
//! opens, fsck is clean, and the namespace equals the one of the newest commit whose
//! superblock write survived (so everything a completed commit/fsync covered is there).
//!
//! The image keeps big writes' data in objects too (`fs/objects.rs`), in a bucket the test
//! holds: after each commit the collector's part runs (the gone list emptied, its objects
//! deleted at that point of the log), and a crash image is read with the bucket as it was
//! by the latest moment the crash can fall at — so an object deleted while a generation
//! that still references it could come back would fail the read.
//!
//! `CREST_CRASH_SEEDS=N` runs N workload seeds instead of the default few; CI's count is
//! printed at the end of the test.

mod common;
use common::*;
use crest_rng::Stream;
use crest_store::crash::{image_at, CrashPoint, Event, FailingDisk, RecordingDisk};
use crest_store::fs::objects::ObjectSource;
use crest_store::limits::{SUPERBLOCK_MIRROR_OFFSETS, SUPERBLOCK_OFFSETS};
use crest_store::{Error, FileKind, MemDisk, RenameFlags, SetAttr, Store, ROOT_INO};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};

const IMAGE_MIB: u64 = 8;

/// Object id → its bytes, and the event index at which the collector deleted it, if it did.
type Uploaded = HashMap<u64, (Vec<u8>, Option<usize>)>;

/// The bucket: every object uploaded.
#[derive(Clone, Default)]
struct Bucket(Arc<Mutex<Uploaded>>);

/// The bucket as a store reads it at a moment of the log: objects deleted by then are gone.
struct BucketAt {
    bucket: Bucket,
    at: usize,
}

impl ObjectSource for BucketAt {
    fn read(&mut self, id: u64, offset: u64, len: usize) -> std::io::Result<Vec<u8>> {
        let map = self.bucket.0.lock().expect("bucket");
        match map.get(&id) {
            Some((data, deleted)) if deleted.is_none_or(|d| d > self.at) => {
                let at = offset as usize;
                data.get(at..at + len).map(<[u8]>::to_vec).ok_or_else(|| std::io::Error::other("short object"))
            }
            _ => Err(std::io::Error::other(format!("object {id} was deleted but is still referenced"))),
        }
    }
}

/// An image of `IMAGE_MIB` that keeps big writes in objects.
fn fresh_with_objects() -> MemDisk {
    let disk = fresh(IMAGE_MIB);
    let mut s = open(&disk);
    s.set_data_store("s3://crash-test").expect("data store");
    s.commit().expect("commit");
    disk
}

/// Writes `data` at block `block` of `ino` as a new object (what a mount's big write does).
fn write_object(store: &mut Store, bucket: &Bucket, ino: u64, block: u64, data: &[u8]) {
    let id = store.grant_objects(1, 1).expect("grant")[0];
    let mut padded = data.to_vec();
    padded.resize(data.len().div_ceil(4096) * 4096, 0);
    let csums = crest_store::checksum::block_sums(&padded);
    bucket.0.lock().expect("bucket").insert(id, (padded, None));
    store.map_object(1, ino, block * 4096, data.len() as u64, id, &csums, t(100)).expect("map object");
}

/// The collector's part after a commit: what the gone list names is deleted at `at`.
fn collect(store: &mut Store, bucket: &Bucket, at: usize) {
    let ids = store.gone_objects(usize::MAX).expect("gone");
    {
        let mut map = bucket.0.lock().expect("bucket");
        for id in &ids {
            if let Some(o) = map.get_mut(id) {
                o.1.get_or_insert(at);
            }
        }
    }
    store.objects_deleted(&ids).expect("deleted");
}

/// Runs a random workload; returns the dumps after each commit with the event count at
/// which that commit's superblock write was issued.
/// `on_commit(store, receiving)` after each commit; `receiving`: a receive is under way,
/// so what `open` makes of this commit is the namespace before it (it undoes the receive).
/// `collect(store)` runs the collector's part before the commits the workload asks for
/// (so the commits other operations make inside themselves find nothing it dirtied).
fn workload(
    store: &mut Store,
    rng: &mut Stream,
    ops: usize,
    bucket: &Bucket,
    mut collect: impl FnMut(&mut Store),
    mut on_commit: impl FnMut(&mut Store, bool),
) {
    let now = t(100);
    let mut files: Vec<(u64, Vec<u8>)> = Vec::new(); // (dir, name)
    let mut dirs = vec![ROOT_INO];
    let mut open: Vec<u64> = Vec::new();
    let mut datasets: Vec<String> = Vec::new();
    let mut snapshots: Vec<String> = Vec::new();
    for i in 0..ops {
        let dir = dirs[rng.below(dirs.len() as u64) as usize];
        match rng.below(17) {
            0..=3 => {
                let name = format!("f{i}").into_bytes();
                if let Ok(inode) = store.create(dir, &name, FileKind::Regular, 0o644, 1, 1, 0, now) {
                    let len = [10, 700, 5000, 70_000][rng.below(4) as usize];
                    let data: Vec<u8> = (0..len).map(|j| (j as u8) ^ (i as u8)).collect();
                    store.write(inode.ino, 0, &data, now).expect("write");
                    files.push((dir, name));
                }
            }
            4 => {
                let name = format!("d{i}").into_bytes();
                if let Ok(d) = store.create(dir, &name, FileKind::Directory, 0o755, 0, 0, 0, now) {
                    dirs.push(d.ino);
                }
            }
            5 if !files.is_empty() => {
                let (d, n) = files.swap_remove(rng.below(files.len() as u64) as usize);
                store.unlink(d, &n, now).expect("unlink");
            }
            6 if !files.is_empty() => {
                let k = rng.below(files.len() as u64) as usize;
                let (d, n) = files[k].clone();
                let new = format!("r{i}").into_bytes();
                store.rename(d, &n, dir, &new, RenameFlags::default(), now).expect("rename");
                files[k] = (dir, new);
            }
            7 if !files.is_empty() => {
                let (d, n) = &files[rng.below(files.len() as u64) as usize];
                let ino = store.lookup(*d, n).expect("lookup").ino;
                let off = rng.below(80_000);
                store.write(ino, off, &vec![i as u8; 1 + rng.below(9000) as usize], now).expect("overwrite");
            }
            8 if !files.is_empty() => {
                let (d, n) = &files[rng.below(files.len() as u64) as usize];
                let ino = store.lookup(*d, n).expect("lookup").ino;
                store
                    .setattr(ino, &SetAttr { size: Some(rng.below(20_000)), ..Default::default() }, now)
                    .expect("truncate");
                // Small, just out of line, several chunks, the largest; or gone: power cuts
                // land inside big xattr changes (chunks written, replaced, deleted).
                let name = format!("user.k{}", rng.below(3)).into_bytes();
                match [40, 1785, 5000, 65_536, 0][rng.below(5) as usize] {
                    0 => match store.removexattr(ino, &name, now) {
                        Ok(()) | Err(Error::NoXattr(_)) => {}
                        Err(e) => panic!("removexattr: {e}"),
                    },
                    len => {
                        let value: Vec<u8> = (0..len).map(|j| (j as u8) ^ (j >> 8) as u8 ^ (i as u8)).collect();
                        store.setxattr(ino, &name, &value, now).expect("setxattr");
                    }
                }
            }
            9 if !files.is_empty() => {
                // Open, unlink: an orphan that a crash leaves for the next open to reclaim.
                let (d, n) = files.swap_remove(rng.below(files.len() as u64) as usize);
                let ino = store.lookup(d, &n).expect("lookup").ino;
                store.open_handle(ino).expect("open");
                store.unlink(d, &n, now).expect("unlink open file");
                open.push(ino);
            }
            10 if !open.is_empty() => {
                store.release_handle(open.swap_remove(0)).expect("release");
            }
            11 => {
                // A dataset with a file and a directory: power cuts land in its creation
                // and in the commits that carry its tree beside the default one's.
                // Every other one keeps two copies of its data.
                let name = format!("ds{i}");
                let mut props = crest_nvlist::NvList::new();
                if rng.below(2) == 0 {
                    props.add("copies", crest_nvlist::Value::U64(2)).expect("copies");
                }
                let d = store.create_dataset(&name, props, (0, 0, 0o755), now).expect("create dataset");
                let root = crest_store::datasets::root_of(d);
                let f = store.create(root, b"f", FileKind::Regular, 0o644, 0, 0, 0, now).expect("create in dataset");
                store.write(f.ino, 0, &vec![i as u8; [300, 9000][rng.below(2) as usize]], now).expect("write");
                store.create(root, b"d", FileKind::Directory, 0o755, 0, 0, 0, now).expect("mkdir in dataset");
                datasets.push(name);
            }
            13 => {
                // A snapshot of the default dataset, or one destroyed: a crash keeps the
                // snapshot whole or not at all, and never loses a block it holds.
                if !snapshots.is_empty() && rng.below(2) == 0 {
                    let name = snapshots.swap_remove(rng.below(snapshots.len() as u64) as usize);
                    store.destroy_snapshot(&name).expect("destroy snapshot");
                } else {
                    store.commit().expect("commit");
                    on_commit(store, false);
                    let name = format!("default@s{i}");
                    store.create_snapshots(std::slice::from_ref(&name)).expect("snapshot");
                    snapshots.push(name);
                }
            }
            14 if !snapshots.is_empty() && 3 * store.dataset_used_blocks(0) + 200 < store.statfs().avail_blocks => {
                // A snapshot sent and received into a new dataset of the same image: a
                // crash before the received snapshot's commit leaves no trace of it (open
                // undoes the receive), after it the whole dataset; a cut stream, nothing.
                store.commit().expect("commit");
                on_commit(store, false);
                let snap = snapshots[rng.below(snapshots.len() as u64) as usize].clone();
                let mut stream = Vec::new();
                let mut cursor = Vec::new();
                loop {
                    let c = store.send_chunk(&snap, None, &cursor, 1 << 16).expect("send");
                    stream.extend_from_slice(&c.data);
                    cursor = c.cursor;
                    if c.done {
                        break;
                    }
                }
                let cut = rng.below(3) == 0;
                if cut {
                    stream.truncate(rng.below(stream.len() as u64) as usize);
                }
                let target = format!("r{i}");
                let mut r = store.receive_start(&target, false, now).expect("receive");
                store.receive_feed(&mut r, &stream).expect("feed");
                store.commit().expect("commit");
                on_commit(store, true);
                if cut {
                    assert!(store.receive_finish(&mut r).is_err(), "a cut stream finished");
                    store.receive_abort(r).expect("abort");
                } else {
                    store.receive_finish(&mut r).expect("finish");
                    let _ = target; // (kept: a dataset with a snapshot is not destroyed by op 12)
                }
                store.commit().expect("commit");
                on_commit(store, false);
            }
            12 if !datasets.is_empty() => {
                // Destroyed in one transaction: a crash keeps all of it or none.
                let name = datasets.swap_remove(rng.below(datasets.len() as u64) as usize);
                store.commit().expect("commit");
                on_commit(store, false);
                store.destroy_dataset(&name).expect("destroy dataset");
            }
            15 if !files.is_empty() => {
                // A big write as an object, aligned; one whose last block is partial runs
                // to the file's end. The objects it covers lose those blocks.
                let (d, n) = &files[rng.below(files.len() as u64) as usize];
                let inode = store.lookup(*d, n).expect("lookup");
                let block = rng.below(inode.size / 4096 + 4);
                let mut len = 4096 * (1 + rng.below(24));
                let cut = 1 + rng.below(4000);
                if block * 4096 + len - cut >= inode.size && rng.below(2) == 0 {
                    len -= cut;
                }
                let data: Vec<u8> = (0..len).map(|j| (j as u8).wrapping_mul(7) ^ (i as u8)).collect();
                write_object(store, bucket, inode.ino, block, &data);
            }
            _ => {
                collect(store);
                store.commit().expect("commit");
                on_commit(store, false);
            }
        }
    }
    store.commit().expect("final commit");
    on_commit(store, false);
}

struct Recorded {
    base: Vec<u8>,
    events: Vec<Event>,
    /// (event indexes of the commit's superblock writes — its slot and the slot's mirror —
    /// namespace after the commit): the commit is on disk once either landed.
    commits: Vec<(Vec<usize>, Dump)>,
    initial: Dump,
    bucket: Bucket,
}

fn record(seed: u64, ops: usize) -> Recorded {
    let disk = fresh_with_objects();
    let base = disk.snapshot();
    let initial = dump(&mut open(&disk));
    let rec = RecordingDisk::new(base.clone());
    let mut store = Store::open(Box::new(rec.clone())).expect("open");
    let bucket = Bucket::default();
    store.set_object_source(Box::new(BucketAt { bucket: bucket.clone(), at: usize::MAX }));
    let mut rng = Stream::from_seed_u64(seed);
    let mut commits = Vec::new();
    let mut last_gen = store.generation();
    let (gc_bucket, gc_rec) = (bucket.clone(), rec.clone());
    let gc = move |s: &mut Store| collect(s, &gc_bucket, gc_rec.events().len());
    workload(&mut store, &mut rng, ops, &bucket.clone(), gc, |s, receiving| {
        if s.generation() != last_gen {
            last_gen = s.generation();
            let events = rec.events();
            let sb_writes: Vec<usize> = [SUPERBLOCK_OFFSETS, SUPERBLOCK_MIRROR_OFFSETS]
                .iter()
                .filter_map(|slots| {
                    events.iter().rposition(|e| matches!(e, Event::Write { offset, .. } if slots.contains(offset)))
                })
                .collect();
            assert_eq!(sb_writes.len(), 2, "a commit writes a superblock and its mirror");
            let namespace = match (receiving, commits.last()) {
                (true, Some((_, before))) => Dump::clone(before),
                _ => dump(s),
            };
            commits.push((sb_writes, namespace));
        }
    });
    // Commits made inside operations (space pressure) are not tracked: the workload is
    // sized so that none happen, which this checks.
    assert_eq!(store.stats().commits as usize, commits.len(), "seed {seed}: unexpected implicit commits");
    Recorded { base, events: rec.events(), commits, initial, bucket }
}

/// Checks one crash point; returns an error message instead of panicking so the caller
/// can print the seed and point.
fn check_point(r: &Recorded, point: &CrashPoint, tear: Option<(usize, usize)>) -> Result<(), String> {
    let mut img = image_at(&r.base, &r.events, point);
    let mut torn_counts_as_written = true;
    if let Some((idx, keep)) = tear {
        // Write `idx` made it only partly: its first `keep` bytes are new, the rest old.
        if let Event::Write { offset, data } = &r.events[idx] {
            let (s, e) = (*offset as usize + keep, *offset as usize + data.len());
            let old = image_at(
                &r.base,
                &r.events,
                &CrashPoint {
                    durable: point.durable,
                    survivors: point.survivors.iter().copied().filter(|&i| i != idx).collect(),
                },
            );
            img[s..e].copy_from_slice(&old[s..e]);
            // A tear whose lost tail equals the old bytes wrote everything after all.
            torn_counts_as_written = img[*offset as usize..e] == data[..];
        }
    }
    let applied = |i: usize| {
        i < point.durable
            || (point.survivors.contains(&i) && (torn_counts_as_written || tear.is_none_or(|(t, _)| t != i)))
    };
    let newest = r.commits.iter().rposition(|(sb, _)| sb.iter().any(|&w| applied(w)));
    // A commit made with one flush (no flush between its writes and its superblock's)
    // counts only if every write since the flush before it is on disk as written: else
    // open must fall back to the commit before, which that flush made durable.
    let newest =
        newest.and_then(|i| if one_flush_commit_landed(r, &r.commits[i].0, &img) { Some(i) } else { i.checked_sub(1) });
    let expected = newest.map_or(&r.initial, |i| &r.commits[i].1);
    let report = fsck_bytes(img.clone());
    if !report.is_clean() {
        return Err(format!("fsck: {:?}", report.problems));
    }
    let disk = MemDisk::from_bytes(img);
    let mut store = Store::open(Box::new(disk.clone())).map_err(|e| format!("open: {e}"))?;
    // The latest the crash can fall at: just before the flush after the durable ones.
    let at = (point.durable..r.events.len()).find(|&i| matches!(r.events[i], Event::Flush)).unwrap_or(r.events.len());
    store.set_object_source(Box::new(BucketAt { bucket: r.bucket.clone(), at }));
    let got = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| dump(&mut store)))
        .map_err(|e| format!("reading the crash image: {:?}", e.downcast_ref::<String>()))?;
    if &got != expected {
        let result = std::panic::catch_unwind(|| assert_same(&got, expected, "crash image"));
        return Err(format!("{:?}", result.err().and_then(|e| e.downcast_ref::<String>().cloned())));
    }
    drop(store);
    // Opening reclaimed orphans and committed: still clean.
    let report = fsck_bytes(disk.snapshot());
    if !report.is_clean() {
        return Err(format!("fsck after reopen: {:?}", report.problems));
    }
    Ok(())
}

/// Whether the commit whose superblock writes are `sb` is whole in `img`: a commit made
/// with two flushes is (its other writes were durable before its superblock's); one made
/// with one flush is when every write since the flush before it holds what was written.
fn one_flush_commit_landed(r: &Recorded, sb: &[usize], img: &[u8]) -> bool {
    let first_sb = sb.iter().copied().min().unwrap_or(0);
    let Some(start) = r.events[..first_sb].iter().rposition(|e| matches!(e, Event::Flush)).map(|f| f + 1).or(Some(0))
    else {
        return true;
    };
    if start == first_sb {
        return true;
    }
    let is_sb = |off: u64| SUPERBLOCK_OFFSETS.contains(&off) || SUPERBLOCK_MIRROR_OFFSETS.contains(&off);
    let writes: Vec<(u64, &Vec<u8>)> = r.events[start..first_sb]
        .iter()
        .filter_map(|e| match e {
            Event::Write { offset, data } if !is_sb(*offset) => Some((*offset, data)),
            _ => None,
        })
        .collect();
    let landed = |off: u64, data: &[u8]| img[off as usize..off as usize + data.len()] == data[..];
    writes.iter().enumerate().all(|(i, (off, data))| {
        let (s, e) = (*off as usize, *off as usize + data.len());
        // (Only the last write to a place must be there.)
        let overwritten = writes[i + 1..].iter().any(|(o, d)| (*o as usize) < e && s < *o as usize + d.len());
        // A node's two copies are the same bytes, its header naming the first copy's block:
        // one good copy is enough (open rewrites the other). Each data block must be there.
        let copies: Vec<&(u64, &Vec<u8>)> = writes.iter().filter(|(_, d)| *d == *data).collect();
        let node = data.len() >= 56
            && copies.iter().any(|(o, _)| {
                u64::from_le_bytes(data[48..56].try_into().unwrap_or_default()).checked_mul(4096) == Some(*o)
            });
        overwritten || landed(*off, data) || (node && copies.iter().any(|(o, d)| landed(*o, d)))
    })
}

fn crash_points(r: &Recorded, rng: &mut Stream, thorough: bool) -> Vec<(CrashPoint, Option<(usize, usize)>)> {
    let mut out = Vec::new();
    let mut durable = 0;
    let n = r.events.len();
    while durable < n {
        let next_flush = (durable..n).find(|&i| matches!(r.events[i], Event::Flush)).unwrap_or(n);
        let window: Vec<usize> =
            (durable..next_flush).filter(|&i| matches!(r.events[i], Event::Write { .. })).collect();
        let mut add = |survivors: Vec<usize>, tear| out.push((CrashPoint { durable, survivors }, tear));
        add(Vec::new(), None);
        if !window.is_empty() {
            add(window.clone(), None);
            let singles = if thorough { window.len() } else { window.len().min(4) };
            for k in 0..singles {
                let drop = if thorough { window[k] } else { window[rng.below(window.len() as u64) as usize] };
                add(window.iter().copied().filter(|&i| i != drop).collect(), None);
            }
            for _ in 0..if thorough { 16 } else { 3 } {
                add(window.iter().copied().filter(|_| rng.below(2) == 0).collect(), None);
            }
            for _ in 0..if thorough { 4 } else { 1 } {
                let victim = window[rng.below(window.len() as u64) as usize];
                let len = match &r.events[victim] {
                    Event::Write { data, .. } => data.len(),
                    Event::Flush => 0,
                };
                let keep = 512 * rng.below((len / 512) as u64) as usize;
                add(window.clone(), Some((victim, keep)));
            }
        }
        durable = next_flush + 1;
    }
    out
}

fn run_seed(seed: u64, ops: usize, thorough: bool) -> usize {
    let r = record(seed, ops);
    let mut rng = Stream::from_seed_u64(seed ^ 0xC0FFEE);
    let points = crash_points(&r, &mut rng, thorough);
    for (i, (p, tear)) in points.iter().enumerate() {
        if let Err(e) = check_point(&r, p, *tear) {
            panic!(
                "seed {seed} crash point {i} (durable {} events, {} survivors, tear {tear:?}): {e}",
                p.durable,
                p.survivors.len()
            );
        }
    }
    points.len()
}

#[test]
fn every_crash_point_recovers_to_a_committed_state() {
    let seeds: u64 = std::env::var("CREST_CRASH_SEEDS").ok().and_then(|s| s.parse().ok()).unwrap_or(16);
    let thorough = std::env::var("CREST_CRASH_THOROUGH").is_ok();
    let mut total = 0;
    for seed in 0..seeds {
        total += run_seed(seed, 120, thorough);
    }
    println!("crash points checked: {total} ({seeds} seeds)");
    assert!(total > 500, "only {total} crash points");
}

#[test]
fn an_io_failure_poisons_the_store_and_reopen_recovers() {
    // Fail at many points of the same workload; after the failure every write is refused,
    // and the image on disk opens to a committed state with fsck clean.
    for countdown in (5..400).step_by(13) {
        let disk = fresh_with_objects();
        let failing = FailingDisk::new(disk.clone(), countdown);
        let mut store = Store::open(Box::new(failing)).expect("open");
        let bucket = Bucket::default();
        store.set_object_source(Box::new(BucketAt { bucket: bucket.clone(), at: usize::MAX }));
        let mut rng = Stream::from_seed_u64(countdown);
        let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            workload(&mut store, &mut rng, 80, &bucket, |_| {}, |_, _| {})
        }));
        if result.is_ok() {
            continue; // the workload finished before the countdown
        }
        let e = store.create(ROOT_INO, b"after", FileKind::Regular, 0o644, 0, 0, 0, t(1)).err();
        assert!(matches!(e, Some(Error::Poisoned(_))), "countdown {countdown}: {e:?}");
        assert!(matches!(store.commit(), Err(Error::Poisoned(_))));
        drop(store);
        assert_clean(&disk);
        let mut s = open(&disk);
        s.set_object_source(Box::new(BucketAt { bucket, at: usize::MAX }));
        dump(&mut s);
    }
}
