//! Send and receive: a snapshot sent (whole, or as what changed since an older one) and
//! received into another image gives a dataset and a snapshot equal to the source's in
//! everything a user sees — names, readdir order, types, modes, owners, sizes, times,
//! link counts, device numbers, contents (holes included), xattrs (chunked ones too).
//! A damaged, cut-short or misapplied stream is refused and leaves the target exactly as
//! it was, also across a crash in the middle of the receive.
//!
//! How. A seeded random tree (`CREST_SEND_SEED`, printed; `CREST_SEND_ROUNDS`
//! incrementals) is built in one image, snapshotted, changed at random (overwrites at
//! odd offsets, truncates both ways, punched holes, renames over files, unlinks, rmdirs,
//! hard links, xattr rewrites of the same length, new files) and snapshotted again; the
//! streams are cut into calls of random budgets and fed to the receiver in random pieces.

mod common;
use common::*;

use std::collections::BTreeMap;

use crest_nvlist::NvList;
use crest_rng::Stream;
use crest_store::datasets::root_of;
use crest_store::{FallocateMode, FileKind, MemDisk, RenameFlags, SetAttr, Store, Timespec};

fn seed() -> u64 {
    let seed = std::env::var("CREST_SEND_SEED").ok().and_then(|s| s.parse().ok()).unwrap_or_else(crest_rng::next_u64);
    println!("CREST_SEND_SEED={seed}");
    seed
}

fn rounds() -> usize {
    std::env::var("CREST_SEND_ROUNDS").ok().and_then(|s| s.parse().ok()).unwrap_or(3)
}

/// Everything `Entry` has plus times, device number and readdir position.
type Full = BTreeMap<String, (Entry, [Timespec; 3], u64, u64)>;

fn full_dump(s: &mut Store, name: &str) -> Full {
    let d = s.dataset(name).expect("dataset").id;
    let origin = s.origin_of(d);
    s.set_view((origin != d).then_some(d));
    let root = root_of(origin);
    let plain = dump_from(s, root);
    let mut out = BTreeMap::new();
    let mut stack = vec![(root, String::new())];
    while let Some((dir, path)) = stack.pop() {
        for (e, i) in s.readdir(dir, 0, 100_000).expect("readdir") {
            let p = format!("{path}/{}", String::from_utf8_lossy(&e.name));
            if i.kind == FileKind::Directory {
                stack.push((i.ino, p.clone()));
            }
            let entry = plain.get(&p).expect("dumped").clone();
            out.insert(p, (entry, [i.atime, i.mtime, i.ctime], i.rdev, e.index));
        }
    }
    let r = s.getattr(root).expect("root");
    let root_entry = Entry {
        kind: r.kind,
        mode: r.mode,
        uid: r.uid,
        gid: r.gid,
        size: 0,
        nlink: r.nlink,
        content: Vec::new(),
        xattrs: BTreeMap::new(),
    };
    out.insert("/".into(), (root_entry, [r.atime, r.mtime, r.ctime], 0, 0));
    s.set_view(None);
    out
}

fn assert_equal(got: &Full, want: &Full, context: &str) {
    if got == want {
        return;
    }
    let mut diffs = Vec::new();
    for (p, w) in want {
        match got.get(p) {
            None => diffs.push(format!("missing {p}")),
            Some(g) if g != w => diffs.push(format!("{p}:\n  got  {g:?}\n  want {w:?}")),
            _ => {}
        }
    }
    diffs.extend(got.keys().filter(|p| !want.contains_key(*p)).map(|p| format!("extra {p}")));
    diffs.truncate(8);
    panic!("{context}: trees differ:\n{}", diffs.join("\n"));
}

/// Sends `snap` (from `base`) in calls of random budgets; the whole stream.
fn send(s: &mut Store, snap: &str, base: Option<&str>, rng: &mut Stream) -> Vec<u8> {
    let mut cursor = Vec::new();
    let mut out = Vec::new();
    loop {
        let budget = [1, 4096, 70_000, 1 << 20, 3 << 20][rng.below(5) as usize];
        let c = s.send_chunk(snap, base, &cursor, budget).expect("send");
        out.extend_from_slice(&c.data);
        cursor = c.cursor;
        if c.done {
            return out;
        }
    }
}

