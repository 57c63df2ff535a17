//! Extended attributes up to the Linux limits (values of 64 KiB, thousands per inode, a
//! 64 KiB name list), trying to break the chunked layout of `fs/xattr.rs`: values of
//! every size around the inline limit and the chunk boundaries, names whose hashes
//! collide, big↔small replacement, removal, refused changes, a full image, reopen, and
//! fsck after each (no chunk without its record, none missing, none left behind).
//!
//! Damaged chunks (resealed leaves) must be reported by fsck and refused by getxattr.
//!
//! `CREST_XATTR_SEED=S` replays a seed (each test prints the one it used).

mod common;
use std::collections::BTreeMap;

use common::*;
use crest_rng::Stream;
use crest_store::checksum::crc32c;
use crest_store::fs::xattr;
use crest_store::key::{name_hash, Key};
use crest_store::limits::{BLOCK_SIZE, XATTR_CHUNK_BYTES, XATTR_INLINE_MAX, XATTR_LIST_MAX, XATTR_SIZE_MAX};
use crest_store::store::FS_TREE_ID;
use crest_store::{Error, FileKind, MemDisk, Store, ROOT_INO};

/// Two names whose FNV-1a hashes agree except in the low 8 bits: they have different
/// XATTR items but the same preferred chunk id, so the second big value must find
/// another (found by a cycle search over `user.c<hex>` names).
const SAME_CHUNK_ID: [&[u8]; 2] = [b"user.cb9f55cf02a2b17", b"user.c3f6433939bb07c"];

fn seed() -> u64 {
    let s = std::env::var("CREST_XATTR_SEED").ok().and_then(|s| s.parse().ok()).unwrap_or_else(crest_rng::next_u64);
    eprintln!("CREST_XATTR_SEED={s}");
    s
}

/// Bytes that differ at every position and per `salt`, so a chunk out of place shows.
fn value(len: usize, salt: u64) -> Vec<u8> {
    (0..len).map(|i| (i as u64 ^ (i as u64 >> 8) ^ salt.wrapping_mul(0x9e37_79b9)) as u8).collect()
}

fn errno<T>(r: Result<T, Error>) -> Option<i32> {
    r.err().map(|e| e.errno())
}

fn file(s: &mut Store, name: &[u8]) -> u64 {
    s.create(ROOT_INO, name, FileKind::Regular, 0o644, 0, 0, 0, t(2)).expect("create").ino
}

/// Every xattr of `ino` equals `want`, and listxattr names exactly its keys.
fn assert_xattrs(s: &mut Store, ino: u64, want: &BTreeMap<Vec<u8>, Vec<u8>>, context: &str) {
    let mut names = s.listxattr(ino).expect("listxattr");
    names.sort();
    assert_eq!(names.len(), want.len(), "{context}: listxattr count");
    assert!(names.iter().eq(want.keys()), "{context}: listxattr names differ");
    for (n, v) in want {
        let got =
            s.getxattr(ino, n).unwrap_or_else(|e| panic!("{context}: getxattr {:?}: {e}", String::from_utf8_lossy(n)));
        assert!(got == *v, "{context}: {:?}: {} bytes, want {}", String::from_utf8_lossy(n), got.len(), v.len());
    }
}

/// Commits, checks the image and opens it again.
fn reopen(s: Store, disk: &MemDisk) -> Store {
    let mut s = s;
    s.commit().expect("commit");
    drop(s);
    assert_clean(disk);
    open(disk)
}

/// The sizes around every boundary of the layout for a name of `name_len` bytes.
fn boundary_sizes(name_len: usize) -> Vec<usize> {
    let mut sizes = vec![0, 1, XATTR_SIZE_MAX - 1, XATTR_SIZE_MAX];
    let inline = XATTR_INLINE_MAX - name_len;
    sizes.extend([inline - 1, inline, inline + 1]);
    for k in 1..=XATTR_SIZE_MAX / XATTR_CHUNK_BYTES {
        let b = k * XATTR_CHUNK_BYTES;
        sizes.extend([b - 1, b, b + 1].into_iter().filter(|s| *s > inline && *s <= XATTR_SIZE_MAX));
    }
    sizes
}

