//! Helpers shared by the store's integration tests: images in memory, a canonical dump of
//! a whole file system (what "equal to the model" compares), and fsck.
#![allow(dead_code)]

use std::collections::BTreeMap;

use crest_store::{check, Disk, FileKind, MemDisk, MkfsOptions, Store, Timespec, ROOT_INO};

/// A time for tests.
pub fn t(sec: i64) -> Timespec {
    Timespec::new(sec, 123_456_789)
}

/// A fresh image of `mib` MiB in memory.
pub fn fresh(mib: u64) -> MemDisk {
    fresh_with_copies(mib, 2)
}

/// A fresh image keeping `copies` copies of its metadata (1, or 2 as `crest mkfs` does).
pub fn fresh_with_copies(mib: u64, copies: u8) -> MemDisk {
    let disk = MemDisk::new(mib << 20);
    let opts = MkfsOptions { now: t(1), fsid: Some([7; 16]), seed: None, meta_copies: copies };
    Store::mkfs(Box::new(disk.clone()), &opts).expect("mkfs");
    disk
}

/// Opens an image held in memory.
pub fn open(disk: &MemDisk) -> Store {
    Store::open(Box::new(disk.clone())).expect("open")
}

/// What one path holds, everything a user could observe except inode numbers and times.
#[derive(Clone, PartialEq, Eq)]
pub struct Entry {
    pub kind: FileKind,
    pub mode: u32,
    pub uid: u32,
    pub gid: u32,
    pub size: u64,
    pub nlink: u32,
    pub content: Vec<u8>,
    pub xattrs: BTreeMap<Vec<u8>, Vec<u8>>,
}

impl std::fmt::Debug for Entry {
    // Content is summarised (length, checksum, first non-zero byte) so failures stay readable.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let first_nz = self.content.iter().position(|&b| b != 0);
        write!(
            f,
            "{:?} mode {:o} uid {} gid {} size {} nlink {} content[len {} crc {:08x} first non-zero at {:?}] xattrs {:?}",
            self.kind,
            self.mode,
            self.uid,
            self.gid,
            self.size,
            self.nlink,
            self.content.len(),
            crest_store::checksum::crc32c(&self.content),
            first_nz,
            self.xattrs.iter().map(|(k, v)| (String::from_utf8_lossy(k).into_owned(), v.len())).collect::<Vec<_>>()
        )
    }
}

/// Panics with the paths that differ (not whole dumps) when two dumps disagree.
pub fn assert_same(got: &Dump, want: &Dump, context: &str) {
    if got == want {
        return;
    }
    let mut diffs = Vec::new();
    for (p, w) in want {
        match got.get(p) {
            None => diffs.push(format!("missing {p}: want {w:?}")),
            Some(g) if g != w => {
                let at = g.content.iter().zip(&w.content).position(|(a, b)| a != b);
                diffs.push(format!("{p}:\n   got  {g:?}\n   want {w:?}\n   first differing byte {at:?}"));
            }
            _ => {}
        }
    }
    for (p, g) in got {
        if !want.contains_key(p) {
            diffs.push(format!("extra {p}: {g:?}"));
        }
    }
    diffs.truncate(10);
    panic!("{context}: namespaces differ:\n{}", diffs.join("\n"));
}

/// The whole namespace as path → entry.
pub type Dump = BTreeMap<String, Entry>;

/// Dumps every reachable path of every dataset (the default one's paths bare, another's
/// behind `name:`).
pub fn dump(store: &mut Store) -> Dump {
    let mut out = BTreeMap::new();
    for d in store.datasets() {
        let prefix = if d.root == ROOT_INO { String::new() } else { format!("{}:", d.name) };
        // A snapshot is read through its dataset's numbers, with it as the view.
        let origin = store.origin_of(d.id);
        let root = crest_store::datasets::root_of(origin);
        store.set_view((origin != d.id).then_some(d.id));
        for (p, e) in dump_from(store, root) {
            out.insert(format!("{prefix}{p}"), e);
        }
        store.set_view(None);
    }
    out
}

/// Dumps every path reachable from directory `root`.
pub fn dump_from(store: &mut Store, root: u64) -> Dump {
    let mut out = BTreeMap::new();
    let mut stack = vec![(root, String::new())];
    while let Some((dir, path)) = stack.pop() {
        let mut from = 0;
        loop {
            let batch = store.readdir(dir, from, 100).expect("readdir");
            if batch.is_empty() {
                break;
            }
            for (e, inode) in batch {
                from = e.index + 1;
                let p = format!("{path}/{}", String::from_utf8_lossy(&e.name));
                let content = match inode.kind {
                    FileKind::Regular => store.read(inode.ino, 0, inode.size + 10).expect("read"),
                    FileKind::Symlink => store.readlink(inode.ino).expect("readlink"),
                    _ => Vec::new(),
                };
                let mut xattrs = BTreeMap::new();
                for n in store.listxattr(inode.ino).expect("listxattr") {
                    let v = store.getxattr(inode.ino, &n).expect("getxattr");
                    xattrs.insert(n, v);
                }
                if inode.kind == FileKind::Directory {
                    stack.push((inode.ino, p.clone()));
                }
                out.insert(
                    p,
                    Entry {
                        kind: inode.kind,
                        mode: inode.mode,
                        uid: inode.uid,
                        gid: inode.gid,
                        size: if inode.kind == FileKind::Directory { 0 } else { inode.size },
                        nlink: inode.nlink,
                        content,
                        xattrs,
                    },
                );
            }
        }
    }
    out
}

/// Runs fsck on a copy of the image and panics with the problems if any.
pub fn assert_clean(disk: &MemDisk) -> check::Report {
    let copy = MemDisk::from_bytes(disk.snapshot());
    let report = check::fsck(Box::new(copy)).expect("fsck ran");
    assert!(report.is_clean(), "fsck problems: {:#?}", report.problems);
    report
}

/// Runs fsck on raw image bytes.
pub fn fsck_bytes(bytes: Vec<u8>) -> check::Report {
    check::fsck(Box::new(MemDisk::from_bytes(bytes))).expect("fsck ran")
}

/// Size of a disk in bytes (for tests that need it through the trait).
pub fn size_of(d: &MemDisk) -> u64 {
    d.size_bytes()
}