/// Receives `stream` into `target` in random pieces; the snapshot made, or the error
/// (after undoing the receive, as the server does).
fn receive(s: &mut Store, target: &str, stream: &[u8], force: bool, rng: &mut Stream) -> Result<String, String> {
    let mut r = s.receive_start(target, force, t(50)).map_err(|e| e.to_string())?;
    let mut at = 0;
    let mut result = Ok(());
    while at < stream.len() && result.is_ok() {
        let scale = [10, 5000, 2 << 20][rng.below(3) as usize];
        let n = (1 + rng.below(scale) as usize).min(stream.len() - at);
        result = s.receive_feed(&mut r, &stream[at..at + n]);
        at += n;
    }
    match result.and_then(|()| s.receive_finish(&mut r)) {
        Ok(name) => {
            s.commit().expect("commit");
            Ok(name)
        }
        Err(e) => {
            s.receive_abort(r).expect("abort");
            s.commit().expect("commit");
            Err(e.to_string())
        }
    }
}

fn pick(rng: &mut Stream, v: &[u64]) -> Option<u64> {
    (!v.is_empty()).then(|| v[rng.below(v.len() as u64) as usize])
}

/// Random bytes of random length: empty, inline, a few blocks, or sparse megabytes.
fn write_random(s: &mut Store, ino: u64, rng: &mut Stream) {
    let n = [0u64, 1, 700, 1024, 1025, 4096, 9000, 70_000][rng.below(8) as usize];
    let off = if rng.below(4) == 0 { rng.below(3 << 20) } else { rng.below(5000) };
    let mut data = vec![0u8; n as usize];
    rng.fill_bytes(&mut data);
    if n > 0 {
        s.write(ino, off, &data, t(10 + rng.below(100) as i64)).expect("write");
    }
}

/// Live objects a test keeps track of.
#[derive(Default)]
struct Objects {
    dirs: Vec<u64>,
    files: Vec<u64>,
}

fn populate(s: &mut Store, root: u64, rng: &mut Stream, n: usize, o: &mut Objects) {
    if o.dirs.is_empty() {
        o.dirs.push(root);
    }
    for i in 0..n {
        let dir = pick(rng, &o.dirs).unwrap_or(root);
        let name = format!("n{}-{i}", rng.below(1_000_000));
        let now = t(5 + rng.below(50) as i64);
        match rng.below(10) {
            0 | 1 => {
                if let Ok(d) = s.create(dir, name.as_bytes(), FileKind::Directory, 0o750, 3, 4, 0, now) {
                    o.dirs.push(d.ino);
                }
            }
            2 => {
                let target = vec![b'x'; 1 + rng.below(300) as usize];
                let _ = s.symlink(dir, name.as_bytes(), &target, 1, 1, now);
            }
            3 => {
                let (kind, rdev) = if rng.below(2) == 0 { (FileKind::CharDevice, 0x0103) } else { (FileKind::Fifo, 0) };
                let _ = s.create(dir, name.as_bytes(), kind, 0o600, 0, 0, rdev, now);
            }
            4 => {
                if let Some(f) = pick(rng, &o.files) {
                    let _ = s.link(f, dir, name.as_bytes(), now);
                }
            }
            _ => {
                if let Ok(f) = s.create(dir, name.as_bytes(), FileKind::Regular, 0o644, 7, 8, 0, now) {
                    o.files.push(f.ino);
                    write_random(s, f.ino, rng);
                    set_xattr(s, f.ino, rng);
                }
            }
        }
    }
}

fn set_xattr(s: &mut Store, ino: u64, rng: &mut Stream) {
    let len = [0usize, 10, 1500, 5000][rng.below(4) as usize];
    let mut v = vec![0u8; len];
    rng.fill_bytes(&mut v);
    let name = format!("user.k{}", rng.below(3));
    let _ = s.setxattr(ino, name.as_bytes(), &v, t(20));
}

