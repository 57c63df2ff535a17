//! Snapshots: read-only datasets that share their origin's blocks, made in O(1) and
//! destroyed in time proportional to what they alone hold (docs/format.md §4.6). The
//! scheme is ZFS's birth times and deadlists:
//!
//! - every node records the generation that wrote it, and every data extent's refcount
//!   item the generation it was born in (`fs/extent.rs`: `encode_ref`);
//! - a snapshot of dataset D taken at generation `g` is D's tree root as of `g` (a commit
//!   first, so every node and block it reaches was born at or before `g`): a new catalog
//!   entry and a ROOT_ITEM pointing at the same nodes, owned by D's tree id;
//! - when D stops using a node or data block born at or before its newest snapshot's
//!   generation, the block is not freed: that snapshot still reaches it. It goes on D's
//!   *deadlist* (the engine's `Pager::keep` for nodes, `refs_drop` for data). Taking a
//!   snapshot hands D's deadlist to it (the blocks D killed since the previous snapshot)
//!   and starts D's anew;
//! - destroying snapshot S (previous snapshot P, or none: generation 0; next N, a later
//!   snapshot or D itself) frees every block of N's deadlist born after P (only S reached
//!   it), keeps the others there (P still does), and hands S's own deadlist to N.
//!
//! Invariants (checked by fsck): every deadlist entry is reached by some snapshot of its
//! dataset and by no live tree; a block no tree reaches is free; a snapshot is never
//! changed (`reserve` refuses every change while one is the active tree).

use std::collections::BTreeMap;

use crate::datasets::{check_name, record_key, tree_id, Entry, Slot};
use crate::engine::btree::Tree;
use crate::engine::key::Key;
use crate::error::{Error, Result};
use crate::fs::inode::le_u64;
use crate::fs::keys::kind;
use crate::store::{DatasetMeta, Store};

/// Bytes of one deadlist entry on disk: start (u64), length (u32), birth (u64), kind (u8:
/// 0 data, 1 node).
const DEAD_BYTES: usize = 21;

/// Entries per DEADLIST item (within the item size limit).
const DEAD_PER_ITEM: usize = 80;

/// Blocks a dataset or snapshot stopped using that an older snapshot still reaches.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Dead {
    pub start: u64,
    pub len: u64,
    pub birth: u64,
    pub node: bool,
}

/// One deadlist and how much of it the disk has.
#[derive(Clone, Debug, Default)]
pub(crate) struct Deadlist {
    pub entries: Vec<Dead>,
    /// Items on disk for it (chunks of `DEAD_PER_ITEM`).
    pub stored_items: u64,
    /// Entries from here on are not on disk as they are.
    pub dirty_from: Option<usize>,
}

impl Deadlist {
    fn push(&mut self, d: Dead) {
        self.dirty_from.get_or_insert(self.entries.len());
        self.entries.push(d);
    }

    fn replace(&mut self, entries: Vec<Dead>) {
        self.entries = entries;
        self.dirty_from = Some(0);
    }
}

/// Checks a snapshot name: `DATASET@NAME`, each part a valid dataset name.
pub fn check_snapshot_name(full: &str) -> Result<()> {
    let Some((ds, snap)) = full.split_once('@') else {
        return Err(Error::Invalid(format!("snapshot name {full:?}: DATASET@NAME")));
    };
    check_name(ds)?;
    check_name(snap)
}

fn encode_dead(chunk: &[Dead]) -> Vec<u8> {
    let mut v = Vec::with_capacity(chunk.len() * DEAD_BYTES);
    for d in chunk {
        v.extend_from_slice(&d.start.to_le_bytes());
        v.extend_from_slice(&u32::try_from(d.len).unwrap_or(u32::MAX).to_le_bytes());
        v.extend_from_slice(&d.birth.to_le_bytes());
        v.push(u8::from(d.node));
    }
    v
}