#[test]
fn values_of_every_size_survive_replacement_and_reopen() {
    let mut rng = Stream::from_seed_u64(seed());
    let disk = fresh(64);
    let mut s = open(&disk);
    let ino = file(&mut s, b"f");
    let mut want = BTreeMap::new();
    let mut sizes = boundary_sizes(b"user.s0000".len());
    sizes.extend((0..80).map(|_| rng.below(XATTR_SIZE_MAX as u64 + 1) as usize));
    for (i, len) in sizes.iter().enumerate() {
        let name = format!("user.s{i:04}").into_bytes();
        let v = value(*len, i as u64);
        s.setxattr(ino, &name, &v, t(3)).unwrap_or_else(|e| panic!("setxattr of {len} bytes: {e}"));
        assert!(s.getxattr(ino, &name).expect("getxattr") == v, "{len} bytes read back");
        want.insert(name, v);
    }
    assert_xattrs(&mut s, ino, &want, "after setting");
    let mut s = reopen(s, &disk);
    assert_xattrs(&mut s, ino, &want, "after reopen");
    // Replace each with a random other size (big↔small, chunk counts up and down), and
    // remove a third.
    let names: Vec<Vec<u8>> = want.keys().cloned().collect();
    for (i, name) in names.iter().enumerate() {
        if rng.below(3) == 0 {
            s.removexattr(ino, name, t(4)).expect("removexattr");
            want.remove(name);
            assert_eq!(errno(s.getxattr(ino, name)), Some(61));
            continue;
        }
        let len = sizes[rng.below(sizes.len() as u64) as usize];
        let v = value(len, 1000 + i as u64);
        s.setxattr(ino, name, &v, t(4)).expect("replace");
        want.insert(name.clone(), v);
    }
    assert_xattrs(&mut s, ino, &want, "after replacing");
    let mut s = reopen(s, &disk);
    assert_xattrs(&mut s, ino, &want, "after the second reopen");
    // Destroying the inode takes every record and chunk with it (fsck: none orphaned).
    s.unlink(ROOT_INO, b"f", t(5)).expect("unlink");
    drop(reopen(s, &disk));
    assert_eq!(assert_clean(&disk).inodes, 1);
}

#[test]
fn limits_give_the_linux_errors() {
    let disk = fresh(16);
    let mut s = open(&disk);
    let ino = file(&mut s, b"f");
    assert_eq!(errno(s.setxattr(ino, b"user.a", &vec![1; XATTR_SIZE_MAX + 1], t(3))), Some(7), "E2BIG");
    assert_eq!(errno(s.setxattr(ino, &[b'a'; 256], b"v", t(3))), Some(34), "ERANGE");
    assert_eq!(errno(s.setxattr(ino, b"", b"v", t(3))), Some(34), "ERANGE");
    assert_eq!(errno(s.getxattr(ino, &[b'a'; 256])), Some(34), "ERANGE");
    assert_eq!(errno(s.getxattr(ino, b"user.none")), Some(61), "ENODATA");
    assert_eq!(errno(s.removexattr(ino, b"user.none", t(3))), Some(61), "ENODATA");
    s.setxattr(ino, &[b'n'; 255], &vec![2; XATTR_SIZE_MAX], t(3)).expect("the largest name and value");
    assert_eq!(s.getxattr(ino, &[b'n'; 255]).expect("get"), vec![2; XATTR_SIZE_MAX]);
    assert!(s.listxattr(ino).expect("list") == vec![vec![b'n'; 255]]);
    drop(reopen(s, &disk));
}

