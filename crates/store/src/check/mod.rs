//! `crest fsck`: reads an image without changing it and checks every checksum and every
//! structural invariant the other modules promise — node headers and key order, parent
//! bounds, levels, reachability, no block used twice, reference counts against extents,
//! link counts against directory entries, directory sizes and parents, the orphan list,
//! inline and extent rules, per-dataset counters, and used blocks against the superblock.
//! Each problem is reported with where it is; a clean image has none.
//!
//! Nothing grows with the number of items: trees are walked leaf by leaf into visitors
//! (`walk`), a dataset's namespace is checked in one streaming pass
//! (`namespace.rs`), and data blocks are one bit each of the image (`BlockSet`).

use std::collections::{BTreeMap, HashMap};

use crate::datasets::DEFAULT_DATASET;
use crate::disk::Disk;
use crate::engine::alloc::Allocator;
use crate::engine::btree::Tree;
use crate::engine::key::Key;
use crate::engine::node::{BlockPtr, Body};
use crate::engine::pager::Pager;
use crate::error::{Error, Result};
use crate::fs::keys::kind;
use crate::fs::objects::object_of;
use crate::limits::{BLOCKS_PER_GROUP, BLOCK_SIZE, BLOCK_SIZE_U64, RESERVED_BLOCKS};
use crate::store::{REFCOUNT_TREE_ID, ROOT_TREE_ID};

