//! End-to-end scenarios on an in-memory image: every namespace operation, data at every
//! size class, reopen, and fsck after each scenario.

mod common;
use common::*;
use crest_store::{Error, FallocateMode, FileKind, MemDisk, RenameFlags, SetAttr, Store, ROOT_INO};

#[test]
fn mkfs_then_fsck_is_clean_and_root_exists() {
    let disk = fresh(16);
    let r = assert_clean(&disk);
    assert_eq!(r.inodes, 1);
    let mut s = open(&disk);
    let root = s.getattr(ROOT_INO).expect("root");
    assert_eq!(root.kind, FileKind::Directory);
    assert_eq!(root.nlink, 2);
}

#[test]
fn many_files_split_the_tree_and_survive_reopen() {
    let disk = fresh(64);
    let mut s = open(&disk);
    let d = s.create(ROOT_INO, b"dir", FileKind::Directory, 0o755, 0, 0, 0, t(2)).expect("mkdir").ino;
    for i in 0..3000u32 {
        let name = format!("file-{i:05}");
        let ino = s.create(d, name.as_bytes(), FileKind::Regular, 0o644, 1, 2, 0, t(3)).expect("create").ino;
        s.write(ino, 0, name.as_bytes(), t(4)).expect("write");
    }
    s.commit().expect("commit");
    drop(s);
    assert_clean(&disk);
    let mut s = open(&disk);
    for i in (0..3000u32).step_by(7) {
        let name = format!("file-{i:05}");
        let ino = s.lookup(d, name.as_bytes()).expect("lookup").ino;
        assert_eq!(s.read(ino, 0, 100).expect("read"), name.as_bytes());
    }
    assert_eq!(s.readdir(d, 0, 10_000).expect("readdir").len(), 3000);
    // Delete them all: the tree shrinks back and fsck stays clean.
    for i in 0..3000u32 {
        s.unlink(d, format!("file-{i:05}").as_bytes(), t(5)).expect("unlink");
    }
    s.rmdir(ROOT_INO, b"dir", t(6)).expect("rmdir");
    s.commit().expect("commit");
    drop(s);
    let r = assert_clean(&disk);
    assert_eq!(r.inodes, 1);
}

fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len).map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed)).collect()
}

#[test]
fn data_inline_extent_overwrite_truncate_punch() {
    let disk = fresh(64);
    let mut s = open(&disk);
    let ino = s.create(ROOT_INO, b"f", FileKind::Regular, 0o644, 0, 0, 0, t(2)).expect("create").ino;
    let mut model = Vec::new();
    let write = |s: &mut Store, model: &mut Vec<u8>, off: usize, data: &[u8]| {
        s.write(ino, off as u64, data, t(3)).expect("write");
        if model.len() < off + data.len() {
            model.resize(off + data.len(), 0);
        }
        model[off..off + data.len()].copy_from_slice(data);
    };
    write(&mut s, &mut model, 0, &pattern(100, 1)); // inline
    write(&mut s, &mut model, 50, &pattern(900, 2)); // still inline
    assert_eq!(s.read(ino, 0, 10_000).expect("read"), model);
    write(&mut s, &mut model, 1000, &pattern(5000, 3)); // converts to extents
    assert_eq!(s.read(ino, 0, 1 << 20).expect("read"), model);
    write(&mut s, &mut model, 3, &pattern(10, 4)); // partial block rewrite
    write(&mut s, &mut model, 8190, &pattern(3_000_000, 5)); // multi-extent
    assert_eq!(s.read(ino, 0, 4 << 20).expect("read"), model);
    write(&mut s, &mut model, 5_000_000, &pattern(7, 6)); // sparse
    assert_eq!(s.read(ino, 0, 8 << 20).expect("read"), model);
    assert_eq!(s.read(ino, 4_000_000, 10).expect("hole"), vec![0; 10]);
    s.commit().expect("commit");
    assert_clean(&disk);
    // Truncate into the middle of a block, then grow: the tail reads as zeros.
    s.setattr(ino, &SetAttr { size: Some(10_000), ..Default::default() }, t(4)).expect("truncate");
    model.truncate(10_000);
    s.setattr(ino, &SetAttr { size: Some(20_000), ..Default::default() }, t(4)).expect("extend");
    model.resize(20_000, 0);
    assert_eq!(s.read(ino, 0, 1 << 20).expect("read"), model);
    // Punch a hole across block edges.
    s.fallocate(ino, 3000, 9000, FallocateMode { keep_size: true, punch_hole: true, zero_range: false }, t(5))
        .expect("punch");
    model[3000..12_000].fill(0);
    assert_eq!(s.read(ino, 0, 1 << 20).expect("read"), model);
    // Preallocate past the end.
    s.fallocate(ino, 0, 40_000, FallocateMode::default(), t(6)).expect("fallocate");
    model.resize(40_000, 0);
    assert_eq!(s.read(ino, 0, 1 << 20).expect("read"), model);
    assert_eq!(s.getattr(ino).expect("attr").blocks, 10);
    s.commit().expect("commit");
    drop(s);
    assert_clean(&disk);
    let mut s = open(&disk);
    assert_eq!(s.read(ino, 0, 1 << 20).expect("read"), model);
}