#[test]
fn the_name_list_stops_at_xattr_list_max() {
    let disk = fresh(64);
    let mut s = open(&disk);
    let ino = file(&mut s, b"f");
    // 255-byte names take 256 bytes of the list each: exactly 256 of them fit.
    let name = |i: usize| {
        let mut n = format!("user.{i:05}-").into_bytes();
        n.resize(255, b'x');
        n
    };
    let mut want = BTreeMap::new();
    for i in 0..XATTR_LIST_MAX / 256 {
        let v = value(if i % 16 == 0 { 3000 + i } else { i }, i as u64);
        s.setxattr(ino, &name(i), &v, t(3)).unwrap_or_else(|e| panic!("xattr {i}: {e}"));
        want.insert(name(i), v);
    }
    let list: usize = s.listxattr(ino).expect("list").iter().map(|n| n.len() + 1).sum();
    assert_eq!(list, XATTR_LIST_MAX);
    let extra = name(99_999);
    assert_eq!(errno(s.setxattr(ino, &extra, b"v", t(3))), Some(28), "ENOSPC past the list limit");
    assert_eq!(errno(s.setxattr(ino, b"user.x", b"", t(3))), Some(28), "ENOSPC for a short name too");
    // Replacing an existing name does not grow the list; removing one makes room.
    s.setxattr(ino, &name(0), &value(XATTR_SIZE_MAX, 7), t(3)).expect("replace at the limit");
    want.insert(name(0), value(XATTR_SIZE_MAX, 7));
    assert_xattrs(&mut s, ino, &want, "at the limit");
    s.removexattr(ino, &name(1), t(3)).expect("remove");
    want.remove(&name(1));
    s.setxattr(ino, &extra, b"v", t(3)).expect("room again");
    want.insert(extra, b"v".to_vec());
    let mut s = reopen(s, &disk);
    assert_xattrs(&mut s, ino, &want, "after reopen");
}

#[test]
fn thousands_of_xattrs_on_one_inode() {
    let mut rng = Stream::from_seed_u64(seed());
    let disk = fresh(64);
    let mut s = open(&disk);
    let ino = file(&mut s, b"f");
    let other = file(&mut s, b"g");
    let mut want = BTreeMap::new();
    let mut names: Vec<Vec<u8>> = (0..3000).map(|i| format!("user.attr-{i:05}").into_bytes()).collect();
    names.extend(SAME_CHUNK_ID.iter().map(|n| n.to_vec()));
    for (i, name) in names.iter().enumerate() {
        // Mostly small; every 50th big (up to 64 KiB); the colliding pair both big.
        let len = match i {
            _ if i >= 3000 => XATTR_SIZE_MAX - i % 7,
            _ if i % 50 == 0 => rng.below(XATTR_SIZE_MAX as u64 + 1) as usize,
            _ => rng.below(64) as usize,
        };
        let v = value(len, i as u64);
        s.setxattr(ino, name, &v, t(3)).unwrap_or_else(|e| panic!("xattr {i} of {len} bytes: {e}"));
        want.insert(name.clone(), v);
    }
    s.setxattr(other, b"user.attr-00000", b"another inode", t(3)).expect("other inode");
    assert_xattrs(&mut s, ino, &want, "after setting");
    let mut s = reopen(s, &disk);
    assert_xattrs(&mut s, ino, &want, "after reopen");
    // Big↔small on a random fifth, removal of another fifth, the colliding pair swapped.
    for (i, name) in names.iter().enumerate() {
        match rng.below(5) {
            0 => {
                let len = if want[name].len() > XATTR_INLINE_MAX { 5 } else { 20_000 + i };
                let v = value(len, 7 + i as u64);
                s.setxattr(ino, name, &v, t(4)).expect("replace");
                want.insert(name.clone(), v);
            }
            1 => {
                s.removexattr(ino, name, t(4)).expect("remove");
                want.remove(name);
            }
            _ => {}
        }
    }
    assert_xattrs(&mut s, ino, &want, "after changes");
    let mut s = reopen(s, &disk);
    assert_xattrs(&mut s, ino, &want, "after the second reopen");
    s.unlink(ROOT_INO, b"f", t(5)).expect("unlink");
    let mut s = reopen(s, &disk);
    assert_eq!(s.getxattr(other, b"user.attr-00000").expect("other inode"), b"another inode");
    drop(s);
    assert_eq!(assert_clean(&disk).inodes, 2);
}

#[test]
fn names_with_the_same_preferred_chunk_id_keep_their_own_chunks() {
    let [a, b] = SAME_CHUNK_ID;
    assert_ne!(name_hash(a), name_hash(b));
    assert_eq!(name_hash(a) >> 8, name_hash(b) >> 8);
    let disk = fresh(16);
    let mut s = open(&disk);
    let ino = file(&mut s, b"f");
    let mut want = BTreeMap::new();
    for (round, (len_a, len_b)) in [(65_536, 65_535), (3000, 65_536), (10, 4000), (65_536, 1)].into_iter().enumerate() {
        let (va, vb) = (value(len_a, round as u64), value(len_b, 100 + round as u64));
        s.setxattr(ino, a, &va, t(3)).expect("a");
        s.setxattr(ino, b, &vb, t(3)).expect("b");
        want.insert(a.to_vec(), va);
        want.insert(b.to_vec(), vb);
        assert_xattrs(&mut s, ino, &want, &format!("round {round}"));
        s = reopen(s, &disk);
        assert_xattrs(&mut s, ino, &want, &format!("round {round} reopened"));
    }
    // Removing the one that took the preferred id leaves the other's chunks alone.
    s.removexattr(ino, a, t(4)).expect("remove a");
    want.remove(a);
    assert_xattrs(&mut s, ino, &want, "a removed");
    s.setxattr(ino, a, &value(40_000, 9), t(4)).expect("a again");
    want.insert(a.to_vec(), value(40_000, 9));
    let mut s = reopen(s, &disk);
    assert_xattrs(&mut s, ino, &want, "a again, reopened");
}