mod namespace;
use namespace::Namespace;

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
    /// Objects in the data store that extents reference.
    pub objects: u64,
    /// Objects on the gone list (to be deleted from the data store).
    pub objects_gone: u64,
    /// Where the image keeps file data, if in a data store.
    pub data_store: Option<crate::fs::objects::DataStore>,
    /// The objects extents reference (what the data store must hold).
    pub objects_referenced: std::collections::BTreeSet<u64>,
    /// Objects granted and not mapped, or to be deleted (the store may hold them).
    pub objects_pending: std::collections::BTreeSet<u64>,
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
    let (mut sbs, damaged) = crate::store::read_superblocks(&*disk, image_blocks)?;
    report.problems.extend(damaged);
    sbs.sort_by_key(|s| std::cmp::Reverse(s.generation));
    let Some(newest) = sbs.first().cloned() else {
        return Err(Error::BadImage(format!("no valid superblock: {}", report.problems.join("; "))));
    };
    // A generation committed with one flush that did not fully land (power lost before the
    // flush returned) is passed over, as `open` does: what open uses is what is checked.
    let mut disk = disk;
    let mut sb = newest;
    for (i, cand) in sbs.iter().enumerate() {
        // (A copy of another file system is no commit cut short: it is checked, and fails.)
        if sbs.get(i + 1).is_some_and(|next| next.fsid != cand.fsid || next.total_blocks != cand.total_blocks) {
            sb = cand.clone();
            break;
        }
        let mut pager = Pager::new(disk, cand.fsid, cand.total_blocks, Allocator::new(0, BLOCKS_PER_GROUP));
        pager.set_copies(cand.meta_copies);
        pager.set_repairs(false);
        let verified = crate::store::verify_one_flush_commit(&mut pager, cand);
        disk = pager.into_disk();
        match verified {
            Ok(_) => {
                sb = cand.clone();
                break;
            }
            Err(e) => report.notes.push(format!(
                "generation {} did not fully reach the disk ({e}): its commit was cut short; \
                 open uses the generation before",
                cand.generation
            )),
        }
    }
    sbs.retain(|s| s.generation <= sb.generation);
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
        referenced: BlockSet::new(sb.total_blocks),
        object_blocks: Default::default(),
        seen: HashMap::new(),
        live_nodes: Default::default(),
        partial: None,
        one_flush: sb.manifest.as_ref().map(|_| sb.generation),
    };

    let root_items = c.tree(Tree::on_disk(ROOT_TREE_ID, sb.root_tree), "root tree", true);
    let mut refs = Vec::new();
    c.walk(Tree::on_disk(REFCOUNT_TREE_ID, sb.refcount_tree), "refcount tree", true, &mut |c, k, v| {
        c.refcount(&mut refs, k, v)
    });
    let mut roots = BTreeMap::new();
    let mut entries: BTreeMap<u64, crate::datasets::Entry> = BTreeMap::new();
    let mut dead_items = Vec::new();
    // Datasets a receive is writing (`receive.rs`): their namespace is whatever part of
    // the stream had arrived, and `open` undoes it.
    let mut receiving = std::collections::HashSet::new();
    let mut next_dataset = 1;
    // USAGE items by tree id: (root block, root generation, data blocks).
    let mut usages: BTreeMap<u64, (u64, u64, u64)> = BTreeMap::new();
    let mut objects = objects::Seen::default();
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
            kind::USAGE if k.offset == 0 => match crate::store::decode_usage(v) {
                Some(u) => {
                    usages.insert(k.objectid, u);
                }
                None => c.problem(format!("root tree: bad usage item {k:?}")),
            },
            kind::SESSION if k.offset == 0 && v.len() <= crate::sessions::MAX_SESSION_RECORD_BYTES => {
                c.report.sessions += 1;
            }
            kind::OBJECT_CONFIG | kind::OBJECT_NEXT | kind::OBJECT_GRANT | kind::OBJECT_GONE => {
                objects.item(&mut c, *k, v)
            }
            _ => c.problem(format!("root tree: unexpected item {k:?}")),
        }
    }
    for t in usages.keys() {
        let live = crate::datasets::dataset_of_tree(*t)
            .filter(|d| roots.contains_key(d) && entries.get(d).is_none_or(|e| e.snap.is_none()));
        if live.is_none() {
            c.problem(format!("root tree: a usage item of tree {t}, which is no live dataset's"));
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
        // (A receive's partial namespace is noted, not counted; its tree's own damage is.)
        c.partial = (live && receiving.contains(&d)).then(Vec::new);
        let tree = Tree::on_disk(owner, ptr);
        let mut space = Namespace::new(ns, tree);
        c.walk(tree, &format!("fs tree of dataset {d}"), live, &mut |c, k, v| space.item(c, k, v));
        space.finish(&mut c, next_ino, inode_count);
        c.report.inodes += space.inode_count();
        c.report.directories += space.directories;
        c.report.datasets += 1;
        if let Some(&(block, generation, blocks)) = usages.get(&tree.owner).filter(|_| live) {
            let counted: u64 = space.runs.iter().map(|r| r.1).sum();
            if (block, generation) == (ptr.block, ptr.generation) && blocks != counted {
                c.problem(format!("dataset {d}: its usage item says {blocks} data blocks; its extents map {counted}"));
            }
        }
        c.mapped(std::mem::take(&mut space.runs));
        if let Some(partial) = c.partial.take() {
            c.report.notes.push(format!(
                "dataset {d}: a receive was interrupted; opening the image undoes it ({} inconsistencies of the \
                 partial stream not counted)",
                partial.len()
            ));
        }
    }
    c.refcounts_match(&refs);
    objects.finish(&mut c, &refs);
    c.deadlists(dead_items, &entries, sb.generation);
    let used = c.pager.alloc.used_blocks();
    c.report.used_blocks = used;
    if used != sb.used_blocks {
        c.problem(format!("superblock says {} blocks used; trees and extents use {used}", sb.used_blocks));
    }
    Ok(report)
}

struct Checker<'a> {
    pager: &'a mut Pager,
    report: &'a mut Report,
    /// Data blocks some tree's extents reference.
    referenced: BlockSet,
    /// Blocks of objects in the data store that extents reference (`fs/objects.rs`).
    object_blocks: std::collections::BTreeSet<u64>,
    /// Nodes walked, by tree id: a snapshot shares its dataset's nodes (same id).
    seen: HashMap<u64, std::collections::HashSet<u64>>,
    /// Nodes each live tree reaches (a deadlist must name none of them).
    live_nodes: std::collections::HashSet<u64>,
    /// While checking the namespace a receive left half written: its problems, kept
    /// apart (`problem`). Damage to the tree itself is counted all the same (`damage`).
    partial: Option<Vec<String>>,
    /// The generation checked, if its commit was made with one flush: a bad copy of a node
    /// it wrote beside a good one is what a power cut during that commit leaves (open
    /// rewrites it), so it is noted, not counted.
    one_flush: Option<u64>,
}