#[test]
fn rename_variants() {
    let disk = fresh(16);
    let mut s = open(&disk);
    let a = s.create(ROOT_INO, b"a", FileKind::Directory, 0o755, 0, 0, 0, t(2)).expect("a").ino;
    let b = s.create(ROOT_INO, b"b", FileKind::Directory, 0o755, 0, 0, 0, t(2)).expect("b").ino;
    let f = s.create(a, b"f", FileKind::Regular, 0o644, 0, 0, 0, t(2)).expect("f").ino;
    let g = s.create(b, b"g", FileKind::Regular, 0o644, 0, 0, 0, t(2)).expect("g").ino;
    s.rename(a, b"f", b, b"f2", RenameFlags::default(), t(3)).expect("move");
    assert_eq!(s.lookup(b, b"f2").expect("f2").ino, f);
    assert!(matches!(s.lookup(a, b"f"), Err(Error::NotFound(_))));
    let noreplace = RenameFlags { noreplace: true, exchange: false };
    assert!(matches!(s.rename(b, b"f2", b, b"g", noreplace, t(3)), Err(Error::Exists(_))));
    let exchange = RenameFlags { noreplace: false, exchange: true };
    s.rename(b, b"f2", b, b"g", exchange, t(3)).expect("exchange");
    assert_eq!(s.lookup(b, b"g").expect("g").ino, f);
    assert_eq!(s.lookup(b, b"f2").expect("f2").ino, g);
    // Replace a file: the old one is gone.
    s.rename(b, b"g", b, b"f2", RenameFlags::default(), t(4)).expect("replace");
    assert!(matches!(s.getattr(g), Err(Error::NotFound(_))));
    // A directory into its own subtree is refused.
    s.rename(ROOT_INO, b"a", b, b"a", RenameFlags::default(), t(5)).expect("move dir");
    assert!(matches!(s.rename(ROOT_INO, b"b", a, b"x", RenameFlags::default(), t(5)), Err(Error::Invalid(_))));
    assert_eq!(s.getattr(b).expect("b").nlink, 3);
    assert_eq!(s.getattr(ROOT_INO).expect("root").nlink, 3);
    // Exchange a directory with a file across directories.
    let c = s.create(ROOT_INO, b"c", FileKind::Regular, 0o644, 0, 0, 0, t(6)).expect("c").ino;
    s.rename(b, b"a", ROOT_INO, b"c", exchange, t(6)).expect("exchange dir/file");
    assert_eq!(s.lookup(ROOT_INO, b"c").expect("c").ino, a);
    assert_eq!(s.lookup(b, b"a").expect("a").ino, c);
    assert_eq!(s.getattr(a).expect("a").parent, ROOT_INO);
    s.commit().expect("commit");
    assert_clean(&disk);
}

#[test]
fn unlink_open_file_keeps_it_until_release_and_crash_reclaims() {
    let disk = fresh(16);
    let mut s = open(&disk);
    let f = s.create(ROOT_INO, b"f", FileKind::Regular, 0o644, 0, 0, 0, t(2)).expect("f").ino;
    s.write(f, 0, &vec![7u8; 100_000], t(2)).expect("write");
    s.open_handle(f).expect("open");
    let u = s.unlink(ROOT_INO, b"f", t(3)).expect("unlink");
    assert!(!u.destroyed);
    assert_eq!(s.read(f, 99_990, 100).expect("read after unlink"), vec![7u8; 10]);
    s.commit().expect("commit");
    assert_clean(&disk); // on the orphan list: clean
    let free_before = s.statfs().free_blocks;
    // Crash with the file still open: the next open reclaims it.
    drop(s);
    let mut s = open(&disk);
    assert!(matches!(s.getattr(f), Err(Error::NotFound(_))));
    assert!(s.statfs().free_blocks >= free_before + 24);
    drop(s);
    let r = assert_clean(&disk);
    assert_eq!(r.inodes, 1);
    // And the normal path: release destroys.
    let mut s = open(&disk);
    let g = s.create(ROOT_INO, b"g", FileKind::Regular, 0o644, 0, 0, 0, t(2)).expect("g").ino;
    s.open_handle(g).expect("open");
    s.unlink(ROOT_INO, b"g", t(3)).expect("unlink");
    s.release_handle(g).expect("release");
    assert!(matches!(s.getattr(g), Err(Error::NotFound(_))));
}

