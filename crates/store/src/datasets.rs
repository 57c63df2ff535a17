//! Datasets: separately mountable file-system trees in one image, each with its own root
//! directory, inode numbers and properties (docs/format.md §4.5).
//!
//! Invariants:
//! - dataset `d` owns the inode numbers `[d << INO_BITS, (d + 1) << INO_BITS)` and its root
//!   directory is `(d << INO_BITS) | 1`; the default dataset is 0 (tree id 5, root inode
//!   1), so images made before datasets existed are unchanged. An operation runs in the
//!   dataset of the inode it names first (`enter`), and every other inode it names must
//!   be in the same one (EXDEV otherwise): state kept by inode number above the store
//!   never mixes datasets, and confining a client to a dataset is a range check;
//! - one tree is *active* (`Store::fs`, `Store::meta`); the others wait in `parked`.
//!   Entering another dataset swaps the two (a tree handle is a root pointer; its dirty
//!   nodes stay in the pager's arena), and `commit` writes every dirty tree;
//! - dataset ids are never reused (the NEXT_DATASET item), nor therefore inode numbers;
//! - the catalog (names, properties) is in memory and in the root tree's DATASET items,
//!   changed in the running transaction like everything else.

use std::collections::{BTreeMap, HashMap};

use crest_nvlist::{NvList, Value};

use crate::engine::btree::Tree;
use crate::engine::key::Key;
use crate::engine::node::Body;
use crate::error::{Error, Result};
use crate::fs::extent::Extent;
use crate::fs::inode::{FileKind, Inode, Timespec};
use crate::fs::keys::kind;
use crate::store::{walk_nodes, DatasetMeta, Store, FS_TREE_ID};

/// Low bits of an inode number that number inodes within their dataset.
pub const INO_BITS: u32 = 40;

/// The default dataset: the one an image starts with and a mount gets unless it asks.
pub const DEFAULT_DATASET: u64 = 0;

/// The default dataset's name.
pub const DEFAULT_NAME: &str = "default";

/// Highest dataset id (its inode range ends below the orphan objectid).
pub const MAX_DATASET_ID: u64 = (1 << (64 - INO_BITS)) - 2;

/// Longest dataset name.
pub const NAME_MAX: usize = 200;

/// Largest encoded property list of one dataset (it lives in one root-tree item).
pub const MAX_PROPS_BYTES: usize = 1500;

/// Tree ids of datasets other than the default sit above every fixed tree id.
const DATASET_TREE_BASE: u64 = 1 << 32;

/// The dataset inode `ino` belongs to.
pub fn dataset_of(ino: u64) -> u64 {
    ino >> INO_BITS
}

/// The root directory of dataset `d`.
pub fn root_of(d: u64) -> u64 {
    (d << INO_BITS) | 1
}

/// The first inode number after dataset `d`'s range.
pub(crate) fn range_end(d: u64) -> u64 {
    (d + 1) << INO_BITS
}

/// The id of dataset `d`'s fs tree (also the objectid of its ROOT_ITEM).
pub(crate) fn tree_id(d: u64) -> u64 {
    if d == DEFAULT_DATASET {
        FS_TREE_ID
    } else {
        DATASET_TREE_BASE + d
    }
}

/// The dataset whose fs tree is `tree`, if it is one.
pub(crate) fn dataset_of_tree(tree: u64) -> Option<u64> {
    match tree {
        FS_TREE_ID => Some(DEFAULT_DATASET),
        t if t > DATASET_TREE_BASE && t - DATASET_TREE_BASE <= MAX_DATASET_ID => Some(t - DATASET_TREE_BASE),
        _ => None,
    }
}

/// Key of the NEXT_DATASET item: the id the next dataset gets.
pub(crate) fn next_key() -> Key {
    Key::new(0, kind::NEXT_DATASET, 0)
}

/// Key of dataset `d`'s DATASET item (name and properties).
pub(crate) fn record_key(d: u64) -> Key {
    Key::new(d, kind::DATASET, 0)
}

/// A dataset tree that is not the active one.
#[derive(Clone, Debug)]
pub(crate) struct Slot {
    pub fs: Tree,
    pub meta: DatasetMeta,
    pub committed_meta: DatasetMeta,
}