impl Checker<'_> {
    /// A problem of what items say.
    fn problem(&mut self, p: String) {
        match &mut self.partial {
            Some(partial) => partial.push(p),
            None => self.report.problems.push(p),
        }
    }

    /// A problem of the nodes and blocks themselves: always counted.
    fn damage(&mut self, p: String) {
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
                Some(_) if self.one_flush == Some(ptr.generation) => self.report.notes.push(format!(
                    "{name}: copy at block {at} of node {} (written by the last commit, made with one \
                     flush) did not land: {e}; open rewrites it",
                    ptr.block
                )),
                Some(_) => self.damage(format!("{name}: copy at block {at} of node {} is bad: {e}", ptr.block)),
                None => self.damage(format!("{name}: {e}")),
            }
        }
        good
    }

    /// Walks a tree and collects its items in order (a small tree: the root tree).
    fn tree(&mut self, tree: Tree, name: &str, live: bool) -> Vec<(Key, Vec<u8>)> {
        let mut items = Vec::new();
        self.walk(tree, name, live, &mut |_, k, v| items.push((k, v.to_vec())));
        items
    }

    /// Walks a tree checking every node and bound, handing `visit` each item in key order
    /// as its leaf is read (nothing of the tree is kept here).
    fn walk(&mut self, tree: Tree, name: &str, live: bool, visit: &mut dyn FnMut(&mut Self, Key, &[u8])) {
        let Some(root) = tree.root.on_disk(tree.level) else { return };
        let block = root.block;
        let mut stack = vec![(root, Key::MIN, None::<Key>)];
        let mut last_key: Option<Key> = None;
        while let Some((ptr, lo, hi)) = stack.pop() {
            if ptr.block < RESERVED_BLOCKS || ptr.block >= self.pager.total_blocks() {
                self.damage(format!("{name}: pointer to block {} outside the usable area", ptr.block));
                continue;
            }
            if ptr.twin != 0 && (ptr.twin < RESERVED_BLOCKS || ptr.twin >= self.pager.total_blocks()) {
                self.damage(format!(
                    "{name}: node {}'s second copy at {} is outside the usable area",
                    ptr.block, ptr.twin
                ));
                continue;
            }
            if (ptr.twin == 0) != (self.pager.copies() == 1) {
                self.damage(format!(
                    "{name}: node {} has {} copies in an image that keeps {}",
                    ptr.block,
                    1 + u8::from(ptr.twin != 0),
                    self.pager.copies()
                ));
            }
            let first_time = self.seen.entry(tree.owner).or_default().insert(ptr.block);
            if first_time && ptr.copies().any(|b| self.pager.alloc.try_mark_used(b, 1).is_err()) {
                self.damage(format!("{name}: block {} (or its second copy {}) is used twice", ptr.block, ptr.twin));
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
                self.damage(format!("{name}: empty non-root node at block {}", ptr.block));
            }
            if let Some(first) = node.first_key() {
                if first < lo || hi.is_some_and(|h| first >= h) {
                    self.damage(format!("{name}: node {} first key {first:?} outside its parent's range", ptr.block));
                }
            }
            match &node.body {
                Body::Leaf(leaf) => {
                    for (k, v) in leaf {
                        if k < &lo || hi.is_some_and(|h| *k >= h) {
                            self.damage(format!("{name}: leaf {} key {k:?} outside its parent's range", ptr.block));
                        }
                        if last_key.is_some_and(|l| l >= *k) {
                            self.damage(format!("{name}: key {k:?} in leaf {} out of order", ptr.block));
                        }
                        last_key = Some(*k);
                        visit(self, *k, v);
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
    }

    /// One refcount item: its blocks marked used, and kept in `refs` as (first block,
    /// blocks, count), in block order.
    fn refcount(&mut self, refs: &mut Vec<(u64, u64, u32)>, k: Key, v: &[u8]) {
        let decoded = crate::fs::extent::decode_ref(v);
        let Some((count, birth)) = decoded
            .filter(|_| k.kind == kind::EXTENT_REF && k.offset > 0 && k.offset <= crate::limits::MAX_EXTENT_BLOCKS)
        else {
            return self.problem(format!("refcount tree: bad item {k:?}"));
        };
        if birth > self.report.generation {
            self.problem(format!("refcount tree: blocks {}+{} born after this generation", k.objectid, k.offset));
        }
        if count == 0 {
            self.problem(format!("refcount tree: zero count for blocks {}+{}", k.objectid, k.offset));
        }
        if crate::fs::objects::within_one_object(k.objectid, k.offset) {
            // Object blocks: no allocator owns them.
            refs.push((k.objectid, k.offset, count));
            return;
        }
        if k.objectid < RESERVED_BLOCKS
            || k.objectid.checked_add(k.offset).is_none_or(|e| e > self.pager.total_blocks())
        {
            return self.problem(format!("refcount tree: blocks {}+{} outside the usable area", k.objectid, k.offset));
        }
        if let Err(b) = self.pager.alloc.try_mark_used(k.objectid, k.offset) {
            return self.problem(format!(
                "refcount tree: block {b} of extent {}+{} is also used elsewhere",
                k.objectid, k.offset
            ));
        }
        refs.push((k.objectid, k.offset, count));
    }

    /// One tree's data block runs (`namespace::Run`): no block mapped twice within it;
    /// all of them join `referenced` (a snapshot references many of its dataset's).
    fn mapped(&mut self, mut runs: Vec<namespace::Run>) {
        runs.sort_unstable();
        let mut reach = 0u64; // the end of the runs so far
        for &(start, n, _, _) in &runs {
            let end = start + n;
            for b in start..end.min(reach) {
                self.problem(format!("block {b} is mapped more than once in one tree"));
            }
            reach = reach.max(end);
        }
        for (start, n, _, _) in runs {
            for b in start..start + n {
                if object_of(b).is_some() {
                    self.object_blocks.insert(b);
                } else {
                    self.referenced.insert(b);
                }
            }
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
                    (d.start..d.start + d.len).all(|b| self.is_referenced(b))
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
    fn refcounts_match(&mut self, refs: &[(u64, u64, u32)]) {
        let mut counted = 0u64;
        for &(start, len, count) in refs {
            for b in start..start + len {
                let found = u32::from(self.is_referenced(b));
                if found != count {
                    self.problem(format!("block {b}: refcount {count} but {found} extents reference it"));
                }
            }
            counted += len;
        }
        if counted != self.referenced.len() + self.object_blocks.len() as u64 {
            let covered = |b: u64| {
                let i = refs.partition_point(|r| r.0 <= b);
                i > 0 && b < refs[i - 1].0 + refs[i - 1].1
            };
            let missing =
                self.referenced.iter().chain(self.object_blocks.iter().copied()).filter(|&b| !covered(b)).count();
            if missing > 0 {
                self.problem(format!("{missing} data blocks are referenced by extents but have no refcount"));
            }
        }
    }

    /// Whether some extent references block `b` (of the image or of an object).
    fn is_referenced(&self, b: u64) -> bool {
        match object_of(b) {
            Some(_) => self.object_blocks.contains(&b),
            None => self.referenced.get(b),
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

/// A set of blocks of the image: one bit each.
struct BlockSet {
    words: Vec<u64>,
    len: u64,
}

impl BlockSet {
    fn new(blocks: u64) -> BlockSet {
        BlockSet { words: vec![0; blocks.div_ceil(64) as usize], len: 0 }
    }

    fn get(&self, b: u64) -> bool {
        self.words.get((b / 64) as usize).is_some_and(|w| w >> (b % 64) & 1 == 1)
    }

    /// Adds `b` (a block past the image is not kept: extents are checked against its size).
    fn insert(&mut self, b: u64) {
        if let Some(w) = self.words.get_mut((b / 64) as usize) {
            let bit = 1u64 << (b % 64);
            if *w & bit == 0 {
                *w |= bit;
                self.len += 1;
            }
        }
    }

    fn len(&self) -> u64 {
        self.len
    }

    fn iter(&self) -> impl Iterator<Item = u64> + '_ {
        self.words
            .iter()
            .enumerate()
            .flat_map(|(i, &w)| (0..64u64).filter(move |bit| w >> bit & 1 == 1).map(move |bit| i as u64 * 64 + bit))
    }
}

mod objects;

#[cfg(test)]
mod tests;
