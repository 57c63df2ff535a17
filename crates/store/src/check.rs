//! `crest fsck`: reads an image without changing it and checks every checksum and every
//! structural invariant the other modules promise — node headers and key order, parent
//! bounds, levels, reachability, no block used twice, reference counts against extents,
//! link counts against directory entries, directory sizes and parents, the orphan list,
//! inline and extent rules, per-dataset counters, and used blocks against the superblock.
//! Each problem is reported with where it is; a clean image has none.

use std::collections::{BTreeMap, HashMap};

use crate::datasets::DEFAULT_DATASET;
use crate::disk::Disk;
use crate::engine::alloc::Allocator;
use crate::engine::btree::Tree;
use crate::engine::key::Key;
use crate::engine::node::{BlockPtr, Body};
use crate::engine::pager::Pager;
use crate::error::{Error, Result};
use crate::fs::dirent::{decode_entries, decode_index, DirEntry};
use crate::fs::extent::Extent;
use crate::fs::inode::{FileKind, Inode};
use crate::fs::keys::{kind, ORPHAN_OBJECTID};
use crate::fs::xattr;
use crate::limits::{BLOCKS_PER_GROUP, BLOCK_SIZE, BLOCK_SIZE_U64, MAX_INLINE_BYTES, RESERVED_BLOCKS, XATTR_LIST_MAX};
use crate::store::{REFCOUNT_TREE_ID, ROOT_TREE_ID};

/// What fsck found.
#[derive(Clone, Debug, Default)]
pub struct Report {
    /// Generation checked.
    pub generation: u64,
    /// Inconsistencies; any makes the image unclean.
    pub problems: Vec<String>,
    /// Things worth knowing that are not damage (a stale superblock copy after a crash).
    pub notes: Vec<String>,
    /// Inodes found.
    pub inodes: u64,
    /// Directories among them.
    pub directories: u64,
    /// Tree nodes read.
    pub nodes: u64,
    /// Data blocks whose checksum was verified.
    pub data_blocks: u64,
    /// Blocks in use.
    pub used_blocks: u64,
    /// Blocks in the file system.
    pub total_blocks: u64,
    /// Client session records kept by the server.
    pub sessions: u64,
    /// Datasets (the default one included).
    pub datasets: u64,
}

impl Report {
    /// True when no problem was found.
    pub fn is_clean(&self) -> bool {
        self.problems.is_empty()
    }
}