/// What the catalog knows of one dataset.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Entry {
    pub name: String,
    pub props: NvList,
    /// For a snapshot: the dataset it is of, and the generation it holds.
    pub snap: Option<(u64, u64)>,
}

/// Every dataset's name and properties.
#[derive(Clone, Debug, Default)]
pub(crate) struct Catalog {
    pub by_id: BTreeMap<u64, Entry>,
    pub by_name: HashMap<String, u64>,
    pub next_id: u64,
    /// Snapshots by dataset: (generation, id), oldest first.
    pub snaps: HashMap<u64, std::collections::BTreeSet<(u64, u64)>>,
}

impl Catalog {
    pub(crate) fn insert(&mut self, d: u64, e: Entry) {
        if let Some((origin, g)) = e.snap {
            self.snaps.entry(origin).or_default().insert((g, d));
        }
        self.by_name.insert(e.name.clone(), d);
        self.by_id.insert(d, e);
    }

    pub(crate) fn remove(&mut self, d: u64) {
        if let Some(e) = self.by_id.remove(&d) {
            self.by_name.remove(&e.name);
            if let Some((origin, g)) = e.snap {
                if let Some(set) = self.snaps.get_mut(&origin) {
                    set.remove(&(g, d));
                }
            }
        }
    }
}

/// A dataset as `list` and `get` show it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DatasetInfo {
    /// Its id (the high bits of its inode numbers).
    pub id: u64,
    /// Its name.
    pub name: String,
    /// Its root directory.
    pub root: u64,
    /// Inodes in it.
    pub inodes: u64,
    /// Its properties as set (`quota`, `readonly`, `atime`, `user:*`…).
    pub props: NvList,
}

/// Checks a dataset name: 1 to `NAME_MAX` bytes of letters, digits and `_ - . :`, not
/// starting with `-` or `.` (`@` and `/` are kept for snapshots and hierarchy).
pub fn check_name(name: &str) -> Result<()> {
    let ok = !name.is_empty()
        && name.len() <= NAME_MAX
        && !name.starts_with(['-', '.'])
        && name.bytes().all(|b| b.is_ascii_alphanumeric() || b"_-.:".contains(&b));
    if ok {
        Ok(())
    } else {
        Err(Error::Invalid(format!(
            "dataset name {name:?}: 1 to {NAME_MAX} letters, digits, '_', '-', '.' or ':', not starting with '-' or '.'"
        )))
    }
}

/// Checks one property and returns it as stored: `quota` (bytes, 0 = none), `readonly`
/// and `atime` (on/off), `copies` (1 or 2: of data
/// written from then on), `user:*` (any text up to 1024 bytes).
pub fn check_prop(name: &str, value: &str) -> Result<Value> {
    let bad = |why: &str| Err(Error::Invalid(format!("property {name}={value:?}: {why}")));
    let flag = |v: &str| match v {
        "on" | "yes" | "true" | "1" => Some(true),
        "off" | "no" | "false" | "0" => Some(false),
        _ => None,
    };
    match name {
        "quota" => match parse_size(value) {
            Some(n) => Ok(Value::U64(n)),
            None => bad("a size in bytes (K, M, G, T suffixes), or none"),
        },
        "readonly" | "atime" => match flag(value) {
            Some(b) => Ok(Value::Bool(b)),
            None => bad("on or off"),
        },
        "copies" => match value {
            "1" => Ok(Value::U64(1)),
            "2" => Ok(Value::U64(2)),
            _ => bad("1 or 2 copies of each data block (metadata always keeps the image's copies)"),
        },
        n if n.starts_with("user:") && n.len() > 5 => {
            if value.len() > 1024 {
                bad("user properties hold at most 1024 bytes")
            } else {
                Ok(Value::Str(value.to_string()))
            }
        }
        _ => bad("unknown property (quota, readonly, atime, copies, user:NAME)"),
    }
}