/// Random changes of every kind the stream must carry.
fn mutate(s: &mut Store, rng: &mut Stream, n: usize, o: &mut Objects) {
    let root = o.dirs[0];
    for _ in 0..n {
        let now = t(100 + rng.below(100) as i64);
        let Some(f) = pick(rng, &o.files) else { break };
        if s.getattr(f).map(|i| i.nlink == 0).unwrap_or(true) {
            o.files.retain(|&x| x != f);
            continue;
        }
        match rng.below(12) {
            0 | 1 => write_random(s, f, rng),
            2 => {
                let size = [0, 100, 1024, 4095, 4097, 1 << 20][rng.below(6) as usize];
                let _ = s.setattr(f, &SetAttr { size: Some(size), ..Default::default() }, now);
            }
            3 => {
                let mode = FallocateMode { keep_size: true, punch_hole: true, zero_range: false };
                let _ = s.fallocate(f, rng.below(20_000), 1 + rng.below(70_000), mode, now);
            }
            4 => {
                // Same length, other bytes: the chunks change, not the record.
                let names = s.listxattr(f).unwrap_or_default();
                if let Some(name) = names.first() {
                    let mut v = s.getxattr(f, name).unwrap_or_default();
                    rng.fill_bytes(&mut v);
                    let _ = s.setxattr(f, name, &v, now);
                }
            }
            5 => {
                if let Some(name) = s.listxattr(f).unwrap_or_default().first() {
                    let _ = s.removexattr(f, name, now);
                }
            }
            6 => set_xattr(s, f, rng),
            7 => {
                let mode =
                    SetAttr { mode: Some(0o600 | rng.below(0o77) as u32), mtime: Some(now), ..Default::default() };
                let _ = s.setattr(f, &mode, now);
            }
            8 => unlink_some(s, rng, o, now),
            9 => rename_some(s, rng, o, now),
            10 => populate(s, root, rng, 3, o),
            _ => {
                let dir = pick(rng, &o.dirs).unwrap_or(root);
                if dir != root {
                    if let Ok(parent) = s.getattr(dir).map(|i| i.parent) {
                        let names: Vec<Vec<u8>> = s
                            .readdir(parent, 0, 100_000)
                            .unwrap_or_default()
                            .into_iter()
                            .filter(|(e, _)| e.ino == dir)
                            .map(|(e, _)| e.name)
                            .collect();
                        if let Some(n) = names.first() {
                            if s.rmdir(parent, n, now).is_ok() {
                                o.dirs.retain(|&x| x != dir);
                            }
                        }
                    }
                }
            }
        }
    }
}

fn entries(s: &mut Store, dir: u64) -> Vec<(Vec<u8>, u64, FileKind)> {
    s.readdir(dir, 0, 100_000).unwrap_or_default().into_iter().map(|(e, i)| (e.name, i.ino, i.kind)).collect()
}

fn unlink_some(s: &mut Store, rng: &mut Stream, o: &mut Objects, now: Timespec) {
    let dir = pick(rng, &o.dirs).unwrap_or(o.dirs[0]);
    let es: Vec<_> = entries(s, dir).into_iter().filter(|e| e.2 != FileKind::Directory).collect();
    if !es.is_empty() {
        let (name, _, _) = &es[rng.below(es.len() as u64) as usize];
        let _ = s.unlink(dir, name, now);
    }
}

fn rename_some(s: &mut Store, rng: &mut Stream, o: &mut Objects, now: Timespec) {
    let from = pick(rng, &o.dirs).unwrap_or(o.dirs[0]);
    let to = pick(rng, &o.dirs).unwrap_or(o.dirs[0]);
    let es: Vec<_> = entries(s, from).into_iter().filter(|e| e.2 != FileKind::Directory).collect();
    if es.is_empty() {
        return;
    }
    let (name, _, _) = es[rng.below(es.len() as u64) as usize].clone();
    // Over an existing file half the time.
    let over: Vec<_> = entries(s, to).into_iter().filter(|e| e.2 == FileKind::Regular).collect();
    let new = match (rng.below(2), over.first()) {
        (0, Some(e)) => e.0.clone(),
        _ => format!("r{}", rng.below(1_000_000)).into_bytes(),
    };
    let _ = s.rename(from, &name, to, &new, RenameFlags::default(), now);
}

struct Pair {
    src: MemDisk,
    dst: MemDisk,
    s: Store,
    d: Store,
}

fn pair() -> Pair {
    let (src, dst) = (fresh(96), fresh(96));
    let (s, d) = (open(&src), open(&dst));
    Pair { src, dst, s, d }
}