/// Checks the image on `disk` (which is only read).
pub fn fsck(disk: Box<dyn Disk>) -> Result<Report> {
    let image_blocks = disk.size_bytes() / BLOCK_SIZE_U64;
    let mut report = Report::default();
    // A damaged copy (or mirror) is a problem even though open falls back to another: the
    // image has lost a second chance, and a commit only rewrites a copy every other
    // generation (a copy one generation older is normal and is not reported).
    let (mut sbs, damaged) = crate::store::read_superblocks(&*disk, image_blocks);
    report.problems.extend(damaged);
    sbs.sort_by_key(|s| std::cmp::Reverse(s.generation));
    let Some(sb) = sbs.first().cloned() else {
        return Err(Error::BadImage(format!("no valid superblock: {}", report.problems.join("; "))));
    };
    if sbs.iter().any(|o| o.generation == sb.generation && *o != sb) {
        report.problems.push(format!("two different superblocks claim generation {}", sb.generation));
    }
    if let Some(older) = sbs.iter().find(|o| o.generation < sb.generation) {
        if older.fsid != sb.fsid || older.total_blocks != sb.total_blocks {
            report.problems.push("superblock copies disagree on fsid or size".into());
        }
        if older.generation + 1 < sb.generation {
            report.notes.push(format!("superblock copies at generations {} and {}", sb.generation, older.generation));
        }
    }
    report.generation = sb.generation;
    report.total_blocks = sb.total_blocks;
    let mut alloc = Allocator::new(sb.total_blocks, BLOCKS_PER_GROUP);
    alloc.mark_used(0, RESERVED_BLOCKS);
    let mut pager = Pager::new(disk, sb.fsid, sb.total_blocks, alloc);
    pager.set_copies(sb.meta_copies);
    pager.set_repairs(false);
    let mut c = Checker {
        pager: &mut pager,
        report: &mut report,
        referenced: Default::default(),
        seen: HashMap::new(),
        live_nodes: Default::default(),
    };

    let root_items = c.tree(Tree::on_disk(ROOT_TREE_ID, sb.root_tree), "root tree", true);
    let ref_items = c.tree(Tree::on_disk(REFCOUNT_TREE_ID, sb.refcount_tree), "refcount tree", true);
    let mut roots = BTreeMap::new();
    let mut entries: BTreeMap<u64, crate::datasets::Entry> = BTreeMap::new();
    let mut dead_items = Vec::new();
    // Datasets a receive is writing (`receive.rs`): their namespace is whatever part of
    // the stream had arrived, and `open` undoes it.
    let mut receiving = std::collections::HashSet::new();
    let mut next_dataset = 1;
    for (k, v) in &root_items {
        match k.kind {
            kind::ROOT_ITEM if k.offset == 0 => match crate::datasets::dataset_of_tree(k.objectid) {
                Some(d) => match crate::store::decode_root_item(*k, v, sb.generation) {
                    Ok((ptr, meta)) => {
                        roots.insert(d, (k.objectid, ptr, meta.next_ino, meta.inode_count));
                    }
                    Err(e) => c.problem(e.to_string()),
                },
                None => c.problem(format!("root tree: root item {k:?} of no dataset")),
            },
            kind::DATASET if k.offset == 0 => match crate::datasets::decode_entry(*k, v) {
                Ok(e) if entries.values().any(|n| n.name == e.name) => {
                    c.problem(format!("root tree: dataset name {:?} used twice", e.name))
                }
                Ok(e) => {
                    entries.insert(k.objectid, e);
                }
                Err(e) => c.problem(e.to_string()),
            },
            kind::NEXT_DATASET if *k == crate::datasets::next_key() && v.len() == 8 => {
                next_dataset = crate::fs::inode::le_u64(v, 0);
            }
            kind::DEADLIST => dead_items.push((*k, v.clone())),
            kind::SCRUB if *k == Key::new(0, kind::SCRUB, 0) => {}
            kind::RECEIVE if k.offset == 0 && v.len() == 9 && v[0] <= 1 => {
                receiving.insert(k.objectid);
            }
            kind::SESSION if k.offset == 0 && v.len() <= crate::sessions::MAX_SESSION_RECORD_BYTES => {
                c.report.sessions += 1;
            }
            _ => c.problem(format!("root tree: unexpected item {k:?}")),
        }
    }
    if !roots.contains_key(&DEFAULT_DATASET) {
        c.problem("root tree: no root item for dataset 5".into());
        return Ok(report);
    }
    for (d, e) in &entries {
        if !roots.contains_key(d) {
            c.problem(format!("dataset {d} ({}) has no root item", e.name));
        }
    }
    let refs = c.refcounts(&ref_items);
    // Datasets first, then their snapshots: a snapshot's tree is its dataset's tree as of
    // its generation (nodes of the dataset's tree id, shared where unchanged).
    let origin = |d: &u64| entries.get(d).and_then(|e| e.snap);
    let mut order: Vec<u64> = roots.keys().copied().collect();
    order.sort_by_key(|d| (origin(d).is_some(), *d));
    for d in order {
        let Some(&(tree, ptr, next_ino, inode_count)) = roots.get(&d) else { continue };
        if d != DEFAULT_DATASET && (!entries.contains_key(&d) || d >= next_dataset) {
            c.problem(format!("dataset {d}: a tree without a name, or an id at or above the next ({next_dataset})"));
        }
        let (ns, owner, live) = match origin(&d) {
            Some((o, g)) => {
                if g > sb.generation || ptr.generation > g || origin(&o).is_some() || !roots.contains_key(&o) {
                    c.problem(format!("snapshot {d}: of no dataset, or newer than its generation {g}"));
                }
                (o, crate::datasets::tree_id(o), false)
            }
            None => (d, tree, true),
        };
        let items = c.tree(Tree::on_disk(owner, ptr), &format!("fs tree of dataset {d}"), live);
        let before = c.report.problems.len();
        let (inodes, extents) = c.namespace(&items, ns, next_ino, inode_count);
        c.report.inodes += inodes.len() as u64;
        c.report.directories += inodes.values().filter(|i| i.kind == FileKind::Directory).count() as u64;
        c.report.datasets += 1;
        c.extents(&inodes, &extents);
        if live && receiving.contains(&d) {
            let partial = c.report.problems.split_off(before);
            c.report.notes.push(format!(
                "dataset {d}: a receive was interrupted; opening the image undoes it ({} inconsistencies of the \
                 partial stream not counted)",
                partial.len()
            ));
        }
    }
    c.refcounts_match(&refs);
    c.deadlists(dead_items, &entries, sb.generation);
    let used = c.pager.alloc.used_blocks();
    c.report.used_blocks = used;
    if used != sb.used_blocks {
        c.problem(format!("superblock says {} blocks used; trees and extents use {used}", sb.used_blocks));
    }
    Ok(report)
}