/// A property's value as text, as `get` prints it.
pub fn show_prop(name: &str, value: &Value) -> String {
    match (name, value) {
        (_, Value::Bool(b)) => if *b { "on" } else { "off" }.to_string(),
        ("quota", Value::U64(0)) => "none".to_string(),
        (_, Value::U64(n)) => n.to_string(),
        (_, Value::Str(s)) => s.clone(),
        (_, other) => format!("{other:?}"),
    }
}

/// Bytes from "none", "0", "123", "10K", "5M", "2G", "1T" (powers of 1024).
pub fn parse_size(s: &str) -> Option<u64> {
    if s == "none" {
        return Some(0);
    }
    let (digits, shift) = match s.as_bytes().last()? {
        b'K' | b'k' => (&s[..s.len() - 1], 10),
        b'M' | b'm' => (&s[..s.len() - 1], 20),
        b'G' | b'g' => (&s[..s.len() - 1], 30),
        b'T' | b't' => (&s[..s.len() - 1], 40),
        _ => (s, 0),
    };
    digits.parse::<u64>().ok()?.checked_mul(1u64 << shift)
}

/// Decodes a DATASET item's value.
pub(crate) fn decode_entry(key: Key, b: &[u8]) -> Result<Entry> {
    if b.len() > MAX_PROPS_BYTES {
        return Err(Error::bad_item(key, 0, format!("dataset record of {} bytes", b.len())));
    }
    let l = NvList::decode(b).map_err(|e| Error::bad_item(key, 0, format!("dataset record: {e}")))?;
    // Exactly what `encode_entry` writes: the name, then the properties if any.
    let names: Vec<&str> = l.iter().map(|(n, _)| n).collect();
    let snapshot_fields = names == ["name", "origin", "gen"] || names == ["name", "origin", "gen", "guid"];
    if names != ["name"] && names != ["name", "props"] && !snapshot_fields {
        return Err(Error::bad_item(key, 0, format!("dataset record with fields {names:?}")));
    }
    let name = l.get_str("name").ok_or_else(|| Error::bad_item(key, 0, "dataset record without a name"))?;
    let props = match l.get("props") {
        // A snapshot's guid (`send.rs`) shows among its properties.
        None if names.len() == 4 => {
            let guid = l.get_u64("guid").ok_or_else(|| Error::bad_item(key, 0, "snapshot guid is not a number"))?;
            let mut p = NvList::new();
            p.add("guid", Value::U64(guid)).map_err(|e| Error::bad_item(key, 0, e.to_string()))?;
            p
        }
        None => NvList::new(),
        Some(Value::List(p)) if !p.is_empty() => p.clone(),
        Some(_) => return Err(Error::bad_item(key, 0, "dataset properties that are not a non-empty list")),
    };
    let snap = match (snapshot_fields, l.get_u64("origin"), l.get_u64("gen")) {
        (true, Some(o), Some(g)) => Some((o, g)),
        (true, ..) => return Err(Error::bad_item(key, 0, "snapshot record without its origin and generation")),
        _ => None,
    };
    match snap {
        Some(_) => crate::snapshots::check_snapshot_name(name).map_err(|e| Error::bad_item(key, 0, e.to_string()))?,
        None => check_name(name).map_err(|e| Error::bad_item(key, 0, e.to_string()))?,
    }
    Ok(Entry { name: name.to_string(), props, snap })
}

pub(crate) fn encode_entry(e: &Entry) -> Result<Vec<u8>> {
    let mut l = NvList::new();
    l.add("name", Value::Str(e.name.clone())).map_err(|x| Error::Invalid(x.to_string()))?;
    if let Some((origin, gen)) = e.snap {
        l.add("origin", Value::U64(origin)).map_err(|x| Error::Invalid(x.to_string()))?;
        l.add("gen", Value::U64(gen)).map_err(|x| Error::Invalid(x.to_string()))?;
        if let Some(guid) = e.props.get_u64("guid") {
            l.add("guid", Value::U64(guid)).map_err(|x| Error::Invalid(x.to_string()))?;
        }
    } else if !e.props.is_empty() {
        l.add("props", Value::List(e.props.clone())).map_err(|x| Error::Invalid(x.to_string()))?;
    }
    let b = l.encode();
    if b.len() > MAX_PROPS_BYTES {
        return Err(Error::TooBig(format!("dataset properties of {} bytes (at most {MAX_PROPS_BYTES})", b.len())));
    }
    Ok(b)
}

