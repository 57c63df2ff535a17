//! One dataset's namespace, checked in one streaming pass over its fs tree.
//!
//! Memory stays small per inode, whatever the image's size: fs tree keys are
//! (inode, kind, offset), so every item of one inode (its INODE item first, then its
//! directory entries and index, xattrs, extents, xattr chunks) arrives together, and what
//! concerns that inode alone is checked as soon as its items are all in (`group`). Kept
//! for the end are only what relates inodes to each other: per inode its kind, parent and
//! link count (`Seen`), per directory entry its target and where it is (`Named`: the
//! entry's name is read again from the tree only to report a problem with it), the orphan
//! list, and the data block runs (`Run`). `finish` joins them: every entry names an inode
//! of its kind, link counts and directory link counts, parents, the orphan list.

use std::collections::{BTreeMap, HashMap};

use super::Checker;
use crate::engine::btree::Tree;
use crate::engine::key::Key;
use crate::error::{Error, Result};
use crate::fs::dirent::{decode_entries, decode_index, DirEntry};
use crate::fs::extent::Extent;
use crate::fs::inode::{FileKind, Inode};
use crate::fs::keys::{kind, ORPHAN_OBJECTID};
use crate::fs::xattr;
use crate::limits::{BLOCK_SIZE_U64, MAX_INLINE_BYTES, XATTR_LIST_MAX};

/// An inode as the checks across inodes need it.
#[derive(Clone, Copy)]
struct Seen {
    ino: u64,
    parent: u64,
    nlink: u32,
    kind: FileKind,
}

/// A directory entry as the checks across inodes need it.
struct Named {
    target: u64,
    dir: u64,
    /// Its DIR_ENTRY item's key offset (the name's hash): where to read the name again.
    hash: u64,
    kind: FileKind,
}

/// A run of data blocks an extent maps (one copy): (first block, blocks, inode, offset).
pub(super) type Run = (u64, u64, u64, u64);

/// What one dataset's fs tree held, as the pass goes.
pub(super) struct Namespace {
    /// The dataset whose inode numbers these are.
    d: u64,
    root_ino: u64,
    tree: Tree,
    inodes: Vec<Seen>,
    named: Vec<Named>,
    orphans: Vec<u64>,
    /// Index items and directory entries, in all.
    index_items: u64,
    entries: u64,
    /// Data block runs, both copies.
    pub(super) runs: Vec<Run>,
    /// The items of the inode being read.
    group: Vec<(Key, Vec<u8>)>,
    /// Directories among the inodes.
    pub(super) directories: u64,
}

/// An inode's items, decoded.
#[derive(Default)]
struct Items {
    inode: Option<Inode>,
    entries: Vec<(u64, DirEntry)>,
    index: HashMap<u64, DirEntry>,
    extents: Vec<(u64, Extent)>,
    xattrs: Vec<Xattr>,
    chunks: Vec<xattr::Chunk>,
}

/// One xattr as fsck sees it.
struct Xattr {
    hash: u64,
    name_len: usize,
    /// The inode flag its name keeps (`inode::xattr_flag`).
    flag: u32,
    /// Chunk id and value length of an out-of-line value.
    chunked: Option<(u64, usize)>,
}

impl Namespace {
    /// Dataset `d`'s namespace, read from `tree` (the dataset's, or a snapshot's).
    pub(super) fn new(d: u64, tree: Tree) -> Namespace {
        Namespace {
            d,
            root_ino: crate::datasets::root_of(d),
            tree,
            inodes: Vec::new(),
            named: Vec::new(),
            orphans: Vec::new(),
            index_items: 0,
            entries: 0,
            runs: Vec::new(),
            group: Vec::new(),
            directories: 0,
        }
    }

    /// The inodes found.
    pub(super) fn inode_count(&self) -> u64 {
        self.inodes.len() as u64
    }

    /// The next item of the tree, in key order.
    pub(super) fn item(&mut self, c: &mut Checker, k: Key, v: &[u8]) {
        if self.group.first().is_some_and(|(g, _)| g.objectid != k.objectid) {
            self.end_group(c);
        }
        self.group.push((k, v.to_vec()));
    }