/// An extent as fsck found it: (inode, file offset, extent).
type FoundExtent = (u64, u64, Extent);

/// One xattr as fsck sees it.
struct XattrRecord {
    ino: u64,
    hash: u64,
    name_len: usize,
    /// The inode flag its name keeps (`inode::xattr_flag`).
    flag: u32,
    /// Chunk id and value length of an out-of-line value.
    chunked: Option<(u64, usize)>,
}

struct Checker<'a> {
    pager: &'a mut Pager,
    report: &'a mut Report,
    /// Data blocks some tree's extents reference.
    referenced: std::collections::HashSet<u64>,
    /// Nodes walked, by tree id: a snapshot shares its dataset's nodes (same id).
    seen: HashMap<u64, std::collections::HashSet<u64>>,
    /// Nodes each live tree reaches (a deadlist must name none of them).
    live_nodes: std::collections::HashSet<u64>,
}

impl Checker<'_> {
    fn problem(&mut self, p: String) {
        self.report.problems.push(p);
    }

    /// Reads and verifies every copy of a node; each bad copy is a problem (fsck --repair
    /// rewrites it from a good one). The node, if any copy is good.
    fn node_copies(&mut self, ptr: &BlockPtr, owner: u64, name: &str) -> Option<crate::engine::node::Node> {
        let mut good = None;
        let mut errors = Vec::new();
        for at in ptr.copies() {
            match self.pager.read_copy(ptr, at, owner) {
                Ok((n, _)) => good = good.or(Some(n)),
                Err(e) => errors.push((at, e)),
            }
        }
        for (at, e) in errors {
            match &good {
                Some(_) => self.problem(format!("{name}: copy at block {at} of node {} is bad: {e}", ptr.block)),
                None => self.problem(format!("{name}: {e}")),
            }
        }
        good
    }

    /// Walks a tree checking every node and bound; returns its items in order.
    fn tree(&mut self, tree: Tree, name: &str, live: bool) -> Vec<(Key, Vec<u8>)> {
        let mut items = Vec::new();
        let Some(root) = tree.root.on_disk(tree.level) else { return items };
        let block = root.block;
        let mut stack = vec![(root, Key::MIN, None::<Key>)];
        let mut last_key: Option<Key> = None;
        while let Some((ptr, lo, hi)) = stack.pop() {
            if ptr.block < RESERVED_BLOCKS || ptr.block >= self.pager.total_blocks() {
                self.problem(format!("{name}: pointer to block {} outside the usable area", ptr.block));
                continue;
            }
            if ptr.twin != 0 && (ptr.twin < RESERVED_BLOCKS || ptr.twin >= self.pager.total_blocks()) {
                self.problem(format!(
                    "{name}: node {}'s second copy at {} is outside the usable area",
                    ptr.block, ptr.twin
                ));
                continue;
            }
            if (ptr.twin == 0) != (self.pager.copies() == 1) {
                self.problem(format!(
                    "{name}: node {} has {} copies in an image that keeps {}",
                    ptr.block,
                    1 + u8::from(ptr.twin != 0),
                    self.pager.copies()
                ));
            }
            let first_time = self.seen.entry(tree.owner).or_default().insert(ptr.block);
            if first_time && ptr.copies().any(|b| self.pager.alloc.try_mark_used(b, 1).is_err()) {
                self.problem(format!("{name}: block {} (or its second copy {}) is used twice", ptr.block, ptr.twin));
                continue;
            }
            if ptr.twin != 0 {
                // (A deadlist names both copies of a node a snapshot keeps.)
                self.seen.entry(tree.owner).or_default().insert(ptr.twin);
            }
            if live {
                self.live_nodes.extend(ptr.copies());
            }
            let node = match self.node_copies(&ptr, tree.owner, name) {
                Some(n) => n,
                None => continue,
            };
            self.report.nodes += 1;
            let is_root = ptr.block == block;
            if node.is_empty() && !is_root {
                self.problem(format!("{name}: empty non-root node at block {}", ptr.block));
            }
            if let Some(first) = node.first_key() {
                if first < lo || hi.is_some_and(|h| first >= h) {
                    self.problem(format!("{name}: node {} first key {first:?} outside its parent's range", ptr.block));
                }
            }
            match &node.body {
                Body::Leaf(leaf) => {
                    for (k, v) in leaf {
                        if k < &lo || hi.is_some_and(|h| *k >= h) {
                            self.problem(format!("{name}: leaf {} key {k:?} outside its parent's range", ptr.block));
                        }
                        if last_key.is_some_and(|l| l >= *k) {
                            self.problem(format!("{name}: key {k:?} in leaf {} out of order", ptr.block));
                        }
                        last_key = Some(*k);
                        items.push((*k, v.clone()));
                    }
                }
                Body::Internal(children) => {
                    for (i, (k, c)) in children.iter().enumerate().rev() {
                        let Some(child) = c.on_disk(ptr.level - 1) else { continue };
                        let child_hi = children.get(i + 1).map(|n| n.0).or(hi);
                        stack.push((child, (*k).max(lo), child_hi));
                    }
                }
            }
        }
        items
    }

    /// Marks refcounted extents used; returns block → count.
    fn refcounts(&mut self, items: &[(Key, Vec<u8>)]) -> BTreeMap<u64, (u64, u32)> {
        let mut out = BTreeMap::new();
        for (k, v) in items {
            let decoded = crate::fs::extent::decode_ref(v);
            let Some((count, birth)) = decoded
                .filter(|_| k.kind == kind::EXTENT_REF && k.offset > 0 && k.offset <= crate::limits::MAX_EXTENT_BLOCKS)
            else {
                self.problem(format!("refcount tree: bad item {k:?}"));
                continue;
            };
            if birth > self.report.generation {
                self.problem(format!("refcount tree: blocks {}+{} born after this generation", k.objectid, k.offset));
            }
            if count == 0 {
                self.problem(format!("refcount tree: zero count for blocks {}+{}", k.objectid, k.offset));
            }
            if k.objectid < RESERVED_BLOCKS
                || k.objectid.checked_add(k.offset).is_none_or(|e| e > self.pager.total_blocks())
            {
                self.problem(format!("refcount tree: blocks {}+{} outside the usable area", k.objectid, k.offset));
                continue;
            }
            if let Err(b) = self.pager.alloc.try_mark_used(k.objectid, k.offset) {
                self.problem(format!(
                    "refcount tree: block {b} of extent {}+{} is also used elsewhere",
                    k.objectid, k.offset
                ));
                continue;
            }
            out.insert(k.objectid, (k.offset, count));
        }
        out
    }

    /// Checks dataset `d`'s tree; returns its inodes and extents (checked against the
    /// refcount tree once every dataset's are known).
    fn namespace(
        &mut self,
        items: &[(Key, Vec<u8>)],
        d: u64,
        next_ino: u64,
        inode_count: u64,
    ) -> (BTreeMap<u64, Inode>, Vec<FoundExtent>) {
        let root_ino = crate::datasets::root_of(d);
        let total = self.pager.total_blocks();
        let mut inodes: BTreeMap<u64, Inode> = BTreeMap::new();
        let mut entries: Vec<(u64, DirEntry)> = Vec::new();
        let mut index: HashMap<(u64, u64), DirEntry> = HashMap::new();
        let mut extents: Vec<(u64, u64, Extent)> = Vec::new();
        let mut orphans = Vec::new();
        let mut xattrs: Vec<XattrRecord> = Vec::new();
        let mut chunks: Vec<(u64, xattr::Chunk)> = Vec::new();
        for (k, v) in items {
            let r: Result<()> = (|| {
                match k.kind {
                    kind::INODE if k.offset == 0 => {
                        inodes.insert(k.objectid, Inode::decode(k.objectid, v, 0)?);
                    }
                    kind::DIR_ENTRY => entries.extend(decode_entries(*k, v, 0)?.into_iter().map(|e| (k.objectid, e))),
                    kind::DIR_INDEX => {
                        index.insert((k.objectid, k.offset), decode_index(*k, v, 0)?);
                    }
                    kind::EXTENT => extents.push((k.objectid, k.offset, Extent::decode(*k, v, total)?)),
                    kind::XATTR => xattrs.extend(xattr::decode(*k, v, 0)?.into_iter().map(|e| XattrRecord {
                        ino: k.objectid,
                        hash: k.offset,
                        name_len: e.name.len(),
                        flag: crate::fs::inode::xattr_flag(&e.name),
                        chunked: match e.value {
                            xattr::Value::Inline(_) => None,
                            xattr::Value::Chunked { len, id } => Some((id, len as usize)),
                        },
                    })),
                    kind::XATTR_CHUNK => chunks.push((k.objectid, xattr::decode_chunk(*k, v, 0)?)),
                    kind::ORPHAN if k.objectid == ORPHAN_OBJECTID && v.is_empty() => orphans.push(k.offset),
                    _ => return Err(Error::bad_item(*k, 0, "unknown item kind in fs tree")),
                }
                Ok(())
            })();
            if let Err(e) = r {
                self.problem(format!("fs tree: {e}"));
            }
        }
        if let (Some(lo), Some(hi)) = (inodes.keys().next(), inodes.keys().next_back()) {
            if *lo < root_ino || crate::datasets::dataset_of(*hi) != d {
                self.problem(format!("dataset {d}: inodes {lo}..={hi} outside its inode range"));
            }
        }
        if inodes.len() as u64 != inode_count {
            self.problem(format!("dataset counts {inode_count} inodes; {} found", inodes.len()));
        }
        if let Some(max) = inodes.keys().next_back() {
            if *max >= next_ino {
                self.problem(format!("inode {max} is not below the next inode number {next_ino}"));
            }
        }
        match inodes.get(&root_ino) {
            Some(r) if r.kind == FileKind::Directory && r.parent == root_ino => {}
            _ => self.problem(format!("root directory (inode {root_ino}) missing or malformed")),
        }
        // Links, sizes and parents from the entries.
        let mut links: HashMap<u64, u32> = HashMap::new();
        let mut dir_entries: HashMap<u64, u64> = HashMap::new();
        let mut subdirs: HashMap<u64, u32> = HashMap::new();
        for (dir, e) in &entries {
            match inodes.get(dir) {
                Some(d) if d.kind == FileKind::Directory => {
                    if e.index >= d.next_index {
                        self.problem(format!(
                            "dir {dir}: entry {:?} index {} not below next index {}",
                            String::from_utf8_lossy(&e.name),
                            e.index,
                            d.next_index
                        ));
                    }
                }
                _ => self.problem(format!("directory entries under inode {dir}, which is not a directory")),
            }
            match index.get(&(*dir, e.index)) {
                Some(i) if i.name == e.name && i.ino == e.ino && i.kind == e.kind => {}
                _ => self.problem(format!(
                    "dir {dir}: entry {:?} has no matching index item {}",
                    String::from_utf8_lossy(&e.name),
                    e.index
                )),
            }
            match inodes.get(&e.ino) {
                Some(t) if t.kind == e.kind => {
                    if t.kind == FileKind::Directory {
                        *subdirs.entry(*dir).or_default() += 1;
                        if t.parent != *dir {
                            self.problem(format!(
                                "dir {} is named in dir {dir} but records parent {}",
                                e.ino, t.parent
                            ));
                        }
                    }
                }
                Some(t) => self.problem(format!(
                    "dir {dir}: entry {:?} says {:?}, inode {} is {:?}",
                    String::from_utf8_lossy(&e.name),
                    e.kind,
                    e.ino,
                    t.kind
                )),
                None => self.problem(format!(
                    "dir {dir}: entry {:?} names missing inode {}",
                    String::from_utf8_lossy(&e.name),
                    e.ino
                )),
            }
            *links.entry(e.ino).or_default() += 1;
            *dir_entries.entry(*dir).or_default() += 1;
        }
        if index.len() != entries.len() {
            self.problem(format!("{} index items for {} directory entries", index.len(), entries.len()));
        }
        let orphan_set: std::collections::HashSet<u64> = orphans.iter().copied().collect();
        for o in &orphans {
            match inodes.get(o) {
                Some(i) if i.nlink == 0 => {}
                _ => self.problem(format!("orphan list names inode {o}, which is missing or still linked")),
            }
        }
        for (ino, i) in &inodes {
            let found = links.get(ino).copied().unwrap_or(0);
            if i.kind == FileKind::Directory {
                let n = dir_entries.get(ino).copied().unwrap_or(0);
                if i.size != n {
                    self.problem(format!("dir {ino}: size {} but {n} entries", i.size));
                }
                let expect = if i.nlink == 0 { 0 } else { 2 + subdirs.get(ino).copied().unwrap_or(0) };
                if i.nlink != expect {
                    self.problem(format!("dir {ino}: nlink {} but {expect} expected", i.nlink));
                }
                let named = found + u32::from(*ino == root_ino);
                if named != 1 && !(i.nlink == 0 && orphan_set.contains(ino) && found == 0) {
                    self.problem(format!("dir {ino} is named by {found} entries"));
                }
            } else if i.nlink != found {
                self.problem(format!("inode {ino}: nlink {} but {found} entries name it", i.nlink));
            }
            if i.nlink == 0 && !orphan_set.contains(ino) {
                self.problem(format!("inode {ino} has no links and is not on the orphan list"));
            }
        }
        self.xattrs(&inodes, &xattrs, &chunks);
        (inodes, extents)
    }

    /// Xattrs against their inodes and chunks (the invariant of `fs/xattr.rs`): every
    /// out-of-line record has a chunk id of its own and exactly its chunks, every chunk
    /// belongs to such a record, and no inode's names pass `XATTR_LIST_MAX`.
    fn xattrs(&mut self, inodes: &BTreeMap<u64, Inode>, records: &[XattrRecord], chunks: &[(u64, xattr::Chunk)]) {
        let mut list_bytes: BTreeMap<u64, usize> = BTreeMap::new();
        let mut flags: BTreeMap<u64, u32> = BTreeMap::new();
        // (ino, chunk id) → (owner hash, value length, chunks found)
        let mut owners: BTreeMap<(u64, u64), (u64, usize, usize)> = BTreeMap::new();
        for r in records {
            *list_bytes.entry(r.ino).or_default() += r.name_len + 1;
            *flags.entry(r.ino).or_default() |= r.flag;
            let Some((id, len)) = r.chunked else { continue };
            if owners.insert((r.ino, id), (r.hash, len, 0)).is_some() {
                self.problem(format!("inode {}: xattr chunk id {id} named by two xattrs", r.ino));
            }
        }
        for (ino, bytes) in &list_bytes {
            if !inodes.contains_key(ino) {
                self.problem(format!("xattr of missing inode {ino}"));
            }
            if *bytes > XATTR_LIST_MAX {
                self.problem(format!("inode {ino}: xattr names take {bytes} bytes (max {XATTR_LIST_MAX})"));
            }
        }
        for (ino, inode) in inodes {
            let stored = flags.get(ino).copied().unwrap_or(0);
            if inode.flags != stored {
                self.problem(format!("inode {ino}: ACL flags {:#x}, but its ACL xattrs say {stored:#x}", inode.flags));
            }
        }
        for (ino, c) in chunks {
            match owners.get_mut(&(*ino, c.id)) {
                Some((hash, len, found)) if *hash == c.owner_hash && *len == c.value_len => *found += 1,
                Some(_) => self.problem(format!(
                    "inode {ino}: xattr chunk {}/{} disagrees with the xattr naming it",
                    c.id, c.index
                )),
                None => self.problem(format!("inode {ino}: xattr chunk {}/{} belongs to no xattr", c.id, c.index)),
            }
        }
        for ((ino, id), (_, len, found)) in owners {
            // decode_chunk refuses indices past the value and keys are unique, so the
            // count says whether every chunk is there.
            if found != xattr::chunk_count(len) {
                self.problem(format!(
                    "inode {ino}: xattr value of {len} bytes in chunk id {id} has {found} of {} chunks",
                    xattr::chunk_count(len)
                ));
            }
        }
    }

    /// One tree's extents against its inodes; the blocks they reference join
    /// `self.referenced` (a snapshot references many of its dataset's).
    fn extents(&mut self, inodes: &BTreeMap<u64, Inode>, extents: &[(u64, u64, Extent)]) {
        let mut per_block: HashMap<u64, u32> = HashMap::new();
        let mut blocks_of: HashMap<u64, u64> = HashMap::new();
        let mut prev: Option<(u64, u64)> = None; // (ino, end offset)
        let mut inline_of = std::collections::HashSet::new();
        for (ino, off, e) in extents {
            let Some(inode) = inodes.get(ino) else {
                self.problem(format!("extent at {off} of missing inode {ino}"));
                continue;
            };
            if !inode.kind.has_data() {
                self.problem(format!("extent at {off} of inode {ino}, a {:?}", inode.kind));
            }
            if let Some((pino, pend)) = prev {
                if pino == *ino && pend > *off {
                    self.problem(format!("inode {ino}: extents overlap at offset {off}"));
                }
            }
            match e {
                Extent::Inline(data) => {
                    inline_of.insert(*ino);
                    if inode.size > MAX_INLINE_BYTES as u64 || data.len() as u64 > inode.size {
                        self.problem(format!(
                            "inode {ino}: inline data of {} bytes in a file of {}",
                            data.len(),
                            inode.size
                        ));
                    }
                    prev = Some((*ino, data.len() as u64));
                }
                Extent::Regular { disk_block, twin, csums } => {
                    let n = csums.len() as u64;
                    let end = off + n * BLOCK_SIZE_U64;
                    if end > inode.size.div_ceil(BLOCK_SIZE_U64) * BLOCK_SIZE_U64 {
                        self.problem(format!("inode {ino}: extent at {off} runs past the file size {}", inode.size));
                    }
                    *blocks_of.entry(*ino).or_default() += n;
                    for start in [*disk_block, *twin].into_iter().filter(|&b| b != 0) {
                        for i in 0..n {
                            *per_block.entry(start + i).or_default() += 1;
                        }
                        // (Verified once: a snapshot shares its dataset's extents, or pieces
                        // of them, so any block not seen yet makes the extent worth reading.)
                        if (start..start + n).any(|b| !self.referenced.contains(&b)) {
                            self.verify_data(*ino, *off, start, csums);
                        }
                    }
                    prev = Some((*ino, end));
                }
            }
        }
        for ino in &inline_of {
            if blocks_of.contains_key(ino) {
                self.problem(format!("inode {ino}: inline data beside block extents"));
            }
        }
        for (ino, i) in inodes {
            let b = blocks_of.get(ino).copied().unwrap_or(0);
            if i.blocks != b {
                self.problem(format!("inode {ino}: records {} blocks, extents map {b}", i.blocks));
            }
        }
        for (b, n) in per_block {
            if n > 1 {
                self.problem(format!("block {b} is mapped {n} times in one tree"));
            }
            self.referenced.insert(b);
        }
    }

    /// Every deadlist belongs to a dataset or snapshot, and names blocks some snapshot
    /// still reaches: nodes no live tree reaches, data blocks some tree maps.
    fn deadlists(
        &mut self,
        items: Vec<(Key, Vec<u8>)>,
        entries: &BTreeMap<u64, crate::datasets::Entry>,
        generation: u64,
    ) {
        let lists = match crate::snapshots::load_deadlists(items, generation) {
            Ok(l) => l,
            Err(e) => return self.problem(format!("deadlists: {e}")),
        };
        for (id, list) in lists {
            let (name, family) = match entries.get(&id) {
                Some(e) => (e.name.clone(), crate::datasets::tree_id(e.snap.map_or(id, |(o, _)| o))),
                None if id == DEFAULT_DATASET => {
                    (crate::datasets::DEFAULT_NAME.to_string(), crate::datasets::tree_id(id))
                }
                None => {
                    self.problem(format!("deadlist of dataset {id}, which does not exist"));
                    continue;
                }
            };
            for d in list.entries {
                let shared = if d.node {
                    self.seen.get(&family).is_some_and(|s| s.contains(&d.start)) && !self.live_nodes.contains(&d.start)
                } else {
                    (d.start..d.start + d.len).all(|b| self.referenced.contains(&b))
                };
                if !shared {
                    self.problem(format!("deadlist of {name}: {d:?} is reached by no snapshot, or by a live tree"));
                }
            }
        }
    }

    /// Reference counts against the blocks some tree's extents reference, both ways
    /// (crest makes no shared extents: each count is 1; a snapshot reaches its dataset's
    /// blocks through the same extents, or copies of them).
    fn refcounts_match(&mut self, refs: &BTreeMap<u64, (u64, u32)>) {
        let mut counted = 0u64;
        for (start, (len, count)) in refs {
            for b in *start..start + len {
                let found = u32::from(self.referenced.contains(&b));
                if found != *count {
                    self.problem(format!("block {b}: refcount {count} but {found} extents reference it"));
                }
            }
            counted += len;
        }
        if counted != self.referenced.len() as u64 {
            let missing = self
                .referenced
                .iter()
                .filter(|b| refs.range(..=**b).next_back().is_none_or(|(s, (l, _))| **b >= s + l))
                .count();
            if missing > 0 {
                self.problem(format!("{missing} data blocks are referenced by extents but have no refcount"));
            }
        }
    }

    fn verify_data(&mut self, ino: u64, off: u64, disk_block: u64, csums: &[u32]) {
        let mut buf = vec![0u8; csums.len() * BLOCK_SIZE];
        if let Err(e) = self.pager.read_blocks(disk_block, &mut buf) {
            self.problem(format!("inode {ino}: extent at {off}: {e}"));
            return;
        }
        for (i, c) in csums.iter().enumerate() {
            let found = crate::engine::checksum::crc32c(&buf[i * BLOCK_SIZE..(i + 1) * BLOCK_SIZE]);
            if found != *c {
                self.problem(format!(
                    "inode {ino}: data checksum mismatch at file offset {} (disk block {}): expected {c:#010x}, found {found:#010x}",
                    off + i as u64 * BLOCK_SIZE_U64,
                    disk_block + i as u64
                ));
            }
            self.report.data_blocks += 1;
        }
    }
}