#[test]
fn full_and_incremental_streams_rebuild_the_snapshots_exactly() {
    let mut rng = Stream::from_seed_u64(seed());
    let mut p = pair();
    let a = p.s.create_dataset("a", NvList::new(), (0, 0, 0o755), t(2)).expect("dataset");
    let mut o = Objects::default();
    populate(&mut p.s, root_of(a), &mut rng, 150, &mut o);
    p.s.create_snapshots(&["a@s0".into()]).expect("snapshot");
    let stream = send(&mut p.s, "a@s0", None, &mut rng);
    let made = receive(&mut p.d, "b", &stream, false, &mut rng).expect("receive");
    assert_eq!(made, "b@s0");
    let want = full_dump(&mut p.s, "a@s0");
    assert_equal(&full_dump(&mut p.d, "b@s0"), &want, "full: snapshot");
    assert_equal(&full_dump(&mut p.d, "b"), &want, "full: dataset");
    assert_clean(&p.dst);
    for round in 1..=rounds() {
        mutate(&mut p.s, &mut rng, 60, &mut o);
        let (snap, base) = (format!("a@s{round}"), format!("a@s{}", round - 1));
        p.s.create_snapshots(std::slice::from_ref(&snap)).expect("snapshot");
        let stream = send(&mut p.s, &snap, Some(&base), &mut rng);
        let made = receive(&mut p.d, "b", &stream, false, &mut rng).expect("incremental receive");
        assert_eq!(made, format!("b@s{round}"));
        let want = full_dump(&mut p.s, &snap);
        assert_equal(&full_dump(&mut p.d, &made), &want, &format!("round {round}: snapshot"));
        assert_equal(&full_dump(&mut p.d, "b"), &want, &format!("round {round}: dataset"));
        // The base is kept as it was.
        assert_equal(&full_dump(&mut p.d, &format!("b@s{}", round - 1)), &full_dump(&mut p.s, &base), "base");
        assert_clean(&p.dst);
        // A full stream of the same snapshot gives the same tree as the chain.
        let again = send(&mut p.s, &snap, None, &mut rng);
        let name = format!("c{round}");
        receive(&mut p.d, &name, &again, false, &mut rng).expect("full receive");
        assert_equal(&full_dump(&mut p.d, &name), &want, &format!("round {round}: full of the same"));
    }
    assert_clean(&p.src);
    assert_clean(&p.dst);
}