    fn end_group(&mut self, c: &mut Checker) {
        let group = std::mem::take(&mut self.group);
        let Some(&(first, _)) = group.first() else { return };
        if first.objectid == ORPHAN_OBJECTID {
            for (k, v) in &group {
                if k.kind == kind::ORPHAN && v.is_empty() {
                    self.orphans.push(k.offset);
                } else {
                    c.problem(format!("fs tree: {}", Error::bad_item(*k, 0, "unknown item kind in fs tree")));
                }
            }
            return;
        }
        let items = decode(c, &group);
        self.inode(c, first.objectid, &items);
        self.group = group;
        self.group.clear();
    }

    /// What concerns inode `ino` alone, from its items; what relates it to others, kept.
    fn inode(&mut self, c: &mut Checker, ino: u64, items: &Items) {
        if let Some(i) = &items.inode {
            self.inodes.push(Seen { ino, parent: i.parent, nlink: i.nlink, kind: i.kind });
            if i.kind == FileKind::Directory {
                self.directories += 1;
                if i.size != items.entries.len() as u64 {
                    c.problem(format!("dir {ino}: size {} but {} entries", i.size, items.entries.len()));
                }
            }
        }
        self.index_items += items.index.len() as u64;
        self.entries += items.entries.len() as u64;
        for (hash, e) in &items.entries {
            match &items.inode {
                Some(d) if d.kind == FileKind::Directory => {
                    if e.index >= d.next_index {
                        c.problem(format!(
                            "dir {ino}: entry {:?} index {} not below next index {}",
                            String::from_utf8_lossy(&e.name),
                            e.index,
                            d.next_index
                        ));
                    }
                }
                _ => c.problem(format!("directory entries under inode {ino}, which is not a directory")),
            }
            match items.index.get(&e.index) {
                Some(i) if i.name == e.name && i.ino == e.ino && i.kind == e.kind => {}
                _ => c.problem(format!(
                    "dir {ino}: entry {:?} has no matching index item {}",
                    String::from_utf8_lossy(&e.name),
                    e.index
                )),
            }
            self.named.push(Named { target: e.ino, dir: ino, hash: *hash, kind: e.kind });
        }
        self.extents(c, ino, items);
        xattrs(c, ino, items);
    }

    /// The inode's extents against it; the blocks they map join `runs`.
    fn extents(&mut self, c: &mut Checker, ino: u64, items: &Items) {
        let mut prev_end: Option<u64> = None;
        let mut inline = false;
        let mut blocks = 0u64;
        for (off, e) in &items.extents {
            let Some(inode) = &items.inode else {
                c.problem(format!("extent at {off} of missing inode {ino}"));
                continue;
            };
            if !inode.kind.has_data() {
                c.problem(format!("extent at {off} of inode {ino}, a {:?}", inode.kind));
            }
            if prev_end.is_some_and(|end| end > *off) {
                c.problem(format!("inode {ino}: extents overlap at offset {off}"));
            }
            match e {
                Extent::Inline(data) => {
                    inline = true;
                    if inode.size > MAX_INLINE_BYTES as u64 || data.len() as u64 > inode.size {
                        c.problem(format!(
                            "inode {ino}: inline data of {} bytes in a file of {}",
                            data.len(),
                            inode.size
                        ));
                    }
                    prev_end = Some(data.len() as u64);
                }
                Extent::Regular { disk_block, twin, csums } => {
                    let n = csums.len() as u64;
                    let end = off + n * BLOCK_SIZE_U64;
                    if end > inode.size.div_ceil(BLOCK_SIZE_U64) * BLOCK_SIZE_U64 {
                        c.problem(format!("inode {ino}: extent at {off} runs past the file size {}", inode.size));
                    }
                    blocks += n;
                    for start in [*disk_block, *twin].into_iter().filter(|&b| b != 0) {
                        // (Verified once: a snapshot shares its dataset's extents, or pieces
                        // of them, so any block not seen yet makes the extent worth reading.)
                        // (An object's blocks are the data store's to check: `crest scrub`.)
                        let in_object = crate::fs::objects::object_of(start).is_some();
                        if !in_object && (start..start + n).any(|b| !c.referenced.get(b)) {
                            c.verify_data(ino, *off, start, csums);
                        }
                        self.runs.push((start, n, ino, *off));
                    }
                    prev_end = Some(end);
                }
            }
        }
        if inline && blocks > 0 {
            c.problem(format!("inode {ino}: inline data beside block extents"));
        }
        if let Some(i) = &items.inode {
            if i.blocks != blocks {
                c.problem(format!("inode {ino}: records {} blocks, extents map {blocks}", i.blocks));
            }
        }
    }