#[test]
fn a_full_image_refuses_whole_xattrs_and_keeps_the_rest() {
    let disk = fresh(8);
    let mut s = open(&disk);
    let ino = file(&mut s, b"f");
    let mut want = BTreeMap::new();
    let mut refused = 0;
    for i in 0..400 {
        let name = format!("user.big{i}").into_bytes();
        match s.setxattr(ino, &name, &value(XATTR_SIZE_MAX, i), t(3)) {
            Ok(()) => {
                want.insert(name, value(XATTR_SIZE_MAX, i));
            }
            Err(e) => {
                assert_eq!(e.errno(), 28, "{e}");
                assert_eq!(errno(s.getxattr(ino, &name)), Some(61), "a refused setxattr leaves nothing");
                refused += 1;
            }
        }
    }
    assert!(refused > 0 && want.len() > 20, "{} stored, {refused} refused", want.len());
    assert_xattrs(&mut s, ino, &want, "full");
    let mut s = reopen(s, &disk);
    assert_xattrs(&mut s, ino, &want, "full, reopened");
    // Removing them all frees the space again.
    for n in want.keys() {
        s.removexattr(ino, n, t(4)).expect("remove");
    }
    s.commit().expect("commit");
    s.setxattr(ino, b"user.again", &value(XATTR_SIZE_MAX, 1), t(4)).expect("room again");
    drop(reopen(s, &disk));
}

/// Rewrites, in every fs-tree leaf of `img` holding the item `key`, that item's key and
/// value bytes with `f`, and reseals the leaf (what a buggy writer would leave).
fn patch_item(img: &mut [u8], key: Key, f: impl Fn(&mut [u8], &mut [u8])) -> usize {
    let mut patched = 0;
    for block in img.chunks_mut(BLOCK_SIZE) {
        let owner = u64::from_le_bytes(block[64..72].try_into().expect("8 bytes"));
        let crc = u32::from_le_bytes(block[0..4].try_into().expect("4 bytes"));
        if owner != FS_TREE_ID || block[72] != 0 || crc != crc32c(&block[32..]) {
            continue;
        }
        let n = usize::from(u16::from_le_bytes([block[74], block[75]]));
        for i in 0..n.min(191) {
            let at = 80 + 21 * i;
            if Key::decode(&block[at..at + 17]) != key {
                continue;
            }
            let off = usize::from(u16::from_le_bytes([block[at + 17], block[at + 18]]));
            let len = usize::from(u16::from_le_bytes([block[at + 19], block[at + 20]]));
            let (head, values) = block.split_at_mut(off);
            f(&mut head[at..at + 17], &mut values[..len]);
            patched += 1;
        }
        let c = crc32c(&block[32..]);
        block[0..4].copy_from_slice(&c.to_le_bytes());
    }
    patched
}

/// An image with one big xattr on the newest inode, and where its chunks are.
fn big_xattr_image() -> (Vec<u8>, u64, u64) {
    let disk = fresh(8);
    let mut s = open(&disk);
    let ino = file(&mut s, b"f");
    s.setxattr(ino, b"user.big", &value(10_000, 1), t(3)).expect("setxattr");
    s.commit().expect("commit");
    drop(s);
    assert_clean(&disk);
    (disk.snapshot(), ino, xattr::preferred_chunk_id(name_hash(b"user.big")))
}

