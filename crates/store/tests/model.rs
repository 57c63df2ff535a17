//! Property test: random sequences of namespace and data operations run against the store
//! and against a small in-memory model of a POSIX file system. Every operation's outcome
//! (success or errno) must agree; after commits and after reopening the image the whole
//! namespace (paths, types, modes, owners, sizes, link counts, bytes, xattrs) must equal
//! the model's, and fsck must be clean.

mod common;
use std::collections::{BTreeMap, HashMap};

use common::*;
use crest_store::{Error, FallocateMode, FileKind, MemDisk, RenameFlags, SetAttr, Store, ROOT_INO};
use proptest::prelude::*;

const NAMES: [&str; 5] = ["a", "b", "c", "dd", "e"];

#[derive(Clone, Debug)]
enum Act {
    Create { dir: usize, name: usize, kind: u8, mode: u32 },
    Symlink { dir: usize, name: usize, len: usize },
    Link { src: usize, dir: usize, name: usize },
    Unlink { dir: usize, name: usize },
    Rmdir { dir: usize, name: usize },
    Rename { dir: usize, name: usize, dir2: usize, name2: usize, flags: u8 },
    Write { file: usize, offset: u64, len: usize, byte: u8 },
    Truncate { file: usize, size: u64 },
    Punch { file: usize, offset: u64, len: u64 },
    Chmod { file: usize, mode: u32, uid: u32 },
    SetXattr { file: usize, name: usize, len: usize },
    RemoveXattr { file: usize, name: usize },
    Commit,
    Reopen,
}

fn act() -> impl Strategy<Value = Act> {
    let sel = 0usize..16;
    let name = 0usize..NAMES.len();
    prop_oneof![
        6 => (sel.clone(), name.clone(), 0u8..4, 0u32..0o7777).prop_map(|(dir, name, kind, mode)| Act::Create { dir, name, kind, mode }),
        1 => (sel.clone(), name.clone(), prop_oneof![1usize..50, 1000usize..4095]).prop_map(|(dir, name, len)| Act::Symlink { dir, name, len }),
        1 => (sel.clone(), sel.clone(), name.clone()).prop_map(|(src, dir, name)| Act::Link { src, dir, name }),
        2 => (sel.clone(), name.clone()).prop_map(|(dir, name)| Act::Unlink { dir, name }),
        1 => (sel.clone(), name.clone()).prop_map(|(dir, name)| Act::Rmdir { dir, name }),
        2 => (sel.clone(), name.clone(), sel.clone(), name.clone(), 0u8..3).prop_map(|(dir, name, dir2, name2, flags)| Act::Rename { dir, name, dir2, name2, flags }),
        6 => (sel.clone(), prop_oneof![0u64..2000, 0u64..300_000], prop_oneof![1usize..100, 1usize..20_000, 100_000usize..1_200_000], any::<u8>())
            .prop_map(|(file, offset, len, byte)| Act::Write { file, offset, len, byte }),
        2 => (sel.clone(), prop_oneof![0u64..2000, 0u64..600_000]).prop_map(|(file, size)| Act::Truncate { file, size }),
        1 => (sel.clone(), 0u64..300_000, 1u64..100_000).prop_map(|(file, offset, len)| Act::Punch { file, offset, len }),
        1 => (sel.clone(), 0u32..0o7777, 0u32..3).prop_map(|(file, mode, uid)| Act::Chmod { file, mode, uid }),
        2 => (sel.clone(), name.clone(), prop_oneof![0usize..600, 1700usize..1900, 1usize..=65_536]).prop_map(|(file, name, len)| Act::SetXattr { file, name, len }),
        1 => (sel.clone(), name).prop_map(|(file, name)| Act::RemoveXattr { file, name }),
        1 => Just(Act::Commit),
        1 => Just(Act::Reopen),
    ]
}

#[derive(Clone, Debug)]
struct MNode {
    kind: FileKind,
    mode: u32,
    uid: u32,
    data: Vec<u8>,
    nlink: u32,
    xattrs: BTreeMap<Vec<u8>, Vec<u8>>,
}

/// The reference: inodes with the same numbers the store hands out (both count from 2).
#[derive(Clone, Debug, Default)]
struct Model {
    nodes: HashMap<u64, MNode>,
    dirs: HashMap<u64, BTreeMap<Vec<u8>, u64>>,
    parent: HashMap<u64, u64>,
    next_ino: u64,
}

type R = Result<(), i32>;

impl Model {
    fn new() -> Model {
        let mut m = Model { next_ino: 2, ..Default::default() };
        m.nodes.insert(
            ROOT_INO,
            MNode { kind: FileKind::Directory, mode: 0o755, uid: 0, data: vec![], nlink: 2, xattrs: BTreeMap::new() },
        );
        m.dirs.insert(ROOT_INO, BTreeMap::new());
        m.parent.insert(ROOT_INO, ROOT_INO);
        m
    }