    /// After the last item: the checks across inodes. `next_ino` and `inode_count` are
    /// what the dataset's root item says.
    pub(super) fn finish(&mut self, c: &mut Checker, next_ino: u64, inode_count: u64) {
        self.end_group(c);
        // (In key order already, unless the tree's order is broken, which is reported.)
        self.inodes.sort_unstable_by_key(|s| s.ino);
        let d = self.d;
        if let (Some(lo), Some(hi)) = (self.inodes.first(), self.inodes.last()) {
            if lo.ino < self.root_ino || crate::datasets::dataset_of(hi.ino) != d {
                c.problem(format!("dataset {d}: inodes {}..={} outside its inode range", lo.ino, hi.ino));
            }
            if hi.ino >= next_ino {
                c.problem(format!("inode {} is not below the next inode number {next_ino}", hi.ino));
            }
        }
        if self.inodes.len() as u64 != inode_count {
            c.problem(format!("dataset counts {inode_count} inodes; {} found", self.inodes.len()));
        }
        let at = |inodes: &[Seen], ino: u64| inodes.binary_search_by_key(&ino, |s| s.ino).ok();
        match at(&self.inodes, self.root_ino).map(|i| self.inodes[i]) {
            Some(r) if r.kind == FileKind::Directory && r.parent == self.root_ino => {}
            _ => c.problem(format!("root directory (inode {}) missing or malformed", self.root_ino)),
        }
        if self.index_items != self.entries {
            c.problem(format!("{} index items for {} directory entries", self.index_items, self.entries));
        }
        // Links, directory link counts and parents from the entries.
        let mut links = vec![0u32; self.inodes.len()];
        let mut subdirs = vec![0u32; self.inodes.len()];
        let named = std::mem::take(&mut self.named);
        for n in &named {
            match at(&self.inodes, n.target) {
                Some(t) => {
                    let target = self.inodes[t];
                    links[t] += 1;
                    if target.kind != n.kind {
                        let name = self.name_of(c, n);
                        c.problem(format!(
                            "dir {}: entry {name:?} says {:?}, inode {} is {:?}",
                            n.dir, n.kind, n.target, target.kind
                        ));
                    } else if target.kind == FileKind::Directory {
                        if let Some(p) = at(&self.inodes, n.dir) {
                            subdirs[p] += 1;
                        }
                        if target.parent != n.dir {
                            c.problem(format!(
                                "dir {} is named in dir {} but records parent {}",
                                n.target, n.dir, target.parent
                            ));
                        }
                    }
                }
                None => {
                    let name = self.name_of(c, n);
                    c.problem(format!("dir {}: entry {name:?} names missing inode {}", n.dir, n.target));
                }
            }
        }
        let mut orphans = std::mem::take(&mut self.orphans);
        orphans.sort_unstable();
        for o in &orphans {
            match at(&self.inodes, *o).map(|i| self.inodes[i]) {
                Some(i) if i.nlink == 0 => {}
                _ => c.problem(format!("orphan list names inode {o}, which is missing or still linked")),
            }
        }
        for (n, i) in self.inodes.iter().enumerate() {
            let (ino, found) = (i.ino, links[n]);
            let orphan = orphans.binary_search(&ino).is_ok();
            if i.kind == FileKind::Directory {
                let expect = if i.nlink == 0 { 0 } else { 2 + subdirs[n] };
                if i.nlink != expect {
                    c.problem(format!("dir {ino}: nlink {} but {expect} expected", i.nlink));
                }
                let names = found + u32::from(ino == self.root_ino);
                if names != 1 && !(i.nlink == 0 && orphan && found == 0) {
                    c.problem(format!("dir {ino} is named by {found} entries"));
                }
            } else if i.nlink != found {
                c.problem(format!("inode {ino}: nlink {} but {found} entries name it", i.nlink));
            }
            if i.nlink == 0 && !orphan {
                c.problem(format!("inode {ino} has no links and is not on the orphan list"));
            }
        }
    }