#[test]
fn errors_are_typed() {
    let disk = fresh(16);
    let mut s = open(&disk);
    let f = s.create(ROOT_INO, b"f", FileKind::Regular, 0o644, 0, 0, 0, t(2)).expect("f").ino;
    let d = s.create(ROOT_INO, b"d", FileKind::Directory, 0o755, 0, 0, 0, t(2)).expect("d").ino;
    s.create(d, b"x", FileKind::Fifo, 0o644, 0, 0, 0, t(2)).expect("fifo");
    assert_eq!(errno(s.create(ROOT_INO, b"f", FileKind::Regular, 0, 0, 0, 0, t(3))), Some(17));
    assert_eq!(errno(s.create(ROOT_INO, &[b'n'; 256], FileKind::Regular, 0, 0, 0, 0, t(3))), Some(36));
    assert_eq!(errno(s.lookup(ROOT_INO, b"nope")), Some(2));
    assert_eq!(errno(s.lookup(f, b"x")), Some(20));
    assert_eq!(errno(s.rmdir(ROOT_INO, b"d", t(3))), Some(39));
    assert_eq!(errno(s.rmdir(ROOT_INO, b"f", t(3))), Some(20));
    assert_eq!(errno(s.unlink(ROOT_INO, b"d", t(3))), Some(21));
    assert_eq!(errno(s.link(d, ROOT_INO, b"dl", t(3))), Some(1));
    assert_eq!(errno(s.getxattr(f, b"user.none")), Some(61));
    assert_eq!(errno(s.write(d, 0, b"x", t(3))), Some(21));
    s.setxattr(f, b"user.a", b"1", t(4)).expect("setxattr");
    assert_eq!(s.getxattr(f, b"user.a").expect("get"), b"1");
    s.removexattr(f, b"user.a", t(4)).expect("remove");
    assert_eq!(errno(s.removexattr(f, b"user.a", t(4))), Some(61));
    let l = s.symlink(ROOT_INO, b"l", &vec![b'p'; 4000], 0, 0, t(5)).expect("long symlink");
    assert_eq!(s.readlink(l.ino).expect("readlink").len(), 4000);
    s.commit().expect("commit");
    assert_clean(&disk);
}

#[test]
fn enospc_is_clean_and_space_comes_back() {
    let disk = fresh(8);
    let mut s = open(&disk);
    let mut files = Vec::new();
    let chunk = vec![0xabu8; 256 * 1024];
    'fill: for i in 0..1000 {
        let name = format!("f{i}");
        let ino = match s.create(ROOT_INO, name.as_bytes(), FileKind::Regular, 0o644, 0, 0, 0, t(2)) {
            Ok(i) => i.ino,
            Err(e) => {
                assert_eq!(e.errno(), 28, "{e}");
                break 'fill;
            }
        };
        files.push(name);
        if let Err(e) = s.write(ino, 0, &chunk, t(2)) {
            assert_eq!(e.errno(), 28, "{e}");
            break 'fill;
        }
    }
    assert!(files.len() > 5);
    s.commit().expect("commit at full");
    assert_clean(&disk);
    for f in &files {
        s.unlink(ROOT_INO, f.as_bytes(), t(3)).expect("unlink when full");
    }
    s.commit().expect("commit");
    s.commit().expect("commit");
    let ino = s.create(ROOT_INO, b"again", FileKind::Regular, 0o644, 0, 0, 0, t(4)).expect("create").ino;
    s.write(ino, 0, &chunk, t(4)).expect("space is usable again");
    s.commit().expect("commit");
    assert_clean(&disk);
}

fn errno<T>(r: Result<T, Error>) -> Option<i32> {
    r.err().map(|e| e.errno())
}

#[test]
fn older_superblock_stays_a_valid_fallback_after_reopen() {
    for copies in [1, 2] {
        older_superblock_fallback(copies);
    }
}