    fn dirs_sorted(&self) -> Vec<u64> {
        let mut v: Vec<u64> = self.dirs.keys().copied().collect();
        v.sort_unstable();
        v
    }

    fn files_sorted(&self) -> Vec<u64> {
        let mut v: Vec<u64> = self.nodes.iter().filter(|(_, n)| n.kind == FileKind::Regular).map(|(i, _)| *i).collect();
        v.sort_unstable();
        v
    }

    fn all_sorted(&self) -> Vec<u64> {
        let mut v: Vec<u64> = self.nodes.keys().copied().collect();
        v.sort_unstable();
        v
    }

    fn new_node(&mut self, dir: u64, name: &[u8], node: MNode) -> u64 {
        let ino = self.next_ino;
        self.next_ino += 1;
        if node.kind == FileKind::Directory {
            self.dirs.insert(ino, BTreeMap::new());
            self.parent.insert(ino, dir);
            if let Some(d) = self.nodes.get_mut(&dir) {
                d.nlink += 1;
            }
        }
        self.nodes.insert(ino, node);
        self.dirs.get_mut(&dir).map(|d| d.insert(name.to_vec(), ino));
        ino
    }

    fn create(&mut self, dir: u64, name: &[u8], kind: FileKind, mode: u32) -> R {
        if self.dirs[&dir].contains_key(name) {
            return Err(17);
        }
        let nlink = if kind == FileKind::Directory { 2 } else { 1 };
        self.new_node(dir, name, MNode { kind, mode, uid: 0, data: vec![], nlink, xattrs: BTreeMap::new() });
        Ok(())
    }

    fn symlink(&mut self, dir: u64, name: &[u8], target: &[u8]) -> R {
        if self.dirs[&dir].contains_key(name) {
            return Err(17);
        }
        self.new_node(
            dir,
            name,
            MNode {
                kind: FileKind::Symlink,
                mode: 0o777,
                uid: 0,
                data: target.to_vec(),
                nlink: 1,
                xattrs: BTreeMap::new(),
            },
        );
        Ok(())
    }

    fn link(&mut self, ino: u64, dir: u64, name: &[u8]) -> R {
        if self.nodes[&ino].kind == FileKind::Directory {
            return Err(1);
        }
        if self.dirs[&dir].contains_key(name) {
            return Err(17);
        }
        self.dirs.get_mut(&dir).map(|d| d.insert(name.to_vec(), ino));
        if let Some(n) = self.nodes.get_mut(&ino) {
            n.nlink += 1;
        }
        Ok(())
    }

    fn drop_link(&mut self, ino: u64) {
        let Some(n) = self.nodes.get_mut(&ino) else { return };
        if n.kind == FileKind::Directory {
            n.nlink = 0;
        } else {
            n.nlink -= 1;
        }
        if n.nlink == 0 {
            self.nodes.remove(&ino);
            self.dirs.remove(&ino);
            self.parent.remove(&ino);
        }
    }

    fn unlink(&mut self, dir: u64, name: &[u8]) -> R {
        let ino = *self.dirs[&dir].get(name).ok_or(2)?;
        if self.nodes[&ino].kind == FileKind::Directory {
            return Err(21);
        }
        self.dirs.get_mut(&dir).map(|d| d.remove(name));
        self.drop_link(ino);
        Ok(())
    }

    fn rmdir(&mut self, dir: u64, name: &[u8]) -> R {
        let ino = *self.dirs[&dir].get(name).ok_or(2)?;
        if self.nodes[&ino].kind != FileKind::Directory {
            return Err(20);
        }
        if !self.dirs[&ino].is_empty() {
            return Err(39);
        }
        self.dirs.get_mut(&dir).map(|d| d.remove(name));
        if let Some(d) = self.nodes.get_mut(&dir) {
            d.nlink -= 1;
        }
        self.drop_link(ino);
        Ok(())
    }

    fn is_ancestor(&self, a: u64, mut d: u64) -> bool {
        loop {
            if d == a {
                return true;
            }
            if d == ROOT_INO {
                return false;
            }
            d = self.parent[&d];
        }
    }