#[test]
fn damaged_cut_and_misapplied_streams_leave_the_target_as_it_was() {
    let mut rng = Stream::from_seed_u64(seed());
    let mut p = pair();
    let a = p.s.create_dataset("a", NvList::new(), (0, 0, 0o755), t(2)).expect("dataset");
    let mut o = Objects::default();
    populate(&mut p.s, root_of(a), &mut rng, 80, &mut o);
    p.s.create_snapshots(&["a@s0".into()]).expect("snapshot");
    let full = send(&mut p.s, "a@s0", None, &mut rng);
    mutate(&mut p.s, &mut rng, 50, &mut o);
    p.s.create_snapshots(&["a@s1".into()]).expect("snapshot");
    let incr = send(&mut p.s, "a@s1", Some("a@s0"), &mut rng);

    // A full stream damaged or cut anywhere makes no dataset.
    for _ in 0..12 {
        let mut bad = full.clone();
        let at = rng.below(bad.len() as u64) as usize;
        bad[at] ^= 1 << rng.below(8);
        assert!(receive(&mut p.d, "b", &bad, false, &mut rng).is_err(), "flip at {at} accepted");
        let cut = rng.below(full.len() as u64) as usize;
        assert!(receive(&mut p.d, "b", &full[..cut], false, &mut rng).is_err(), "cut at {cut} accepted");
        assert!(p.d.dataset("b").is_err(), "a failed full receive left its dataset");
    }
    // An incremental stream without its base is refused.
    assert!(receive(&mut p.d, "b", &incr, false, &mut rng).is_err());
    receive(&mut p.d, "b", &full, false, &mut rng).expect("receive");
    let before = full_dump(&mut p.d, "b");
    for _ in 0..12 {
        let mut bad = incr.clone();
        let at = rng.below(bad.len() as u64) as usize;
        bad[at] ^= 1 << rng.below(8);
        assert!(receive(&mut p.d, "b", &bad, false, &mut rng).is_err(), "flip at {at} accepted");
        assert_equal(&full_dump(&mut p.d, "b"), &before, &format!("after a flip at {at}"));
        let cut = rng.below(incr.len() as u64) as usize;
        assert!(receive(&mut p.d, "b", &incr[..cut], false, &mut rng).is_err(), "cut at {cut} accepted");
        assert_equal(&full_dump(&mut p.d, "b"), &before, &format!("after a cut at {cut}"));
    }
    assert_clean(&p.dst);
    // Read since (access times moved, nothing else): the stream applies as it is.
    let root = root_of(p.d.dataset("b").expect("b").id);
    let read =
        p.d.readdir(root, 0, 1000).expect("readdir").into_iter().map(|(_, i)| i).find(|i| i.kind == FileKind::Regular);
    if let Some(i) = read {
        let atime_only = SetAttr { atime: Some(t(999)), ctime: Some(i.ctime), ..Default::default() };
        p.d.setattr(i.ino, &atime_only, t(999)).expect("atime");
        p.d.commit().expect("commit");
        receive(&mut p.d, "b", &incr, false, &mut rng).expect("receive after reads");
        assert_equal(&full_dump(&mut p.d, "b"), &full_dump(&mut p.s, "a@s1"), "after reads");
        p.d.destroy_snapshot("b@s1").expect("destroy");
        p.d.rollback("b@s0").expect("rollback");
        p.d.commit().expect("commit");
    }
    // A target changed since its base is refused unless forced.
    p.d.create(root, b"local", FileKind::Regular, 0o644, 0, 0, 0, t(60)).expect("create");
    p.d.commit().expect("commit");
    let err = receive(&mut p.d, "b", &incr, false, &mut rng).expect_err("changed target");
    assert!(err.contains("--force"), "{err}");
    assert!(p.d.lookup(root, b"local").is_ok(), "a refused receive changed the target");
    receive(&mut p.d, "b", &incr, true, &mut rng).expect("forced receive");
    assert_equal(&full_dump(&mut p.d, "b"), &full_dump(&mut p.s, "a@s1"), "forced");
    // The same stream again: its snapshot exists now.
    assert!(receive(&mut p.d, "b", &incr, true, &mut rng).is_err());
    assert_clean(&p.dst);
}

#[test]
fn a_crash_in_the_middle_of_a_receive_is_undone_at_open() {
    let mut rng = Stream::from_seed_u64(seed());
    let mut p = pair();
    let a = p.s.create_dataset("a", NvList::new(), (0, 0, 0o755), t(2)).expect("dataset");
    let mut o = Objects::default();
    populate(&mut p.s, root_of(a), &mut rng, 120, &mut o);
    p.s.create_snapshots(&["a@s0".into()]).expect("snapshot");
    let full = send(&mut p.s, "a@s0", None, &mut rng);
    mutate(&mut p.s, &mut rng, 80, &mut o);
    p.s.create_snapshots(&["a@s1".into()]).expect("snapshot");
    let incr = send(&mut p.s, "a@s1", Some("a@s0"), &mut rng);

    // Full: half applied and committed, then the power goes.
    let mut r = p.d.receive_start("b", false, t(50)).expect("start");
    p.d.receive_feed(&mut r, &full[..full.len() / 2]).expect("feed");
    p.d.commit().expect("commit");
    drop(p.d.abandon());
    p.d = open(&p.dst);
    assert!(p.d.dataset("b").is_err(), "a half-received dataset survived a crash");
    assert_clean(&p.dst);

    receive(&mut p.d, "b", &full, false, &mut rng).expect("receive");
    let before = full_dump(&mut p.d, "b");
    let mut r = p.d.receive_start("b", false, t(50)).expect("start");
    let cut = incr.len() / 3 + rng.below(incr.len() as u64 / 2) as usize;
    p.d.receive_feed(&mut r, &incr[..cut]).expect("feed");
    p.d.commit().expect("commit");
    drop(p.d.abandon());
    p.d = open(&p.dst);
    assert_equal(&full_dump(&mut p.d, "b"), &before, "after a crash mid-incremental");
    assert_clean(&p.dst);
    receive(&mut p.d, "b", &incr, false, &mut rng).expect("the same stream, again");
    assert_equal(&full_dump(&mut p.d, "b"), &full_dump(&mut p.s, "a@s1"), "after the retry");
}
