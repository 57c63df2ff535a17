//! fsck against images damaged on purpose, one invariant at a time: each damage is
//! written into the fs tree as the store would write a real item, and committed (its
//! checksums are good), so only the namespace checks can find it.
#![allow(clippy::unwrap_used)]

use crate::disk::MemDisk;
use crate::engine::key::Key;
use crate::fs::dirent::{encode_entries, encode_index, entry_key, index_key, DirEntry};
use crate::fs::extent::Extent;
use crate::fs::inode::{FileKind, Inode, Timespec, ROOT_INO};
use crate::fs::keys::{kind, ORPHAN_OBJECTID};
use crate::store::{MkfsOptions, Store};

fn now() -> Timespec {
    Timespec::new(100, 0)
}

/// An image with /d (a directory), /d/f (a file of two blocks), /g (a file of 100 bytes),
/// /h (an empty file) and /l (a symlink), and the store on it.
fn image() -> (MemDisk, Store, [u64; 5]) {
    let disk = MemDisk::new(16 << 20);
    let opts = MkfsOptions { now: now(), fsid: Some([3; 16]), seed: None, meta_copies: 2 };
    Store::mkfs(Box::new(disk.clone()), &opts).unwrap();
    let mut s = Store::open(Box::new(disk.clone())).unwrap();
    let d = s.create(ROOT_INO, b"d", FileKind::Directory, 0o755, 0, 0, 0, now()).unwrap().ino;
    let f = s.create(d, b"f", FileKind::Regular, 0o644, 0, 0, 0, now()).unwrap().ino;
    s.write(f, 0, &[5u8; 8192], now()).unwrap();
    let g = s.create(ROOT_INO, b"g", FileKind::Regular, 0o644, 0, 0, 0, now()).unwrap().ino;
    s.write(g, 0, &[6u8; 100], now()).unwrap();
    let h = s.create(ROOT_INO, b"h", FileKind::Regular, 0o644, 0, 0, 0, now()).unwrap().ino;
    let l = s.symlink(ROOT_INO, b"l", b"target", 0, 0, now()).unwrap().ino;
    s.commit().unwrap();
    (disk, s, [d, f, g, h, l])
}

fn put(s: &mut Store, key: Key, value: Vec<u8>) {
    s.fs.insert(&mut s.pager, key, value).unwrap();
}

fn inode(s: &mut Store, ino: u64) -> Inode {
    s.getattr(ino).unwrap()
}

fn set_inode(s: &mut Store, i: &Inode) {
    put(s, Inode::key(i.ino), i.encode());
}

/// Adds an entry `name` → `ino` (said to be a `kind`) to directory `d`, with its index
/// item and the directory's size and next index, as a real entry would be.
fn add_entry(s: &mut Store, d: u64, name: &[u8], ino: u64, kind: FileKind) {
    let mut dir = inode(s, d);
    let e = DirEntry { name: name.to_vec(), ino, kind, index: dir.next_index };
    put(s, entry_key(d, name), encode_entries(std::slice::from_ref(&e)));
    put(s, index_key(d, e.index), encode_index(&e));
    dir.next_index += 1;
    dir.size += 1;
    set_inode(s, &dir);
}

/// Commits the damage and runs fsck: it must name a problem containing every needle.
fn finds(disk: &MemDisk, mut s: Store, needles: &[&str]) {
    s.commit().unwrap();
    drop(s);
    let report = super::fsck(Box::new(disk.clone())).unwrap();
    assert!(
        report.problems.iter().any(|p| needles.iter().all(|n| p.contains(n))),
        "fsck should report {needles:?}; it reported {:#?}",
        report.problems
    );
}

#[test]
fn an_undamaged_image_is_clean() {
    let (disk, s, _) = image();
    drop(s);
    let report = super::fsck(Box::new(disk)).unwrap();
    assert!(report.is_clean(), "{:#?}", report.problems);
    assert_eq!((report.inodes, report.directories), (6, 2));
}

#[test]
fn an_entry_naming_no_inode_is_reported_with_its_name() {
    let (disk, mut s, [d, ..]) = image();
    add_entry(&mut s, d, b"ghost", 999_999, FileKind::Regular);
    finds(&disk, s, &[&format!("dir {d}: entry \"ghost\" names missing inode 999999")]);
}

#[test]
fn an_entry_of_the_wrong_kind_is_reported() {
    let (disk, mut s, [d, _, g, ..]) = image();
    add_entry(&mut s, d, b"alias", g, FileKind::Directory);
    finds(&disk, s, &[&format!("entry \"alias\" says Directory, inode {g} is Regular")]);
}

#[test]
fn link_counts_are_counted_across_directories() {
    // A second name for /g in /d, its nlink left at 1.
    let (disk, mut s, [d, _, g, ..]) = image();
    add_entry(&mut s, d, b"g2", g, FileKind::Regular);
    finds(&disk, s, &[&format!("inode {g}: nlink 1 but 2 entries name it")]);
}