/// Decodes a DEADLIST item's value.
pub(crate) fn decode_dead(key: Key, v: &[u8], generation: u64) -> Result<Vec<Dead>> {
    if v.is_empty() || !v.len().is_multiple_of(DEAD_BYTES) || v.len() / DEAD_BYTES > DEAD_PER_ITEM {
        return Err(Error::bad_item(key, 0, format!("deadlist item of {} bytes", v.len())));
    }
    let mut out = Vec::with_capacity(v.len() / DEAD_BYTES);
    for e in v.chunks(DEAD_BYTES) {
        let len = u64::from(u32::from_le_bytes([e[8], e[9], e[10], e[11]]));
        let d = Dead { start: le_u64(e, 0), len, birth: le_u64(e, 12), node: e[20] == 1 };
        if e[20] > 1 || len == 0 || (d.node && len != 1) || d.birth > generation {
            return Err(Error::bad_item(key, 0, "bad deadlist entry"));
        }
        out.push(d);
    }
    Ok(out)
}

impl Store {
    /// Whether dataset id `d` is a snapshot.
    pub fn is_snapshot(&self, d: u64) -> bool {
        self.catalog.by_id.get(&d).is_some_and(|e| e.snap.is_some())
    }

    /// Sets what the engine keeps of dataset `d`'s tree: what its newest snapshot holds.
    pub(crate) fn update_keep(&mut self, d: u64) {
        match self.catalog.snaps.get(&d).and_then(|s| s.last()) {
            Some(&(g, _)) => self.pager.keep.insert(tree_id(d), g),
            None => self.pager.keep.remove(&tree_id(d)),
        };
    }

    /// Data blocks the active dataset stopped using that a snapshot holds.
    pub(crate) fn dead_data(&mut self, start: u64, len: u64, birth: u64) {
        let d = self.active;
        self.dead.entry(d).or_default().push(Dead { start, len, birth, node: false });
    }

    /// Creates snapshots `names` (`DATASET@NAME` each) at once: one commit makes every
    /// dataset's tree durable, then each snapshot is its dataset's root as of it. All or
    /// none: a name that is bad, taken, or of a missing dataset (or of a snapshot) fails
    /// the whole call before anything changes. Returns their ids.
    pub fn create_snapshots(&mut self, names: &[String]) -> Result<Vec<u64>> {
        self.create_snapshots_with(names, None)
    }

    /// `create_snapshots`, each snapshot taking the guid given for it (a received one
    /// takes its sender's) or, without `guids`, a new one.
    pub(crate) fn create_snapshots_with(&mut self, names: &[String], guids: Option<&[u64]>) -> Result<Vec<u64>> {
        let mut origins = Vec::with_capacity(names.len());
        for (i, full) in names.iter().enumerate() {
            check_snapshot_name(full)?;
            if self.catalog.by_name.contains_key(full) || names[..i].contains(full) {
                return Err(Error::Exists(format!("snapshot {full}")));
            }
            let ds = full.split_once('@').map_or("", |(d, _)| d);
            let d = self.dataset_id(ds)?;
            origins.push(d);
        }
        self.select(crate::datasets::DEFAULT_DATASET)?;
        self.reserve(0, false)?;
        // Every tree on disk, so that the snapshot's root is a committed one and every
        // block it reaches was born at or before this generation.
        if self.is_dirty() {
            self.commit()?;
        }
        self.drain_kept();
        let g = self.sb.generation;
        let mut ids = Vec::with_capacity(names.len());
        for (i, (full, &d)) in names.iter().zip(&origins).enumerate() {
            let s = self.catalog.next_id.max(1);
            let live = if d == self.active { self.fs } else { self.parked.get(&d).map(|s| s.fs).unwrap_or(self.fs) };
            let meta = if d == self.active { self.meta } else { self.parked.get(&d).map_or(self.meta, |s| s.meta) };
            if live.is_dirty() {
                return Err(Error::Invalid(format!("dataset {d} changed during its snapshot")));
            }
            // Which snapshot this is, wherever a stream takes it (`send.rs`): never 0.
            let guid = guids.and_then(|g| g.get(i).copied()).unwrap_or_else(|| self.rng.next_u64()) | 1;
            let mut props = crest_nvlist::NvList::new();
            props.set("guid", crest_nvlist::Value::U64(guid)).map_err(|e| Error::Invalid(e.to_string()))?;
            let entry = Entry { name: full.clone(), props, snap: Some((d, g)) };
            self.root_tree.insert(&mut self.pager, record_key(s), crate::datasets::encode_entry(&entry)?)?;
            let zero = DatasetMeta { next_ino: 0, inode_count: 0 };
            self.parked.insert(s, Slot { fs: Tree { owner: tree_id(d), ..live }, meta, committed_meta: zero });
            self.catalog.insert(s, entry);
            self.catalog.next_id = s + 1;
            // What the dataset killed since its previous snapshot is now this one's.
            let handed = std::mem::take(&mut self.dead.entry(d).or_default().entries);
            self.dead.entry(d).or_default().replace(Vec::new());
            self.dead.entry(s).or_default().replace(handed);
            self.update_keep(d);
            ids.push(s);
        }
        self.root_tree.insert(
            &mut self.pager,
            crate::datasets::next_key(),
            self.catalog.next_id.to_le_bytes().to_vec(),
        )?;
        Ok(ids)
    }