impl Store {
    /// Makes dataset `d`'s tree the active one.
    pub(crate) fn select(&mut self, d: u64) -> Result<()> {
        if d == self.active {
            return Ok(());
        }
        let Some(slot) = self.parked.remove(&d) else {
            return Err(Error::NotFound(format!("dataset {d}")));
        };
        let old = Slot {
            fs: std::mem::replace(&mut self.fs, slot.fs),
            meta: std::mem::replace(&mut self.meta, slot.meta),
            committed_meta: std::mem::replace(&mut self.committed_meta, slot.committed_meta),
        };
        self.parked.insert(self.active, old);
        self.active = d;
        Ok(())
    }

    /// Makes the dataset of `ino` the active one — or, when a snapshot of that dataset is
    /// the view (`set_view`), the snapshot.
    pub(crate) fn enter(&mut self, ino: u64) -> Result<()> {
        let d = dataset_of(ino);
        match self.view.filter(|v| self.catalog.by_id.get(v).and_then(|e| e.snap).is_some_and(|(o, _)| o == d)) {
            Some(v) => self.select(v),
            None => self.select(d),
        }
    }

    /// From now on, operations on dataset `d`'s inode numbers read snapshot `view` of it
    /// instead (`None`: the datasets themselves). A server sets it around the requests of
    /// a session that mounts a snapshot; every change is refused there (EROFS).
    pub fn set_view(&mut self, view: Option<u64>) {
        self.view = view;
    }

    /// The snapshot operations read instead of its dataset (`set_view`).
    pub fn view(&self) -> Option<u64> {
        self.view
    }

    /// The dataset a snapshot is of (itself for a dataset).
    pub fn origin_of(&self, d: u64) -> u64 {
        self.catalog.by_id.get(&d).and_then(|e| e.snap).map_or(d, |(o, _)| o)
    }

    /// Enters the dataset of `first`; `other` must be in it too.
    pub(crate) fn enter_both(&mut self, first: u64, other: u64) -> Result<()> {
        if dataset_of(first) != dataset_of(other) {
            return Err(Error::CrossDataset(format!("inodes {first} and {other} are in different datasets")));
        }
        self.enter(first)
    }

    /// Every dataset id, the default first.
    pub(crate) fn dataset_ids(&self) -> Vec<u64> {
        let mut ids: Vec<u64> = self.parked.keys().copied().chain([self.active]).collect();
        ids.sort_unstable();
        ids
    }

    /// Every dataset, by id.
    pub fn datasets(&self) -> Vec<DatasetInfo> {
        self.dataset_ids().into_iter().filter_map(|d| self.dataset_info(d)).collect()
    }

    /// The dataset named `name`.
    pub fn dataset(&self, name: &str) -> Result<DatasetInfo> {
        let d = self.dataset_id(name)?;
        self.dataset_info(d).ok_or_else(|| Error::NotFound(format!("dataset {name}")))
    }

    /// The properties of dataset `d`.
    pub fn dataset_props(&self, d: u64) -> Option<&NvList> {
        self.catalog.by_id.get(&d).map(|e| &e.props)
    }

    /// The id of the dataset named `name`.
    pub fn dataset_id(&self, name: &str) -> Result<u64> {
        self.catalog.by_name.get(name).copied().ok_or_else(|| Error::NotFound(format!("dataset {name}")))
    }

    fn dataset_info(&self, d: u64) -> Option<DatasetInfo> {
        let e = self.catalog.by_id.get(&d)?;
        let meta = if d == self.active { self.meta } else { self.parked.get(&d)?.meta };
        Some(DatasetInfo {
            id: d,
            name: e.name.clone(),
            root: root_of(d),
            inodes: meta.inode_count,
            props: e.props.clone(),
        })
    }