    fn rename(&mut self, dir: u64, name: &[u8], dir2: u64, name2: &[u8], flags: RenameFlags) -> R {
        let src = *self.dirs[&dir].get(name).ok_or(2)?;
        let dst = self.dirs[&dir2].get(name2).copied();
        let is_dir = |m: &Model, i: u64| m.nodes[&i].kind == FileKind::Directory;
        if let Some(d) = dst {
            if flags.noreplace {
                return Err(17);
            }
            if d == src && !flags.exchange {
                return Ok(());
            }
        }
        if is_dir(self, src) && dir != dir2 && self.is_ancestor(src, dir2) {
            return Err(22);
        }
        if flags.exchange {
            let d = dst.ok_or(2)?;
            if is_dir(self, d) && dir != dir2 && self.is_ancestor(d, dir) {
                return Err(22);
            }
            self.dirs.get_mut(&dir).map(|m| m.insert(name.to_vec(), d));
            self.dirs.get_mut(&dir2).map(|m| m.insert(name2.to_vec(), src));
            if dir != dir2 {
                let delta = i64::from(is_dir(self, src)) - i64::from(is_dir(self, d));
                if let Some(n) = self.nodes.get_mut(&dir) {
                    n.nlink = (i64::from(n.nlink) - delta) as u32;
                }
                if let Some(n) = self.nodes.get_mut(&dir2) {
                    n.nlink = (i64::from(n.nlink) + delta) as u32;
                }
                if is_dir(self, src) {
                    self.parent.insert(src, dir2);
                }
                if is_dir(self, d) {
                    self.parent.insert(d, dir);
                }
            }
            return Ok(());
        }
        if let Some(d) = dst {
            if is_dir(self, src) {
                if !is_dir(self, d) {
                    return Err(20);
                }
                if !self.dirs[&d].is_empty() {
                    return Err(39);
                }
            } else if is_dir(self, d) {
                return Err(21);
            }
        }
        self.dirs.get_mut(&dir).map(|m| m.remove(name));
        if let Some(d) = dst {
            if is_dir(self, d) {
                if let Some(n) = self.nodes.get_mut(&dir2) {
                    n.nlink -= 1;
                }
            }
            self.drop_link(d);
        }
        self.dirs.get_mut(&dir2).map(|m| m.insert(name2.to_vec(), src));
        if is_dir(self, src) && dir != dir2 {
            if let Some(n) = self.nodes.get_mut(&dir) {
                n.nlink -= 1;
            }
            if let Some(n) = self.nodes.get_mut(&dir2) {
                n.nlink += 1;
            }
            self.parent.insert(src, dir2);
        }
        Ok(())
    }

    fn dump(&self) -> Dump {
        let mut out = BTreeMap::new();
        let mut stack = vec![(ROOT_INO, String::new())];
        while let Some((dir, path)) = stack.pop() {
            for (name, ino) in &self.dirs[&dir] {
                let n = &self.nodes[ino];
                let p = format!("{path}/{}", String::from_utf8_lossy(name));
                if n.kind == FileKind::Directory {
                    stack.push((*ino, p.clone()));
                }
                let size = if n.kind == FileKind::Directory { 0 } else { n.data.len() as u64 };
                out.insert(
                    p,
                    Entry {
                        kind: n.kind,
                        mode: n.mode,
                        uid: n.uid,
                        gid: 0,
                        size,
                        nlink: n.nlink,
                        content: n.data.clone(),
                        xattrs: n.xattrs.clone(),
                    },
                );
            }
        }
        out
    }
}

fn errno<T>(r: Result<T, Error>) -> R {
    r.map(|_| ()).map_err(|e| e.errno())
}

fn kind_of(k: u8) -> FileKind {
    [FileKind::Regular, FileKind::Directory, FileKind::Fifo, FileKind::Regular][k as usize]
}