    /// Destroys snapshot `name`, freeing what it alone held (module doc).
    pub fn destroy_snapshot(&mut self, name: &str) -> Result<()> {
        let s = self.dataset_id(name)?;
        let Some((d, g)) = self.catalog.by_id.get(&s).and_then(|e| e.snap) else {
            return Err(Error::Invalid(format!("{name} is not a snapshot")));
        };
        if self.open_handles.keys().any(|&ino| crate::datasets::dataset_of(ino) == s) {
            return Err(Error::Busy(format!("snapshot {name} has files open")));
        }
        self.select(crate::datasets::DEFAULT_DATASET)?;
        self.reserve(0, true)?;
        self.drain_kept();
        let (prev, next) = match self.catalog.snaps.get(&d) {
            Some(family) => (
                family.range(..(g, s)).next_back().map_or(0, |&(pg, _)| pg),
                family.range((g, s + 1)..).next().map_or(d, |&(_, id)| id),
            ),
            None => (0, d),
        };
        let next_list = std::mem::take(&mut self.dead.entry(next).or_default().entries);
        let mut kept = Vec::with_capacity(next_list.len());
        for e in next_list {
            if e.birth > prev {
                if e.node {
                    self.pager.free_later(e.start, 1);
                } else {
                    self.refs_drop_keeping(e.start, e.len, None)?;
                }
            } else {
                kept.push(e);
            }
        }
        kept.extend(self.dead.remove(&s).map(|l| l.entries).unwrap_or_default());
        self.dead.entry(next).or_default().replace(kept);
        self.drop_deadlist_items(s)?;
        self.parked.remove(&s);
        self.root_tree.delete(&mut self.pager, &Key::new(tree_id(s), kind::ROOT_ITEM, 0))?;
        self.root_tree.delete(&mut self.pager, &crate::store::usage_key(tree_id(s)))?;
        self.root_tree.delete(&mut self.pager, &record_key(s))?;
        self.catalog.remove(s);
        self.update_keep(d);
        Ok(())
    }

    /// Puts the shared nodes the engine kept since the last call on their datasets'
    /// deadlists: before any deadlist is handed on or consumed, so none is missed.
    fn drain_kept(&mut self) {
        for (owner, block, birth) in std::mem::take(&mut self.pager.kept) {
            if let Some(d) = crate::datasets::dataset_of_tree(owner) {
                self.dead.entry(d).or_default().push(Dead { start: block, len: 1, birth, node: true });
            }
        }
    }