    /// Creates an empty dataset named `name` whose root directory is owned by `uid:gid`
    /// with `mode`; returns its id.
    pub fn create_dataset(&mut self, name: &str, props: NvList, root: (u32, u32, u32), now: Timespec) -> Result<u64> {
        check_name(name)?;
        if self.catalog.by_name.contains_key(name) {
            return Err(Error::Exists(format!("dataset {name}")));
        }
        let d = self.catalog.next_id.max(1);
        if d > MAX_DATASET_ID {
            return Err(Error::NoSpace("no dataset id left".into()));
        }
        let entry = Entry { name: name.to_string(), props, snap: None };
        let record = encode_entry(&entry)?;
        self.select(DEFAULT_DATASET)?;
        self.reserve(0, false)?;
        let mut fs = Tree::create(&mut self.pager, tree_id(d));
        let ino = root_of(d);
        let (uid, gid, mode) = root;
        let inode = Inode {
            ino,
            generation: self.rng.next_u64(),
            kind: FileKind::Directory,
            mode: mode & 0o7777,
            nlink: 2,
            uid,
            gid,
            size: 0,
            blocks: 0,
            rdev: 0,
            atime: now,
            mtime: now,
            ctime: now,
            crtime: now,
            parent: ino,
            next_index: 0,
            flags: 0,
        };
        fs.insert(&mut self.pager, Inode::key(ino), inode.encode())?;
        let meta = DatasetMeta { next_ino: ino + 1, inode_count: 1 };
        // (Its ROOT_ITEM is written by the commit, as every dataset's is.)
        self.parked.insert(d, Slot { fs, meta, committed_meta: DatasetMeta { next_ino: 0, inode_count: 0 } });
        self.root_tree.insert(&mut self.pager, record_key(d), record)?;
        self.catalog.next_id = d + 1;
        self.root_tree.insert(&mut self.pager, next_key(), self.catalog.next_id.to_le_bytes().to_vec())?;
        self.catalog.insert(d, entry);
        Ok(d)
    }

    /// Sets (or with `None` clears) properties of dataset `name`, all or none.
    pub fn set_dataset_props(&mut self, name: &str, changes: &[(String, Option<Value>)]) -> Result<()> {
        let d = self.dataset_id(name)?;
        let mut entry =
            self.catalog.by_id.get(&d).cloned().ok_or_else(|| Error::NotFound(format!("dataset {name}")))?;
        for (k, v) in changes {
            match v {
                Some(v) => {
                    entry.props.set(k.clone(), v.clone()).map_err(|e| Error::Invalid(e.to_string()))?;
                }
                None => {
                    entry.props.remove(k);
                }
            }
        }
        let record = encode_entry(&entry)?;
        self.select(DEFAULT_DATASET)?;
        self.reserve(0, false)?;
        self.root_tree.insert(&mut self.pager, record_key(d), record)?;
        self.catalog.insert(d, entry);
        Ok(())
    }