    /// The name of entry `n`, read again from the tree (only to report it).
    fn name_of(&self, c: &mut Checker, n: &Named) -> String {
        let key = Key::new(n.dir, kind::DIR_ENTRY, n.hash);
        let found = self.tree.get(c.pager, &key).ok().flatten().and_then(|v| decode_entries(key, &v, 0).ok());
        match found.and_then(|es| es.into_iter().find(|e| e.ino == n.target)) {
            Some(e) => String::from_utf8_lossy(&e.name).into_owned(),
            None => format!("(hash {:#x})", n.hash),
        }
    }
}

/// Decodes one inode's items; what does not decode is a problem.
fn decode(c: &mut Checker, group: &[(Key, Vec<u8>)]) -> Items {
    let total = c.pager.total_blocks();
    let mut items = Items::default();
    for (k, v) in group {
        let r: Result<()> = (|| {
            match k.kind {
                kind::INODE if k.offset == 0 => items.inode = Some(Inode::decode(k.objectid, v, 0)?),
                kind::DIR_ENTRY => items.entries.extend(decode_entries(*k, v, 0)?.into_iter().map(|e| (k.offset, e))),
                kind::DIR_INDEX => {
                    items.index.insert(k.offset, decode_index(*k, v, 0)?);
                }
                kind::EXTENT => items.extents.push((k.offset, Extent::decode(*k, v, total)?)),
                kind::XATTR => items.xattrs.extend(xattr::decode(*k, v, 0)?.into_iter().map(|e| Xattr {
                    hash: k.offset,
                    name_len: e.name.len(),
                    flag: crate::fs::inode::xattr_flag(&e.name),
                    chunked: match e.value {
                        xattr::Value::Inline(_) => None,
                        xattr::Value::Chunked { len, id } => Some((id, len as usize)),
                    },
                })),
                kind::XATTR_CHUNK => items.chunks.push(xattr::decode_chunk(*k, v, 0)?),
                _ => return Err(Error::bad_item(*k, 0, "unknown item kind in fs tree")),
            }
            Ok(())
        })();
        if let Err(e) = r {
            c.problem(format!("fs tree: {e}"));
        }
    }
    items
}

/// An inode's xattrs against it and their chunks (the invariant of `fs/xattr.rs`): every
/// out-of-line record has a chunk id of its own and exactly its chunks, every chunk
/// belongs to such a record, and its names do not pass `XATTR_LIST_MAX`.
fn xattrs(c: &mut Checker, ino: u64, items: &Items) {
    let mut list_bytes = 0usize;
    let mut flags = 0u32;
    // chunk id → (owner hash, value length, chunks found)
    let mut owners: BTreeMap<u64, (u64, usize, usize)> = BTreeMap::new();
    for r in &items.xattrs {
        list_bytes += r.name_len + 1;
        flags |= r.flag;
        let Some((id, len)) = r.chunked else { continue };
        if owners.insert(id, (r.hash, len, 0)).is_some() {
            c.problem(format!("inode {ino}: xattr chunk id {id} named by two xattrs"));
        }
    }
    if !items.xattrs.is_empty() {
        if items.inode.is_none() {
            c.problem(format!("xattr of missing inode {ino}"));
        }
        if list_bytes > XATTR_LIST_MAX {
            c.problem(format!("inode {ino}: xattr names take {list_bytes} bytes (max {XATTR_LIST_MAX})"));
        }
    }
    if let Some(inode) = &items.inode {
        if inode.flags != flags {
            c.problem(format!("inode {ino}: ACL flags {:#x}, but its ACL xattrs say {flags:#x}", inode.flags));
        }
    }
    for ch in &items.chunks {
        match owners.get_mut(&ch.id) {
            Some((hash, len, found)) if *hash == ch.owner_hash && *len == ch.value_len => *found += 1,
            Some(_) => {
                c.problem(format!("inode {ino}: xattr chunk {}/{} disagrees with the xattr naming it", ch.id, ch.index))
            }
            None => c.problem(format!("inode {ino}: xattr chunk {}/{} belongs to no xattr", ch.id, ch.index)),
        }
    }
    for (id, (_, len, found)) in owners {
        // decode_chunk refuses indices past the value and keys are unique, so the count
        // says whether every chunk is there.
        if found != xattr::chunk_count(len) {
            c.problem(format!(
                "inode {ino}: xattr value of {len} bytes in chunk id {id} has {found} of {} chunks",
                xattr::chunk_count(len)
            ));
        }
    }
}