#[test]
fn a_directory_link_count_counts_its_subdirectories() {
    let (disk, mut s, _) = image();
    let mut root = inode(&mut s, ROOT_INO);
    root.nlink += 1;
    set_inode(&mut s, &root);
    finds(&disk, s, &[&format!("dir {ROOT_INO}: nlink 4 but 3 expected")]);
}

#[test]
fn a_directory_recording_another_parent_is_reported() {
    let (disk, mut s, [d, _, _, h, _]) = image();
    let mut dir = inode(&mut s, d);
    dir.parent = h;
    set_inode(&mut s, &dir);
    finds(&disk, s, &[&format!("dir {d} is named in dir {ROOT_INO} but records parent {h}")]);
}

#[test]
fn an_unlinked_inode_off_the_orphan_list_is_reported() {
    let (disk, mut s, [_, _, _, h, _]) = image();
    s.fs.delete(&mut s.pager, &entry_key(ROOT_INO, b"h")).unwrap();
    let mut root = inode(&mut s, ROOT_INO);
    let index = (0..root.next_index).find(|i| {
        let v = s.fs.get(&mut s.pager, &index_key(ROOT_INO, *i)).unwrap();
        v.is_some_and(|v| crate::fs::dirent::decode_index(index_key(ROOT_INO, *i), &v, 0).unwrap().ino == h)
    });
    s.fs.delete(&mut s.pager, &index_key(ROOT_INO, index.unwrap())).unwrap();
    root.size -= 1;
    set_inode(&mut s, &root);
    let mut file = inode(&mut s, h);
    file.nlink = 0;
    set_inode(&mut s, &file);
    finds(&disk, s, &[&format!("inode {h} has no links and is not on the orphan list")]);
}

#[test]
fn an_orphan_list_naming_a_linked_inode_is_reported() {
    let (disk, mut s, [_, _, g, ..]) = image();
    put(&mut s, Key::new(ORPHAN_OBJECTID, kind::ORPHAN, g), Vec::new());
    finds(&disk, s, &[&format!("orphan list names inode {g}, which is missing or still linked")]);
}

#[test]
fn a_directory_size_is_its_entry_count() {
    let (disk, mut s, [d, ..]) = image();
    let mut dir = inode(&mut s, d);
    dir.size = 7;
    set_inode(&mut s, &dir);
    finds(&disk, s, &[&format!("dir {d}: size 7 but 1 entries")]);
}

#[test]
fn blocks_mapped_by_two_files_of_one_tree_are_reported() {
    // /h gets an extent over /d/f's blocks (and their sizes agree): mapped twice.
    let (disk, mut s, [_, f, _, h, _]) = image();
    let key = Key::new(f, kind::EXTENT, 0);
    let v = s.fs.get(&mut s.pager, &key).unwrap().unwrap();
    let Extent::Regular { disk_block, .. } = Extent::decode(key, &v, u64::MAX).unwrap() else { panic!("inline") };
    put(&mut s, Key::new(h, kind::EXTENT, 0), v);
    let mut file = inode(&mut s, h);
    file.size = 8192;
    file.blocks = 2;
    set_inode(&mut s, &file);
    finds(&disk, s, &[&format!("block {disk_block} is mapped more than once in one tree")]);
}

#[test]
fn data_blocks_without_a_refcount_are_reported() {
    let (disk, mut s, [_, f, ..]) = image();
    let key = Key::new(f, kind::EXTENT, 0);
    let v = s.fs.get(&mut s.pager, &key).unwrap().unwrap();
    let Extent::Regular { disk_block, .. } = Extent::decode(key, &v, u64::MAX).unwrap() else { panic!("inline") };
    s.refcount_tree.delete(&mut s.pager, &Key::new(disk_block, kind::EXTENT_REF, 2)).unwrap().unwrap();
    finds(&disk, s, &["data blocks are referenced by extents but have no refcount"]);
}

#[test]
fn an_xattr_of_no_inode_is_reported() {
    let (disk, mut s, [_, _, g, ..]) = image();
    s.setxattr(g, b"user.x", b"1", now()).unwrap();
    let key = crate::fs::xattr::xattr_key(g, b"user.x");
    let v = s.fs.get(&mut s.pager, &key).unwrap().unwrap();
    put(&mut s, Key::new(777_777, kind::XATTR, key.offset), v);
    finds(&disk, s, &["xattr of missing inode 777777"]);
}

/// A dataset `ds` with a file of `blocks` blocks, committed, and the default dataset
/// active again (so `ds` is parked: a commit leaves its items as they are).
fn parked_dataset(blocks: usize) -> (MemDisk, Store, u64) {
    let (disk, mut s, _) = image();
    let d = s.create_dataset("ds", Default::default(), (0o755, 0, 0), now()).unwrap();
    let root = crate::datasets::root_of(d);
    let f = s.create(root, b"big", FileKind::Regular, 0o644, 0, 0, 0, now()).unwrap().ino;
    s.write(f, 0, &vec![1u8; blocks * 4096], now()).unwrap();
    s.commit().unwrap();
    s.getattr(ROOT_INO).unwrap();
    (disk, s, d)
}

