//! A full image stays usable: whatever fills it (one huge fallocate, fragmented files whose
//! extent items outweigh the reserve, random writes, xattrs), every commit succeeds, fsck
//! stays clean, every file can be deleted, and the space comes back.
//!
//! `CREST_SPACE_SEED=S` replays a seed (each test prints the one it used);
//! `CREST_SPACE_ROUNDS=N` runs more rounds.

mod common;

use common::{assert_clean, fresh, open, t};
use crest_rng::Stream;
use crest_store::{Error, FallocateMode, FileKind, Store, ROOT_INO};

fn seed() -> u64 {
    let s = std::env::var("CREST_SPACE_SEED").ok().and_then(|s| s.parse().ok()).unwrap_or_else(crest_rng::next_u64);
    eprintln!("CREST_SPACE_SEED={s}");
    s
}

fn rounds() -> u64 {
    std::env::var("CREST_SPACE_ROUNDS").ok().and_then(|s| s.parse().ok()).unwrap_or(10)
}

/// An operation may fail for want of space, never otherwise.
fn ok_or_full<T>(r: Result<T, Error>, what: &str) -> Option<T> {
    match r {
        Ok(v) => Some(v),
        Err(e) if e.errno() == 28 => None,
        Err(e) => panic!("{what}: {e}"),
    }
}

fn new_file(s: &mut Store, name: &str) -> Option<u64> {
    ok_or_full(s.create(ROOT_INO, name.as_bytes(), FileKind::Regular, 0o644, 0, 0, 0, t(2)), "create").map(|i| i.ino)
}

/// Writes a file of about half the space, then rewrites every other block until the image
/// is full: one-block extents, and the old blocks become every other block free.
fn fragment(s: &mut Store, name: &str, rng: &mut Stream) {
    let Some(ino) = new_file(s, name) else { return };
    let half = s.statfs().avail_blocks / 2;
    let bytes = ((half.saturating_sub(rng.below(half / 4 + 1))) * 4096).max(1);
    ok_or_full(s.write(ino, 0, &vec![0x5a; bytes as usize], t(2)), "write");
    let blocks = s.getattr(ino).expect("getattr").size / 4096;
    for i in (1..blocks).step_by(2) {
        if ok_or_full(s.write(ino, i * 4096, &[0xa5; 4096], t(2)), "rewrite").is_none() {
            break;
        }
    }
}