    /// Rolls dataset D back to its newest snapshot `name`: D becomes that snapshot's tree
    /// again, and what D made since (nodes and data born after the snapshot) is freed.
    /// Refused while D has files open or a newer snapshot. Inode numbers given out since
    /// are not given again.
    pub fn rollback(&mut self, name: &str) -> Result<()> {
        let s = self.dataset_id(name)?;
        let Some((d, g)) = self.catalog.by_id.get(&s).and_then(|e| e.snap) else {
            return Err(Error::Invalid(format!("{name} is not a snapshot")));
        };
        if self.catalog.snaps.get(&d).is_some_and(|f| f.range((g, s + 1)..).next().is_some()) {
            return Err(Error::Busy(format!(
                "{name} is not the newest snapshot of its dataset; destroy the newer ones first"
            )));
        }
        if self.open_handles.keys().any(|&ino| crate::datasets::dataset_of(ino) == d) {
            return Err(Error::Busy(format!("the dataset of {name} has files open")));
        }
        self.select(crate::datasets::DEFAULT_DATASET)?;
        self.reserve(0, true)?;
        if self.is_dirty() {
            self.commit()?;
        }
        self.drain_kept();
        self.select(d)?;
        let snap_tree = self.parked.get(&s).map(|x| (x.fs, x.meta)).ok_or_else(|| Error::NotFound(name.to_string()))?;
        // What D made since: every node born after g (below a node born at or before g,
        // everything is the snapshot's too), and in those leaves the data born after g.
        let total = self.pager.total_blocks();
        let Some(root) = self.fs.root.on_disk(self.fs.level) else {
            return Err(Error::Invalid("rolling back a tree with uncommitted changes".into()));
        };
        let mut stack = vec![root];
        let mut runs = Vec::new();
        // (Freed only once the whole walk has succeeded: a leaf that cannot be read leaves
        // the dataset as it was.)
        let mut born = Vec::new();
        while let Some(ptr) = stack.pop() {
            if ptr.generation <= g {
                continue;
            }
            let node = self.pager.read_node(&ptr, self.fs.owner)?;
            match &node.body {
                crate::engine::node::Body::Internal(children) => {
                    for (_, c) in children.iter() {
                        if let Some(child) = c.on_disk(ptr.level - 1) {
                            stack.push(child);
                        }
                    }
                }
                crate::engine::node::Body::Leaf(items) => {
                    for (k, v) in items.iter().filter(|(k, _)| k.kind == kind::EXTENT) {
                        runs.extend(crate::fs::extent::Extent::decode(*k, v, total)?.runs());
                    }
                }
            }
            born.extend(ptr.copies());
        }
        for b in born {
            self.pager.free_later(b, 1);
        }
        for (start, len) in runs {
            self.drop_born_after(start, len, g)?;
        }
        let next_ino = self.meta.next_ino;
        self.fs = Tree { owner: self.fs.owner, ..snap_tree.0 };
        self.meta = DatasetMeta { next_ino: next_ino.max(snap_tree.1.next_ino), ..snap_tree.1 };
        // The tree is the snapshot's, clean, and the counters may be as they were: marked
        // as never committed, so the next commit writes its ROOT_ITEM (and USAGE) even when
        // another dataset is active by then.
        self.committed_meta = DatasetMeta { next_ino: 0, inode_count: 0 };
        let used = self.dataset_used_blocks_of_tree()?;
        self.usage.insert(d, used);
        // What D had stopped using since the snapshot is D's again.
        self.dead.entry(d).or_default().replace(Vec::new());
        Ok(())
    }