fn run(acts: Vec<Act>) {
    let disk: MemDisk = fresh(128);
    let mut store = open(&disk);
    let mut model = Model::new();
    let now = t(10);
    for (step, a) in acts.into_iter().enumerate() {
        let dirs = model.dirs_sorted();
        let files = model.files_sorted();
        let all = model.all_sorted();
        let pick = |v: &Vec<u64>, i: usize| if v.is_empty() { None } else { Some(v[i % v.len()]) };
        let (got, want) = match a.clone() {
            Act::Create { dir, name, kind, mode } => {
                let d = dirs[dir % dirs.len()];
                let n = NAMES[name].as_bytes();
                (errno(store.create(d, n, kind_of(kind), mode, 0, 0, 0, now)), model.create(d, n, kind_of(kind), mode))
            }
            Act::Symlink { dir, name, len } => {
                let d = dirs[dir % dirs.len()];
                let n = NAMES[name].as_bytes();
                let target: Vec<u8> = (0..len).map(|i| b'a' + (i % 26) as u8).collect();
                (errno(store.symlink(d, n, &target, 0, 0, now)), model.symlink(d, n, &target))
            }
            Act::Link { src, dir, name } => {
                let s = all[src % all.len()];
                if s == ROOT_INO {
                    continue;
                }
                let d = dirs[dir % dirs.len()];
                let n = NAMES[name].as_bytes();
                (errno(store.link(s, d, n, now)), model.link(s, d, n))
            }
            Act::Unlink { dir, name } => {
                let d = dirs[dir % dirs.len()];
                let n = NAMES[name].as_bytes();
                (errno(store.unlink(d, n, now)), model.unlink(d, n))
            }
            Act::Rmdir { dir, name } => {
                let d = dirs[dir % dirs.len()];
                let n = NAMES[name].as_bytes();
                (errno(store.rmdir(d, n, now)), model.rmdir(d, n))
            }
            Act::Rename { dir, name, dir2, name2, flags } => {
                let d = dirs[dir % dirs.len()];
                let d2 = dirs[dir2 % dirs.len()];
                let (n, n2) = (NAMES[name].as_bytes(), NAMES[name2].as_bytes());
                let f = RenameFlags { noreplace: flags == 1, exchange: flags == 2 };
                (errno(store.rename(d, n, d2, n2, f, now)), model.rename(d, n, d2, n2, f))
            }
            Act::Write { file, offset, len, byte } => {
                let Some(f) = pick(&files, file) else { continue };
                let data: Vec<u8> = (0..len).map(|i| byte.wrapping_add((i / 4096) as u8)).collect();
                let got = errno(store.write(f, offset, &data, now));
                let m = model.nodes.get_mut(&f).map(|n| &mut n.data);
                if let Some(m) = m {
                    let end = offset as usize + len;
                    if m.len() < end {
                        m.resize(end, 0);
                    }
                    m[offset as usize..end].copy_from_slice(&data);
                }
                (got, Ok(()))
            }
            Act::Truncate { file, size } => {
                let Some(f) = pick(&files, file) else { continue };
                let got = errno(store.setattr(f, &SetAttr { size: Some(size), ..Default::default() }, now));
                if let Some(n) = model.nodes.get_mut(&f) {
                    n.data.resize(size as usize, 0);
                }
                (got, Ok(()))
            }
            Act::Punch { file, offset, len } => {
                let Some(f) = pick(&files, file) else { continue };
                let mode = FallocateMode { keep_size: true, punch_hole: true, zero_range: false };
                let got = errno(store.fallocate(f, offset, len, mode, now));
                if let Some(n) = model.nodes.get_mut(&f) {
                    let e = ((offset + len) as usize).min(n.data.len());
                    if (offset as usize) < e {
                        n.data[offset as usize..e].fill(0);
                    }
                }
                (got, Ok(()))
            }
            Act::Chmod { file, mode, uid } => {
                let Some(f) = pick(&all, file) else { continue };
                let got =
                    errno(store.setattr(f, &SetAttr { mode: Some(mode), uid: Some(uid), ..Default::default() }, now));
                if let Some(n) = model.nodes.get_mut(&f) {
                    n.mode = mode;
                    n.uid = uid;
                }
                (got, Ok(()))
            }
            Act::SetXattr { file, name, len } => {
                let Some(f) = pick(&all, file) else { continue };
                let key = format!("user.{}", NAMES[name]).into_bytes();
                // Position-dependent bytes: a chunk read in the wrong order shows.
                let value: Vec<u8> = (0..len).map(|i| (i as u8) ^ (i >> 8) as u8 ^ name as u8).collect();
                let got = errno(store.setxattr(f, &key, &value, now));
                model.nodes.get_mut(&f).map(|n| n.xattrs.insert(key, value));
                (got, Ok(()))
            }
            Act::RemoveXattr { file, name } => {
                let Some(f) = pick(&all, file) else { continue };
                let key = format!("user.{}", NAMES[name]).into_bytes();
                let want = match model.nodes.get_mut(&f).and_then(|n| n.xattrs.remove(&key)) {
                    Some(_) => Ok(()),
                    None => Err(61),
                };
                (errno(store.removexattr(f, &key, now)), want)
            }
            Act::Commit => {
                store.commit().expect("commit");
                (Ok(()), Ok(()))
            }
            Act::Reopen => {
                store.commit().expect("commit");
                drop(store);
                store = open(&disk);
                assert_same(&dump(&mut store), &model.dump(), &format!("after reopen at step {step}"));
                (Ok(()), Ok(()))
            }
        };
        assert_eq!(got, want, "step {step}: {a:?}");
    }
    assert_same(&dump(&mut store), &model.dump(), "at the end");
    store.commit().expect("commit");
    drop(store);
    assert_clean(&disk);
    let mut store: Store = open(&disk);
    assert_same(&dump(&mut store), &model.dump(), "after the final reopen");
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, max_shrink_iters: 2000, ..ProptestConfig::default() })]
    #[test]
    fn store_matches_model(acts in proptest::collection::vec(act(), 1..120)) {
        run(acts);
    }
}