fn older_superblock_fallback(copies: u8) {
    use crest_store::crash::{image_at, CrashPoint, Event, RecordingDisk};
    use crest_store::limits::{SUPERBLOCK_MIRROR_OFFSETS, SUPERBLOCK_OFFSETS};
    // Generation 2 with a file, closed; reopened; generation 3 rewrites it. A crash before
    // generation 3's superblock lands plus a damaged generation-2 copy (and mirror) must
    // fall back to generation 1 intact: the first transaction after open must not reuse
    // its blocks.
    let disk = fresh_with_copies(16, copies);
    let mut s = open(&disk);
    let f = s.create(ROOT_INO, b"f", FileKind::Regular, 0o644, 0, 0, 0, t(2)).expect("f").ino;
    s.write(f, 0, &pattern(50_000, 1), t(2)).expect("write");
    s.commit().expect("gen 2");
    drop(s);
    let gen1_view = {
        // Generation 1 (mkfs) is the copy that generation 2 did not overwrite.
        let mut s = open(&fresh_with_copies(16, copies));
        dump(&mut s)
    };
    let rec = RecordingDisk::new(disk.snapshot());
    let mut s = Store::open(Box::new(rec.clone())).expect("open");
    assert_eq!(s.generation(), 2);
    for i in 0..40u8 {
        let name = format!("g{i}");
        let ino = s.create(ROOT_INO, name.as_bytes(), FileKind::Regular, 0o644, 0, 0, 0, t(3)).expect("create").ino;
        s.write(ino, 0, &pattern(20_000, i), t(3)).expect("write");
    }
    s.unlink(ROOT_INO, b"f", t(3)).expect("unlink");
    s.commit().expect("gen 3");
    let events = rec.events();
    let sb = events
        .iter()
        .position(|e| {
            matches!(e, Event::Write { offset, .. }
                if SUPERBLOCK_OFFSETS.contains(offset) || SUPERBLOCK_MIRROR_OFFSETS.contains(offset))
        })
        .expect("superblock write");
    // Everything of generation 3 but its superblock reached the disk.
    let mut img = image_at(rec.base(), &events, &CrashPoint { durable: sb, survivors: vec![] });
    // And the generation-2 copy is damaged, in both places when it has a mirror.
    img[SUPERBLOCK_OFFSETS[0] as usize + 100] ^= 0xff;
    if copies == 2 {
        let s = Store::open(Box::new(MemDisk::from_bytes(img.clone()))).expect("open from the mirror");
        assert_eq!(s.generation(), 2, "the mirror of the damaged copy is used");
        drop(s);
        img[SUPERBLOCK_MIRROR_OFFSETS[0] as usize + 100] ^= 0xff;
    }
    let mut s = Store::open(Box::new(MemDisk::from_bytes(img))).expect("falls back to generation 1");
    assert_eq!(s.generation(), 1, "{copies} copies");
    assert_same(&dump(&mut s), &gen1_view, "generation 1 after fallback");
}