    /// Destroys dataset `name` and everything in it, in the running transaction (so one
    /// commit makes it gone entirely or not at all). The default dataset cannot go, nor a
    /// dataset with files open (`open_handles`; the server refuses while it is mounted).
    pub fn destroy_dataset(&mut self, name: &str) -> Result<()> {
        let d = self.dataset_id(name)?;
        if d == DEFAULT_DATASET {
            return Err(Error::NotPermitted("the default dataset cannot be destroyed".into()));
        }
        if self.open_handles.keys().any(|&ino| dataset_of(ino) == d) || self.space_holds(d) {
            return Err(Error::Busy(format!("dataset {name} has files open or being freed")));
        }
        if let Some(e) = self.catalog.by_id.get(&d).filter(|e| e.snap.is_some()) {
            return Err(Error::Invalid(format!("{} is a snapshot (crest snapshot destroy)", e.name)));
        }
        if self.catalog.snaps.get(&d).is_some_and(|s| !s.is_empty()) {
            return Err(Error::Busy(format!("dataset {name} has snapshots; destroy them first")));
        }
        // Its tree must be on disk to be walked: commit first if it has changes.
        let dirty =
            if d == self.active { self.fs.is_dirty() } else { self.parked.get(&d).is_some_and(|s| s.fs.is_dirty()) };
        if dirty {
            self.commit()?;
        }
        self.select(DEFAULT_DATASET)?;
        self.reserve(0, true)?;
        if d == self.active {
            self.select(DEFAULT_DATASET)?;
        }
        let Some(fs) = self.parked.get(&d).map(|slot| slot.fs) else {
            return Err(Error::NotFound(format!("dataset {name}")));
        };
        let total = self.pager.total_blocks();
        let mut nodes = Vec::new();
        let mut runs = Vec::new();
        // (Walked before anything changes: a leaf that cannot be read leaves the dataset
        // as it was, still there.)
        walk_nodes(&mut self.pager, &fs, &mut |ptr, node| {
            nodes.extend(ptr.copies());
            if let Body::Leaf(items) = &node.body {
                for (k, v) in items.iter() {
                    if k.kind == kind::EXTENT {
                        runs.extend(Extent::decode(*k, v, total)?.runs());
                    }
                }
            }
            Ok(())
        })?;
        self.parked.remove(&d);
        let saved = self.policy.max_dirty_nodes;
        self.policy.max_dirty_nodes = usize::MAX; // one transaction
        let result = (|| {
            for (start, len) in runs {
                // (No snapshot holds them: a dataset with snapshots is not destroyed.)
                self.refs_drop_keeping(start, len, None)?;
            }
            for b in nodes {
                self.pager.free_later(b, 1);
            }
            self.root_tree.delete(&mut self.pager, &Key::new(tree_id(d), kind::ROOT_ITEM, 0))?;
            self.root_tree.delete(&mut self.pager, &crate::store::usage_key(tree_id(d)))?;
            self.root_tree.delete(&mut self.pager, &record_key(d))?;
            Ok(())
        })();
        self.policy.max_dirty_nodes = saved;
        self.catalog.remove(d);
        self.usage.remove(&d);
        self.dead.remove(&d);
        result
    }

    /// Counts `blocks` newly mapped into a file of the active dataset.
    pub(crate) fn charge(&mut self, blocks: u64) {
        *self.usage.entry(self.active).or_default() += blocks;
    }

    /// Counts `blocks` unmapped from a file of the active dataset.
    pub(crate) fn uncharge(&mut self, blocks: u64) {
        let u = self.usage.entry(self.active).or_default();
        *u = u.saturating_sub(blocks);
    }

    /// Data blocks the files of dataset `d` map.
    pub fn dataset_used_blocks(&self, d: u64) -> u64 {
        self.usage.get(&d).copied().unwrap_or(0)
    }

    /// The active dataset's quota in blocks, if it has one.
    fn quota_blocks(&self) -> Option<u64> {
        let q = self.catalog.by_id.get(&self.active)?.props.get_u64("quota")?;
        (q > 0).then(|| q.div_ceil(crate::limits::BLOCK_SIZE_U64))
    }

    /// Refuses (EDQUOT) an operation that would map `blocks` more data blocks into the
    /// active dataset beyond its quota.
    pub(crate) fn check_quota(&self, blocks: u64) -> Result<()> {
        let Some(quota) = self.quota_blocks() else { return Ok(()) };
        let used = self.dataset_used_blocks(self.active);
        if used.saturating_add(blocks) > quota {
            return Err(Error::Quota(format!(
                "dataset {} would use {} of its {quota} blocks",
                self.active,
                used.saturating_add(blocks)
            )));
        }
        Ok(())
    }

    /// `statfs` as the dataset of `in_ino` shows it: its own inode count, and with a quota,
    /// the quota as its size and what is left of it as its free space.
    pub fn dataset_statfs(&mut self, in_ino: u64) -> Result<crate::fs::ops::StatFs> {
        self.enter(in_ino)?;
        let mut f = self.statfs();
        if let Some(quota) = self.quota_blocks() {
            let left = quota.saturating_sub(self.dataset_used_blocks(self.active));
            f.total_blocks = f.total_blocks.min(quota);
            f.free_blocks = f.free_blocks.min(left);
            f.avail_blocks = f.avail_blocks.min(left);
        }
        Ok(f)
    }

    /// Whether inodes of dataset `d` are being freed in steps.
    fn space_holds(&self, d: u64) -> bool {
        self.space.doomed_in(d)
    }
}