/// Fills the image in one of several ways; returns how it was filled.
fn fill(s: &mut Store, rng: &mut Stream) -> &'static str {
    match rng.below(5) {
        4 => {
            // Free space left as every other block, then filled by one call: each block
            // a run of its own, so the call's own items weigh ~1 % of its data.
            let Some(keep) = new_file(s, "keep") else { return "checkerboard (no create)" };
            let blocks = s.statfs().avail_blocks.saturating_sub(rng.below(64));
            let mode = FallocateMode::default();
            ok_or_full(s.fallocate(keep, 0, blocks.max(1) * 4096, mode, t(2)), "fallocate");
            let punch = FallocateMode { keep_size: true, punch_hole: true, ..mode };
            for i in (1..blocks).step_by(2) {
                s.fallocate(keep, i * 4096, 4096, punch, t(2)).expect("punching a hole needs no space");
            }
            for _ in 0..2 {
                s.commit().expect("commit");
            }
            let Some(ino) = new_file(s, "filler") else { return "checkerboard (no create)" };
            let avail = s.statfs().avail_blocks.saturating_sub(8) * 4096;
            // Refused calls change nothing; smaller ones fill what is left.
            let (mut off, mut len) = (0, avail.max(4096));
            while len >= 4096 {
                let r = if rng.below(2) == 0 {
                    s.fallocate(ino, off, len, FallocateMode::default(), t(2)).map(|_| ())
                } else {
                    s.write(ino, off, &vec![0x22; len as usize], t(2)).map(|_| ())
                };
                match ok_or_full(r, "fill") {
                    Some(()) => off += len,
                    None => len /= 2,
                }
            }
            "checkerboard"
        }
        0 => {
            // Everything statfs calls available, in one call, then more until refused.
            let Some(ino) = new_file(s, "big") else { return "fallocate (no create)" };
            let avail = s.statfs().avail_blocks * 4096;
            let slack = rng.below(64) * 4096;
            let mode = FallocateMode::default();
            ok_or_full(s.fallocate(ino, 0, avail.saturating_sub(slack).max(4096), mode, t(2)), "fallocate");
            let mut off = avail;
            while ok_or_full(s.fallocate(ino, off, 4096 * (1 + rng.below(300)), mode, t(2)), "fallocate").is_some() {
                off = s.getattr(ino).expect("getattr").size;
            }
            "fallocate"
        }
        1 => {
            fragment(s, "frag", rng);
            "fragmented"
        }
        2 => {
            // Random sizes at random offsets over a handful of files.
            let mut inos = Vec::new();
            for i in 0..1 + rng.below(8) {
                inos.extend(new_file(s, &format!("r{i}")));
            }
            let mut refusals = 0;
            while refusals < 20 && !inos.is_empty() {
                let ino = inos[rng.below(inos.len() as u64) as usize];
                let bits = rng.below(21);
                let len = 1 + rng.below(1 << bits) as usize;
                let off = rng.below(64 << 20);
                if ok_or_full(s.write(ino, off, &vec![0xc3; len], t(2)), "write").is_none() {
                    refusals += 1;
                }
            }
            "random writes"
        }
        _ => {
            // Many files with large xattrs.
            for i in 0u64.. {
                let Some(ino) = new_file(s, &format!("x{i}")) else { break };
                let len = 1 + rng.below(65536) as usize;
                if ok_or_full(s.setxattr(ino, b"user.v", &vec![7u8; len], t(2)), "setxattr").is_none() {
                    break;
                }
            }
            "xattrs"
        }
    }
}

#[test]
fn a_full_image_can_always_be_emptied_and_reused() {
    let seed = seed();
    let mut rng = Stream::from_seed_u64(seed);
    for round in 0..rounds() {
        let mib = 4 + rng.below(60);
        let disk = fresh(mib);
        let mut s = open(&disk);
        let fresh_avail = s.statfs().avail_blocks;
        let how = fill(&mut s, &mut rng);
        eprintln!("round {round}: {mib} MiB image filled by {how}: {:?}", s.statfs());
        s.commit().unwrap_or_else(|e| panic!("seed {seed} round {round} ({how}): commit at full: {e}"));
        assert_clean(&disk);
        let names: Vec<Vec<u8>> =
            s.readdir(ROOT_INO, 0, usize::MAX).expect("readdir").into_iter().map(|(e, _)| e.name).collect();
        for name in &names {
            s.unlink(ROOT_INO, name, t(3)).unwrap_or_else(|e| {
                panic!("seed {seed} round {round} ({how}): unlink {:?} when full: {e}", String::from_utf8_lossy(name))
            });
        }
        // Large files are freed in steps by the background tick.
        for ms in 0..200 {
            s.tick(ms * 1000).unwrap_or_else(|e| panic!("seed {seed} round {round} ({how}): tick after deletes: {e}"));
        }
        for _ in 0..2 {
            s.commit().unwrap_or_else(|e| panic!("seed {seed} round {round} ({how}): commit after deletes: {e}"));
        }
        assert_clean(&disk);
        let st = s.statfs();
        // Trees grown taller by the fill keep their height: a few blocks (fsck checks leaks).
        assert!(
            st.avail_blocks + 16 >= fresh_avail,
            "seed {seed} round {round} ({how}): {} blocks available after deleting everything, {fresh_avail} when new",
            st.avail_blocks,
        );
        let ino = new_file(&mut s, "again").expect("create after emptying");
        let half = (st.avail_blocks / 2) * 4096;
        s.write(ino, 0, &vec![1u8; half as usize], t(4)).expect("space is usable again");
        s.commit().expect("commit");
        assert_clean(&disk);
    }
}