    /// Drops the data blocks of `[start, start + len)` born after generation `g`.
    fn drop_born_after(&mut self, start: u64, len: u64, g: u64) -> Result<()> {
        let lo = Key::new(start.saturating_sub(crate::limits::MAX_EXTENT_BLOCKS - 1), kind::EXTENT_REF, 0);
        let hi = Key::new(start + len - 1, kind::EXTENT_REF, u64::MAX);
        let items = self.refcount_tree.collect(&mut self.pager, &lo, &hi, usize::MAX)?;
        for (k, v) in items {
            let (s, e) = (k.objectid, k.objectid + k.offset);
            let (cs, ce) = (s.max(start), e.min(start + len));
            if ce <= cs {
                continue;
            }
            if crate::fs::extent::decode_ref(&v).is_some_and(|(_, birth)| birth > g) {
                self.refs_drop_keeping(cs, ce - cs, None)?;
            }
        }
        Ok(())
    }

    /// Data blocks the active tree's extents map (after a rollback).
    fn dataset_used_blocks_of_tree(&mut self) -> Result<u64> {
        let total = self.pager.total_blocks();
        let mut n = 0;
        let lo = Key::new(0, kind::EXTENT, 0);
        let hi = Key::new(crate::store::MAX_INO, kind::EXTENT, u64::MAX);
        self.fs.range(&mut self.pager, &lo, &hi, &mut |k, v| {
            if k.kind == kind::EXTENT {
                if let Ok(e) = crate::fs::extent::Extent::decode(*k, v, total) {
                    n += e.runs().iter().map(|r| r.1).sum::<u64>();
                }
            }
            Ok(true)
        })?;
        Ok(n)
    }

    /// Deletes every DEADLIST item of `id`.
    fn drop_deadlist_items(&mut self, id: u64) -> Result<()> {
        let keys: Vec<Key> = self
            .root_tree
            .collect(
                &mut self.pager,
                &Key::new(id, kind::DEADLIST, 0),
                &Key::new(id, kind::DEADLIST, u64::MAX),
                usize::MAX,
            )?
            .into_iter()
            .map(|(k, _)| k)
            .collect();
        for k in keys {
            self.root_tree.delete(&mut self.pager, &k)?;
        }
        Ok(())
    }

    /// At commit: the shared nodes the transaction stopped using go on their datasets'
    /// deadlists, and every deadlist that changed is written (from its first changed
    /// item on).
    pub(crate) fn write_deadlists(&mut self) -> Result<()> {
        self.drain_kept();
        let ids: Vec<u64> = self.dead.iter().filter(|(_, l)| l.dirty_from.is_some()).map(|(&id, _)| id).collect();
        for id in ids {
            let Some(list) = self.dead.get_mut(&id) else { continue };
            let from = list.dirty_from.take().unwrap_or(0) / DEAD_PER_ITEM;
            let chunks: Vec<Vec<u8>> = list.entries.chunks(DEAD_PER_ITEM).skip(from).map(encode_dead).collect();
            let stored = list.stored_items;
            list.stored_items = list.entries.len().div_ceil(DEAD_PER_ITEM) as u64;
            let total = list.stored_items;
            for (i, v) in chunks.into_iter().enumerate() {
                self.root_tree.insert(&mut self.pager, Key::new(id, kind::DEADLIST, (from + i) as u64), v)?;
            }
            for i in total..stored {
                self.root_tree.delete(&mut self.pager, &Key::new(id, kind::DEADLIST, i))?;
            }
        }
        Ok(())
    }
}

/// Deadlists as `open` reads them: by dataset or snapshot id, in item order.
pub(crate) fn load_deadlists(items: Vec<(Key, Vec<u8>)>, generation: u64) -> Result<BTreeMap<u64, Deadlist>> {
    let mut out: BTreeMap<u64, Deadlist> = BTreeMap::new();
    for (k, v) in items {
        let list = out.entry(k.objectid).or_default();
        if k.offset != list.stored_items {
            return Err(Error::bad_item(k, 0, "deadlist items out of sequence"));
        }
        list.entries.extend(decode_dead(k, &v, generation)?);
        list.stored_items += 1;
    }
    Ok(out)
}