/// `lookup_leaf` keeps its promise: every entry whose hash lies in the covered range is
/// listed, so a name in the range and not listed is absent — checked against the full
/// listing for present and absent names in a directory spanning many leaves, with a
/// second directory's items sharing leaves at the edges.
#[test]
fn lookup_leaf_lists_every_entry_in_its_hash_range() {
    use crest_store::key::name_hash;
    let disk = fresh(64);
    let mut s = open(&disk);
    let before = s.create(ROOT_INO, b"a-before", FileKind::Directory, 0o755, 0, 0, 0, t(2)).expect("mkdir").ino;
    let d = s.create(ROOT_INO, b"dir", FileKind::Directory, 0o755, 0, 0, 0, t(2)).expect("mkdir").ino;
    let after = s.create(ROOT_INO, b"z-after", FileKind::Directory, 0o755, 0, 0, 0, t(2)).expect("mkdir").ino;
    for i in 0..50u32 {
        for dir in [before, after] {
            s.create(dir, format!("o{i}").as_bytes(), FileKind::Regular, 0o644, 0, 0, 0, t(3)).expect("create");
        }
    }
    let mut all = std::collections::BTreeMap::new();
    for i in 0..2500u32 {
        let name = format!("file-{i:05}").into_bytes();
        let ino = s.create(d, &name, FileKind::Regular, 0o644, 0, 0, 0, t(3)).expect("create").ino;
        all.insert(name, ino);
    }
    s.commit().expect("commit");
    let mut covered_total = 0u128;
    for i in (0..5000u32).step_by(13) {
        let name = format!("file-{i:05}").into_bytes();
        let present = all.get(&name).copied();
        let leaf = s.lookup_leaf(d, &name, 64).expect("lookup_leaf");
        assert_eq!(leaf.found.as_ref().map(|n| n.ino), present, "found for {i}");
        let h = name_hash(&name);
        assert!(leaf.hash_lo <= h && h <= leaf.hash_hi, "range {:x}..={:x} misses {h:x}", leaf.hash_lo, leaf.hash_hi);
        let listed: std::collections::BTreeMap<_, _> =
            leaf.neighbours.iter().map(|(e, inode)| (e.name.clone(), (e.ino, inode.ino))).collect();
        let expected: std::collections::BTreeMap<_, _> = all
            .iter()
            .filter(|(n, _)| (leaf.hash_lo..=leaf.hash_hi).contains(&name_hash(n)))
            .map(|(n, ino)| (n.clone(), (*ino, *ino)))
            .collect();
        assert_eq!(listed, expected, "neighbours of {i}");
        assert!(leaf.neighbours.len() <= 64 + 2, "{} neighbours", leaf.neighbours.len());
        covered_total += u128::from(leaf.hash_hi - leaf.hash_lo) + 1;
    }
    // The answers cover real ground, not just the name itself.
    assert!(covered_total > u128::from(u64::MAX), "ranges too narrow: {covered_total}");
    // An empty directory is covered whole.
    let e = s.create(ROOT_INO, b"empty", FileKind::Directory, 0o755, 0, 0, 0, t(4)).expect("mkdir").ino;
    let leaf = s.lookup_leaf(e, b"x", 64).expect("lookup_leaf");
    assert!(leaf.found.is_none() && leaf.neighbours.is_empty());
    assert_eq!((leaf.hash_lo, leaf.hash_hi), (0, u64::MAX));
    assert!(matches!(s.lookup_leaf(d, &[b'n'; 300], 64), Err(Error::NameTooLong { .. })));
}

/// Session records are committed atomically with the file system: they survive a commit
/// and reopen, vanish with the work of an uncommitted transaction, and fsck accepts them.
/// Inside a unit an fsync's commit waits for `end_unit`.
#[test]
fn session_records_and_units() {
    let disk = fresh(16);
    let mut s = open(&disk);
    s.put_session_record(7, b"seq=1").expect("put");
    s.create(ROOT_INO, b"a", FileKind::Regular, 0o644, 0, 0, 0, t(2)).expect("create");
    s.commit().expect("commit");
    // Uncommitted: a newer record and a file, lost together.
    s.put_session_record(7, b"seq=2").expect("put");
    s.put_session_record(9, b"other").expect("put");
    s.create(ROOT_INO, b"b", FileKind::Regular, 0o644, 0, 0, 0, t(3)).expect("create");
    drop(s.abandon());
    let mut s = open(&disk);
    assert_eq!(s.session_records().expect("records"), vec![(7, b"seq=1".to_vec())]);
    assert!(s.lookup(ROOT_INO, b"a").is_ok() && s.lookup(ROOT_INO, b"b").is_err());
    let too_big = vec![0; crest_store::sessions::MAX_SESSION_RECORD_BYTES + 1];
    assert!(matches!(s.put_session_record(1, &too_big), Err(Error::TooBig(_))));
    // A unit holds the fsync's commit until its end.
    let g = s.generation();
    s.begin_unit();
    s.put_session_record(7, b"seq=3").expect("put");
    s.create(ROOT_INO, b"c", FileKind::Regular, 0o644, 0, 0, 0, t(4)).expect("create");
    s.fsync(ROOT_INO).expect("fsync");
    assert_eq!(s.generation(), g, "no commit inside the unit");
    s.end_unit().expect("end_unit commits");
    assert_eq!(s.generation(), g + 1);
    s.delete_session_record(9).expect("delete a missing record is fine");
    drop(s.abandon());
    let r = assert_clean(&disk);
    assert_eq!(r.sessions, 1);
    let mut s = open(&disk);
    assert_eq!(s.session_records().expect("records"), vec![(7, b"seq=3".to_vec())]);
    assert!(s.lookup(ROOT_INO, b"c").is_ok());
    s.delete_session_record(7).expect("delete");
    s.commit().expect("commit");
    assert!(s.session_records().expect("records").is_empty());
}