/// Writes `n` blocks to `ino`, then rewrites every other one: `n` one-block extents.
fn one_block_extents(s: &mut Store, ino: u64, n: u64) {
    let data: Vec<u8> = (0..n).flat_map(|i| [0xb0 + (i % 16) as u8; 4096]).collect();
    s.write(ino, 0, &data, t(2)).expect("write");
    for i in (1..n).step_by(2) {
        s.write(ino, i * 4096, &data[(i * 4096) as usize..][..4096], t(2)).expect("rewrite");
    }
}

#[test]
fn a_large_delete_is_freed_in_steps_and_a_crash_resumes_it() {
    let seed = seed();
    let mut rng = Stream::from_seed_u64(seed);
    for round in 0..rounds() {
        // (Room for both files, their rewritten blocks until the commits give the old
        // ones back, and every node in two copies.)
        let disk = fresh(48);
        let mut s = open(&disk);
        let n = 200 + rng.below(2500);
        let a = new_file(&mut s, "a").expect("create");
        let b = new_file(&mut s, "b").expect("create");
        one_block_extents(&mut s, a, n);
        one_block_extents(&mut s, b, n);
        s.commit().expect("commit");
        let free0 = s.statfs().free_blocks;
        s.unlink(ROOT_INO, b"a", t(3)).expect("unlink");
        assert!(s.statfs().free_blocks >= free0 + n, "round {round}: deleted blocks count as free at once");
        let left = s.getattr(a).expect("a file with many extents is freed in steps");
        assert_eq!((left.nlink, left.blocks), (0, n));
        assert!(s.open_handle(a).is_err(), "a file being freed cannot be opened again");
        s.commit().expect("commit");
        let ticks = rng.below(4);
        for ms in 0..ticks {
            s.tick(ms * 1000).expect("tick");
        }
        if rng.below(2) == 0 {
            s.commit().expect("commit");
        }
        eprintln!("round {round}: {n} one-block extents, crash after {ticks} ticks");
        drop(s); // a crash: the orphan list holds what is left
        assert_clean(&disk);
        let mut s = open(&disk);
        for ms in 0..1000 {
            if s.getattr(a).is_err() {
                break;
            }
            s.tick(ms * 1000).expect("tick");
        }
        assert!(s.getattr(a).is_err(), "seed {seed} round {round}: still not freed");
        s.commit().expect("commit");
        s.commit().expect("commit");
        assert!(s.statfs().free_blocks >= free0 + n, "seed {seed} round {round}: space came back");
        for i in 0..n {
            let want = vec![0xb0 + (i % 16) as u8; 4096];
            assert_eq!(s.read(b, i * 4096, 4096).expect("read b"), want, "seed {seed} round {round}: block {i} of b");
        }
        drop(s);
        assert_clean(&disk);
    }
}

#[test]
fn a_fallocate_of_all_that_statfs_calls_available_succeeds_in_one_op_or_in_steps() {
    let seed = seed();
    let mut rng = Stream::from_seed_u64(seed);
    for round in 0..rounds().min(6) {
        let mib = 12 + rng.below(300);
        let disk = common::fresh(mib);
        let mut s = open(&disk);
        // Some files first, of sizes from empty to a few blocks.
        for i in 0..rng.below(40) {
            let ino = new_file(&mut s, &format!("small{i}")).expect("room for small files");
            let len = rng.below(3 * 4096 + 1) as usize;
            s.write(ino, 0, &vec![7; len], t(2)).expect("a small write");
        }
        if rng.below(2) == 0 {
            s.commit().expect("commit");
        }
        let ino = new_file(&mut s, "all").expect("create");
        let avail = s.statfs().avail_blocks * 4096;
        // In one op, or as a mount sends it: steps of `MAX_FALLOCATE_STEP` (4 MiB).
        let step = if rng.below(2) == 0 { u64::MAX } else { 4 << 20 };
        let mut at = 0;
        while at < avail {
            let n = (avail - at).min(step);
            if let Err(e) = s.fallocate(ino, at, n, FallocateMode::default(), t(3)) {
                panic!("round {round}: {mib} MiB, {avail} bytes available, step {step}: refused at {at}: {e}");
            }
            at += n;
        }
        s.commit().expect("commit");
        assert_clean(&disk);
    }
}