fn usage_of(s: &mut Store, d: u64) -> (u64, u64, u64) {
    let key = crate::store::usage_key(crate::datasets::tree_id(d));
    crate::store::decode_usage(&s.root_tree.get(&mut s.pager, &key).unwrap().unwrap()).unwrap()
}

/// Writes dataset `d`'s USAGE item as counted at root `(block, generation)`.
fn set_usage(s: &mut Store, d: u64, block: u64, generation: u64, blocks: u64) {
    let root = crate::engine::node::BlockPtr { block, generation, ..Default::default() };
    let key = crate::store::usage_key(crate::datasets::tree_id(d));
    s.root_tree.insert(&mut s.pager, key, crate::store::encode_usage(&root, blocks)).unwrap();
}

/// Dataset `d`'s usage as the image opens, once fsck has found it clean.
fn usage_when_reopened(disk: &MemDisk, d: u64) -> u64 {
    let report = super::fsck(Box::new(disk.clone())).unwrap();
    assert!(report.is_clean(), "{:#?}", report.problems);
    Store::open(Box::new(disk.clone())).unwrap().dataset_used_blocks(d)
}

#[test]
fn each_commit_keeps_a_live_datasets_usage_with_its_root_and_open_takes_it() {
    let (disk, mut s, d) = parked_dataset(3);
    let (_, _, blocks) = usage_of(&mut s, d);
    assert_eq!(blocks, 3);
    drop(s);
    assert_eq!(usage_when_reopened(&disk, d), 3);
}

#[test]
fn a_usage_item_of_another_root_is_not_trusted() {
    // As a crest that predates USAGE items leaves one: its commits moved the root.
    let (disk, mut s, d) = parked_dataset(3);
    let (block, generation, _) = usage_of(&mut s, d);
    set_usage(&mut s, d, block + 1, generation, 999);
    s.commit().unwrap();
    drop(s);
    // (fsck clean: a stale usage item is no damage.)
    assert_eq!(usage_when_reopened(&disk, d), 3, "counted in the leaves, not taken from the stale item");
}

#[test]
fn a_usage_item_that_disagrees_with_the_extents_is_reported() {
    let (disk, mut s, d) = parked_dataset(3);
    let (block, generation, _) = usage_of(&mut s, d);
    set_usage(&mut s, d, block, generation, 7);
    finds(&disk, s, &[&format!("dataset {d}: its usage item says 7 data blocks; its extents map 3")]);
}

#[test]
fn an_orphan_in_a_damaged_older_leaf_stays_on_the_orphan_list_when_the_image_opens() {
    use crate::disk::Disk;
    let disk = MemDisk::new(16 << 20);
    let opts = MkfsOptions { now: now(), fsid: Some([4; 16]), seed: None, meta_copies: 1 };
    Store::mkfs(Box::new(disk.clone()), &opts).unwrap();
    let mut s = Store::open(Box::new(disk.clone())).unwrap();
    // Items sort by inode: the fillers' directory, the victim, the fillers, then `late`,
    // where the later commits work, far from the victim's leaf.
    let sub = s.create(ROOT_INO, b"sub", FileKind::Directory, 0o755, 0, 0, 0, now()).unwrap().ino;
    let victim = s.create(ROOT_INO, b"victim", FileKind::Regular, 0o644, 0, 0, 0, now()).unwrap().ino;
    for i in 0..400 {
        s.create(sub, format!("filler-{i:04}").as_bytes(), FileKind::Regular, 0o644, 0, 0, 0, now()).unwrap();
    }
    let late = s.create(ROOT_INO, b"late", FileKind::Directory, 0o755, 0, 0, 0, now()).unwrap().ino;
    s.open_handle(victim).unwrap();
    s.unlink(ROOT_INO, b"victim", now()).unwrap();
    s.commit().unwrap();
    for i in 0..3 {
        s.create(late, format!("later-{i}").as_bytes(), FileKind::Regular, 0o644, 0, 0, 0, now()).unwrap();
        s.commit().unwrap();
    }
    let mut leaf = None;
    crate::store::walk_nodes(&mut s.pager, &s.fs.clone(), &mut |ptr, node| {
        if let crate::engine::node::Body::Leaf(items) = &node.body {
            if items.iter().any(|(k, _)| *k == Inode::key(victim)) {
                leaf = Some((ptr.block, ptr.generation));
            }
        }
        Ok(())
    })
    .unwrap();
    let (block, born) = leaf.unwrap();
    assert!(born < s.generation(), "the victim's leaf must be older than the last commit");
    drop(s);
    let mut raw = disk.clone();
    let mut byte = [0u8; 1];
    raw.read_at(block * 4096 + 2000, &mut byte).unwrap();
    raw.write_at(block * 4096 + 2000, &[byte[0] ^ 0x40]).unwrap();
    let mut s = Store::open(Box::new(disk.clone())).unwrap();
    assert!(s.orphans().unwrap().contains(&victim), "the orphan's record is kept for fsck");
}