#[test]
fn creates_at_reserved_inode_numbers() {
    let disk = fresh(16);
    let mut s = open(&disk);
    let first = s.reserve_inode_numbers(ROOT_INO, 10).expect("reserve");
    assert!(first > ROOT_INO);
    let at = |ino| Some(crest_store::NewInode { ino, generation: 77 });
    let f = s.create_at(at(first + 3), ROOT_INO, b"f", FileKind::Regular, 0o644, 1, 2, 0, t(2)).expect("create_at");
    assert_eq!((f.ino, f.generation), (first + 3, 77));
    let l = s.symlink_at(at(first), ROOT_INO, b"l", b"target", 1, 2, t(2)).expect("symlink_at");
    assert_eq!(l.ino, first);
    // A number in use, one never reserved, and the root are refused; nothing changes.
    assert!(matches!(
        s.create_at(at(first + 3), ROOT_INO, b"g", FileKind::Regular, 0o644, 1, 2, 0, t(2)),
        Err(Error::Exists(_))
    ));
    assert!(matches!(
        s.create_at(at(first + 10), ROOT_INO, b"g", FileKind::Regular, 0o644, 1, 2, 0, t(2)),
        Err(Error::Invalid(_))
    ));
    assert!(s.create_at(at(ROOT_INO), ROOT_INO, b"g", FileKind::Regular, 0o644, 1, 2, 0, t(2)).is_err());
    assert!(matches!(s.lookup(ROOT_INO, b"g"), Err(Error::NotFound(_))));
    // Ordinary creates never reuse a reserved number, even after reopen.
    s.commit().expect("commit");
    drop(s);
    assert_clean(&disk);
    let mut s = open(&disk);
    let g = s.create(ROOT_INO, b"g", FileKind::Regular, 0o644, 1, 2, 0, t(3)).expect("create");
    assert!(g.ino >= first + 10, "{} reuses a reserved number", g.ino);
    assert_eq!(s.getattr(first + 3).expect("getattr").generation, 77);
    assert!(s.reserve_inode_numbers(ROOT_INO, u64::MAX).is_err(), "inode numbers cannot wrap");
}

/// Reads at any offset and length return the bytes written, across inline data, extents
/// made by writes of every size, aligned to blocks or not (so extent edges fall
/// anywhere), overwrites and holes:
/// a read covers whole blocks of one extent and cuts blocks of another. Seeded
/// (`CREST_READ_SEED` replays).
#[test]
fn reads_at_any_offset_and_length_return_what_was_written() {
    let seed = std::env::var("CREST_READ_SEED").ok().and_then(|v| v.parse().ok()).unwrap_or_else(crest_rng::next_u64);
    println!("CREST_READ_SEED={seed}");
    let mut rng = crest_rng::Stream::from_seed_u64(seed);
    let disk = fresh(64);
    let mut s = open(&disk);
    for f in 0..6u8 {
        let ino = s.create(ROOT_INO, &[b'f', b'0' + f], FileKind::Regular, 0o644, 0, 0, 0, t(2)).expect("create").ino;
        let mut model: Vec<u8> = Vec::new();
        for w in 0..(2 + rng.below(12)) {
            let span = if rng.below(4) == 0 { 3 << 20 } else { 300_000 };
            let mut off = rng.below(span) as usize;
            let size_class = [100, 5_000, 70_000, 1 << 20][rng.below(4) as usize];
            let mut len = 1 + rng.below(size_class) as usize;
            if rng.below(3) == 0 {
                // Whole blocks, as a big sequential write's.
                off -= off % 4096;
                len = len.div_ceil(4096) * 4096;
            }
            let data = pattern(len, (u64::from(f) * 31 + w) as u8);
            s.write(ino, off as u64, &data, t(3)).expect("write");
            if model.len() < off + len {
                model.resize(off + len, 0);
            }
            model[off..off + len].copy_from_slice(&data);
        }
        if rng.below(2) == 0 {
            s.commit().expect("commit");
        }
        for _ in 0..60 {
            let off = rng.below(model.len() as u64 + 10_000);
            let size_class = [10, 4096, 100_000, 4 << 20][rng.below(4) as usize];
            let len = 1 + rng.below(size_class);
            let got = s.read(ino, off, len).expect("read");
            let (a, b) = ((off as usize).min(model.len()), ((off + len) as usize).min(model.len()));
            assert!(got == model[a..b], "seed {seed}: file {f} read {off}+{len}: {} bytes, want {}", got.len(), b - a);
        }
    }
    s.commit().expect("commit");
    assert_clean(&disk);
}