fn fsck_finds(img: Vec<u8>, needles: &[&str]) {
    let report = fsck_bytes(img.clone());
    for n in needles {
        assert!(report.problems.iter().any(|p| p.contains(n)), "fsck should report {n:?}: {:#?}", report.problems);
    }
    let mut s = Store::open(Box::new(MemDisk::from_bytes(img))).expect("open");
    let ino = s.lookup(ROOT_INO, b"f").expect("lookup").ino;
    let e = s.getxattr(ino, b"user.big").expect_err("a damaged value is not returned");
    assert!(e.is_corruption() && e.errno() == 5, "{e:?}");
}

#[test]
fn fsck_and_reads_catch_damaged_chunks() {
    let chunks = xattr::chunk_count(10_000);
    // A chunk claiming another owner.
    let (mut img, ino, id) = big_xattr_image();
    assert!(patch_item(&mut img, xattr::chunk_key(ino, id, 1), |_, v| v[0] ^= 1) > 0);
    fsck_finds(img, &["disagrees with the xattr naming it", &format!("has {} of {chunks} chunks", chunks - 1)]);
    // The last chunk moved to a chunk id nobody names: an orphan, and one missing.
    let (mut img, ino, id) = big_xattr_image();
    assert!(
        patch_item(&mut img, xattr::chunk_key(ino, id, chunks - 1), |k, _| k[9..17]
            .copy_from_slice(&(xattr::chunk_key(ino, id + 1, chunks - 1).offset).to_le_bytes()))
            > 0
    );
    fsck_finds(img, &["belongs to no xattr", &format!("has {} of {chunks} chunks", chunks - 1)]);
    // A chunk whose header says another length: it holds the wrong number of bytes.
    let (mut img, ino, id) = big_xattr_image();
    assert!(patch_item(&mut img, xattr::chunk_key(ino, id, chunks - 1), |_, v| v[8] ^= 4) > 0);
    fsck_finds(img, &["wrong number of bytes"]);
}

/// The inode's ACL flags follow the ACL xattrs through set, replace, remove and reopen,
/// and fsck reports an inode whose flags disagree with its xattrs either way.
#[test]
fn acl_flags_follow_the_acl_xattrs() {
    use crest_store::fs::inode::{FLAG_ACL_ACCESS, FLAG_ACL_DEFAULT};
    const ACCESS: &[u8] = b"system.posix_acl_access";
    const DEFAULT: &[u8] = b"system.posix_acl_default";
    let disk = fresh(8);
    let mut s = open(&disk);
    let ino = file(&mut s, b"f");
    let flags = |s: &mut Store| s.getattr(ino).expect("getattr").flags;
    assert_eq!(flags(&mut s), 0);
    s.setxattr(ino, b"user.x", b"1", t(3)).expect("setxattr");
    assert_eq!(flags(&mut s), 0, "other xattrs set no flag");
    s.setxattr(ino, ACCESS, &value(28, 1), t(3)).expect("setxattr");
    s.setxattr(ino, DEFAULT, &value(44, 2), t(3)).expect("setxattr");
    s.setxattr(ino, ACCESS, &value(36, 3), t(3)).expect("replace");
    assert_eq!(flags(&mut s), FLAG_ACL_ACCESS | FLAG_ACL_DEFAULT);
    let mut s = reopen(s, &disk);
    assert_eq!(flags(&mut s), FLAG_ACL_ACCESS | FLAG_ACL_DEFAULT, "kept on disk");
    s.removexattr(ino, ACCESS, t(4)).expect("removexattr");
    assert_eq!(flags(&mut s), FLAG_ACL_DEFAULT);
    s.removexattr(ino, b"user.x", t(4)).expect("removexattr");
    assert_eq!(flags(&mut s), FLAG_ACL_DEFAULT);
    s.commit().expect("commit");
    drop(s);
    assert_clean(&disk);

    // A flag without its xattr, and an xattr without its flag.
    let inode_key = Key::new(ino, crest_store::key::kind::INODE, 0);
    for (flip, needle) in [(FLAG_ACL_ACCESS, "ACL flags 0x3"), (FLAG_ACL_DEFAULT, "ACL flags 0x0")] {
        let mut img = disk.snapshot();
        assert!(patch_item(&mut img, inode_key, |_, v| v[28] ^= flip as u8) > 0);
        let report = fsck_bytes(img);
        assert!(
            report.problems.iter().any(|p| p.contains(needle) && p.contains("its ACL xattrs say 0x2")),
            "{:#?}",
            report.problems
        );
    }
}
