//! The store: one image, its trees and its transaction. `mkfs` writes a fresh image,
//! `open` finds the newest valid superblock, rebuilds the free-space bitmaps from the
//! trees and reclaims orphans, and `commit` makes everything done so far durable.
//!
//! Commit protocol (docs/format.md has the byte-level version):
//! 1. every dirty node is written to a block that was free in the last durable generation;
//! 2. flush — unless the image is format 3 and the transaction wrote few data blocks:
//!    then the superblock lists them (its manifest) and this flush is left out;
//! 3. the superblock copy `(generation + 1) % 2` is written, pointing at the new roots;
//! 4. flush. Only now does the commit count, and only now are blocks freed one
//!    transaction earlier handed back to the allocator.
//!
//! A crash before step 4 completes leaves the previous generation (the other copy is
//! untouched and every block it reaches is intact); after it, the new one. Without step
//! 2 the new superblock may land without some of what it reaches: `open` checks every
//! block a one-flush commit wrote (`verify_one_flush_commit`) before trusting it, and
//! takes the previous generation if any is missing.

use std::collections::{BTreeMap, HashMap};

use crate::datasets::{self, Catalog, Entry, Slot, DEFAULT_DATASET, DEFAULT_NAME};

use crate::disk::Disk;
use crate::engine::alloc::Allocator;
use crate::engine::btree::Tree;
use crate::engine::checksum::CSUM_CRC32C;
use crate::engine::key::Key;
use crate::engine::node::{BlockPtr, Body};
use crate::engine::pager::Pager;
use crate::engine::superblock::{
    Superblock, FEATURE_ONE_FLUSH, FORMAT_VERSION, OLDEST_FORMAT_VERSION, SUPERBLOCK_BYTES,
};
use crate::error::{Error, Result};
use crate::fs::inode::{le_u64, FileKind, Inode, Timespec, ROOT_INO};
use crate::fs::keys::kind;
use crate::limits::{
    BLOCKS_PER_GROUP, BLOCK_SIZE_U64, MIN_IMAGE_BYTES, RESERVED_BLOCKS, SUPERBLOCK_MIRROR_OFFSETS, SUPERBLOCK_OFFSETS,
};

/// Inode numbers stay below this (the orphan list's objectid and its neighbours above).
pub const MAX_INO: u64 = u64::MAX - 256;

/// Tree id of the root tree.
pub const ROOT_TREE_ID: u64 = 1;
/// Tree id of the refcount tree.
pub const REFCOUNT_TREE_ID: u64 = 2;
/// Tree id (and dataset id) of the default dataset's fs tree.
pub const FS_TREE_ID: u64 = 5;

/// When the store commits by itself.
#[derive(Clone, Debug)]
pub struct CommitPolicy {
    /// Commit after an operation once this many nodes are dirty.
    pub max_dirty_nodes: usize,
    /// `tick` commits when this long has passed since the last commit.
    pub interval_ms: u64,
}

impl Default for CommitPolicy {
    fn default() -> Self {
        CommitPolicy { max_dirty_nodes: 8192, interval_ms: 5_000 }
    }
}

/// Counters for benchmarks and `status`.
#[derive(Clone, Debug, Default)]
pub struct Stats {
    /// Commits since open.
    pub commits: u64,
    /// Bytes written to the disk since open.
    pub bytes_written: u64,
    /// Bad copies of tree nodes rewritten from their twins since open (by reads and scrub).
    pub repaired: u64,
}

/// Per-dataset counters kept in its ROOT_ITEM.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct DatasetMeta {
    pub next_ino: u64,
    pub inode_count: u64,
}

const ROOT_ITEM_BYTES: usize = 48;

fn encode_root_item(ptr: &BlockPtr, meta: &DatasetMeta) -> Vec<u8> {
    let mut b = vec![0u8; ROOT_ITEM_BYTES];
    b[0..8].copy_from_slice(&ptr.block.to_le_bytes());
    b[8..16].copy_from_slice(&ptr.generation.to_le_bytes());
    b[40..48].copy_from_slice(&ptr.twin.to_le_bytes());
    b[16] = ptr.level;
    b[24..32].copy_from_slice(&meta.next_ino.to_le_bytes());
    b[32..40].copy_from_slice(&meta.inode_count.to_le_bytes());
    b
}

pub(crate) fn decode_root_item(key: Key, b: &[u8], generation: u64) -> Result<(BlockPtr, DatasetMeta)> {
    if b.len() != ROOT_ITEM_BYTES || b[17..24].iter().chain(&b[48..]).any(|&x| x != 0) {
        return Err(Error::bad_item(key, 0, format!("root item of {} bytes or with reserved bytes set", b.len())));
    }
    let ptr = BlockPtr { block: le_u64(b, 0), twin: le_u64(b, 40), generation: le_u64(b, 8), level: b[16] };
    if ptr.twin == ptr.block {
        return Err(Error::bad_item(key, 0, "root's second copy is the block itself"));
    }
    if ptr.generation > generation {
        return Err(Error::bad_item(
            key,
            0,
            format!("root generation {} newer than the superblock's {generation}", ptr.generation),
        ));
    }
    Ok((ptr, DatasetMeta { next_ino: le_u64(b, 24), inode_count: le_u64(b, 32) }))
}

/// The USAGE item of the dataset whose tree is `tree`.
pub(crate) fn usage_key(tree: u64) -> Key {
    Key::new(tree, kind::USAGE, 0)
}

/// A USAGE item's value: `blocks` counted when the dataset's tree had root `ptr`.
pub(crate) fn encode_usage(ptr: &BlockPtr, blocks: u64) -> Vec<u8> {
    [ptr.block, ptr.generation, blocks].iter().flat_map(|v| v.to_le_bytes()).collect()
}

/// A USAGE item's (root block, root generation, blocks), if it is one.
pub(crate) fn decode_usage(b: &[u8]) -> Option<(u64, u64, u64)> {
    (b.len() == 24).then(|| (le_u64(b, 0), le_u64(b, 8), le_u64(b, 16)))
}

/// Options for `Store::mkfs`.
#[derive(Clone, Debug)]
pub struct MkfsOptions {
    /// Creation time of the root directory.
    pub now: Timespec,
    /// File system id; random when `None`.
    pub fsid: Option<[u8; 16]>,
    /// Where the root directory's generation comes from: the process's randomness when
    /// `None`, else this seed (a simulation must replay exactly: the generation travels
    /// in replies, and its encoded size with it).
    pub seed: Option<u64>,
    /// Copies of every tree node and superblock: 2 (DUP, the default in `crest mkfs`:
    /// a bad copy is read from and repaired by its twin) or 1.
    pub meta_copies: u8,
}

/// An open crest image.
pub struct Store {
    pub(crate) pager: Pager,
    pub(crate) sb: Superblock,
    pub(crate) root_tree: Tree,
    pub(crate) refcount_tree: Tree,
    /// The active dataset's tree and counters (`datasets.rs`: `select` swaps them with
    /// one of `parked`).
    pub(crate) fs: Tree,
    pub(crate) meta: DatasetMeta,
    pub(crate) committed_meta: DatasetMeta,
    /// Which dataset is active.
    pub(crate) active: u64,
    /// Every other dataset's tree and counters.
    pub(crate) parked: BTreeMap<u64, Slot>,
    /// Every dataset's name and properties.
    pub(crate) catalog: Catalog,
    /// Data blocks each dataset's files map (derived at open, like free space).
    pub(crate) usage: HashMap<u64, u64>,
    /// Deadlists by dataset or snapshot id (`snapshots.rs`).
    pub(crate) dead: BTreeMap<u64, crate::snapshots::Deadlist>,
    /// The snapshot whose tree operations on its dataset's inode numbers read
    /// (`set_view`), instead of the dataset's own.
    pub(crate) view: Option<u64>,
    pub(crate) open_handles: HashMap<u64, u32>,
    pub(crate) policy: CommitPolicy,
    last_commit_ms: Option<u64>,
    stats: Stats,
    /// Which superblock copy was used at open, and why the other was not.
    pub(crate) open_notes: Vec<String>,
    /// Nesting depth of `begin_unit`: while above zero, commits wait (see sessions.rs).
    pub(crate) unit_depth: u32,
    /// A commit was asked for (fsync, size policy) inside a unit; done at its end.
    pub(crate) commit_wanted: bool,
    /// The running operation's floor and the inodes being freed in steps.
    pub(crate) space: crate::fs::space::Space,
    /// Where inode generations come from: the process's randomness, or a seed a
    /// simulation passes in (`seed_randomness`), so that a run replays exactly.
    pub(crate) rng: crest_rng::Stream,
    /// Object-store state outside the trees (`fs/objects.rs`).
    pub(crate) objects: crate::fs::objects::Objects,
}

impl Store {
    /// Writes a fresh, empty file system onto `disk`.
    pub fn mkfs(disk: Box<dyn Disk>, opts: &MkfsOptions) -> Result<()> {
        Store::mkfs_in_format(disk, opts, FORMAT_VERSION)
    }

    /// As `mkfs`, in on-disk format `version` (`OLDEST_FORMAT_VERSION` makes an image an
    /// older crest can open; `upgrade_format` moves it on later).
    pub fn mkfs_in_format(disk: Box<dyn Disk>, opts: &MkfsOptions, version: u32) -> Result<()> {
        if !(OLDEST_FORMAT_VERSION..=FORMAT_VERSION).contains(&version) {
            return Err(Error::Invalid(format!(
                "on-disk format version {version} (this crest writes {OLDEST_FORMAT_VERSION} to {FORMAT_VERSION})"
            )));
        }
        let size = disk.size_bytes();
        if size < MIN_IMAGE_BYTES {
            return Err(Error::BadImage(format!(
                "image of {size} bytes is smaller than the minimum {MIN_IMAGE_BYTES}"
            )));
        }
        let total_blocks = size / BLOCK_SIZE_U64;
        let fsid = match opts.fsid {
            Some(id) => id,
            None => {
                let mut id = [0u8; 16];
                crest_rng::os_random_bytes(&mut id)
                    .map_err(|e| Error::BadImage(format!("no OS randomness for the fsid: {e}")))?;
                id
            }
        };
        let mut alloc = Allocator::new(total_blocks, BLOCKS_PER_GROUP);
        alloc.mark_used(0, RESERVED_BLOCKS);
        if !(1..=2).contains(&opts.meta_copies) {
            return Err(Error::Invalid(format!("{} metadata copies (1 or 2)", opts.meta_copies)));
        }
        let mut pager = Pager::new(disk, fsid, total_blocks, alloc);
        pager.set_copies(opts.meta_copies);
        // Clear every superblock slot so an older file system's copies cannot win.
        let zeros = [0u8; SUPERBLOCK_BYTES];
        let slots: Vec<(u64, &[u8])> =
            SUPERBLOCK_OFFSETS.into_iter().chain(SUPERBLOCK_MIRROR_OFFSETS).map(|off| (off, &zeros[..])).collect();
        pager.write_raw(&slots)?;
        let root_tree = Tree::create(&mut pager, ROOT_TREE_ID);
        let refcount_tree = Tree::create(&mut pager, REFCOUNT_TREE_ID);
        let mut fs = Tree::create(&mut pager, FS_TREE_ID);
        let root = Inode {
            ino: ROOT_INO,
            generation: opts.seed.map_or_else(crest_rng::next_u64, |s| crest_rng::Stream::from_seed_u64(s).next_u64()),
            kind: FileKind::Directory,
            mode: 0o755,
            nlink: 2,
            uid: 0,
            gid: 0,
            size: 0,
            blocks: 0,
            rdev: 0,
            atime: opts.now,
            mtime: opts.now,
            ctime: opts.now,
            crtime: opts.now,
            parent: ROOT_INO,
            next_index: 0,
            flags: 0,
        };
        fs.insert(&mut pager, Inode::key(ROOT_INO), root.encode())?;
        let meta = DatasetMeta { next_ino: ROOT_INO + 1, inode_count: 1 };
        let sb = Superblock {
            fsid,
            generation: 0,
            total_blocks,
            used_blocks: RESERVED_BLOCKS,
            root_tree: BlockPtr::default(),
            refcount_tree: BlockPtr::default(),
            csum_type: CSUM_CRC32C,
            meta_copies: opts.meta_copies,
            version,
            features: if version >= 3 { FEATURE_ONE_FLUSH } else { 0 },
            manifest: None,
        };
        let mut store = Store {
            pager,
            sb,
            root_tree,
            refcount_tree,
            fs,
            meta,
            committed_meta: DatasetMeta { next_ino: 0, inode_count: 0 },
            active: DEFAULT_DATASET,
            parked: BTreeMap::new(),
            catalog: Catalog::default(),
            usage: HashMap::new(),
            dead: BTreeMap::new(),
            view: None,
            open_handles: HashMap::new(),
            policy: CommitPolicy::default(),
            last_commit_ms: None,
            stats: Stats::default(),
            open_notes: Vec::new(),
            unit_depth: 0,
            commit_wanted: false,
            space: Default::default(),
            rng: crest_rng::Stream::from_process(),
            objects: Default::default(),
        };
        store.commit()?;
        // Both copies hold generation 1 so a fresh image has its fallback from the start.
        let other = 1 - Superblock::copy_for_generation(store.sb.generation);
        let sb = store.sb.clone();
        store.write_superblock(&sb, other)?;
        store.pager.flush()?;
        Ok(())
    }

    /// Writes copy `copy` of `sb` to its slot and, with two metadata copies, its mirror.
    pub(crate) fn write_superblock(&mut self, sb: &Superblock, copy: usize) -> Result<()> {
        let writes = self.superblock_writes(sb, copy);
        let refs: Vec<(u64, &[u8])> = writes.iter().map(|(o, b)| (*o, b.as_slice())).collect();
        self.pager.write_raw(&refs)
    }

    /// Copy `copy` of `sb`: (byte offset, bytes) for its slot and, with two metadata
    /// copies, its mirror.
    fn superblock_writes(&self, sb: &Superblock, copy: usize) -> Vec<(u64, Vec<u8>)> {
        let bytes = sb.encode(copy);
        let mut writes = vec![(SUPERBLOCK_OFFSETS[copy], bytes.clone())];
        if sb.meta_copies == 2 {
            writes.push((SUPERBLOCK_MIRROR_OFFSETS[copy], bytes));
        }
        writes
    }

    /// Opens an image: newest valid superblock wins; falls back to the other copy when
    /// the newest one's trees cannot be read. Orphans (files unlinked while open, left by
    /// a crash) are reclaimed.
    pub fn open(disk: Box<dyn Disk>) -> Result<Store> {
        let mut store = Store::open_keeping_orphans(disk)?;
        store.reclaim_orphans()?;
        Ok(store)
    }

    /// As `open`, but orphans stay until `reclaim_orphans`: a server restarting after a
    /// crash waits for its clients to open again the files they still hold.
    pub fn open_keeping_orphans(disk: Box<dyn Disk>) -> Result<Store> {
        let size = disk.size_bytes();
        let image_blocks = size / BLOCK_SIZE_U64;
        if size < MIN_IMAGE_BYTES {
            return Err(Error::BadImage(format!("{size} bytes is too small to be a crest image (truncated?)")));
        }
        let (mut candidates, mut notes) = read_superblocks(&*disk, image_blocks)?;
        if candidates.is_empty() {
            return Err(Error::BadImage(format!("no valid superblock: {}", notes.join("; "))));
        }
        if candidates.iter().any(|sb| sb.fsid != candidates[0].fsid) {
            notes.push("the superblock copies belong to different file systems; using the newest".into());
        }
        // Newest first; a slot's mirror (same generation, same bytes) is only a spare.
        candidates.sort_by_key(|sb| std::cmp::Reverse(sb.generation));
        candidates.dedup();
        let mut disk = Some(disk);
        let mut last_err = None;
        // One-flush generations passed over for damage (not for an I/O error, which may
        // pass): commits cut short.
        let mut cut_short = Vec::new();
        for (i, sb) in candidates.iter().enumerate() {
            let Some(d) = disk.take() else { break };
            match Store::load(d, sb.clone()) {
                Ok(mut store) => {
                    notes.extend(std::mem::take(&mut store.open_notes));
                    // The first commit after an open flushes twice. A commit cut short
                    // may have left nodes that carry the generation number this one takes,
                    // in the very blocks it allocates (it starts from the same free space):
                    // one of its own nodes lost under its superblock would then be taken
                    // for the old one. Made durable before its superblock is written, it
                    // cannot be, and every later number is new.
                    store.pager.flush_twice_next();
                    store.overwrite_cut_short(&cut_short, &mut notes)?;
                    // The data blocks the manifests list stay put until the next commit
                    // is durable: the check above (and of the fallback) reads them.
                    for (block, _) in candidates[i..].iter().filter_map(|c| c.manifest.as_ref()).flatten() {
                        store.pager.hold_until_next_commit(*block, 1);
                    }
                    if let Some(older) = candidates[i + 1..].iter().find(|o| o.generation < sb.generation) {
                        if let Err(e) = store.hold_older_generation(older) {
                            notes.push(format!(
                                "older generation {} not fully readable ({e}); it is no fallback",
                                older.generation
                            ));
                        }
                    }
                    if store.pager.check_writable().is_ok() {
                        if let Err(e) = store.undo_interrupted_receives() {
                            notes.push(format!("an unfinished receive could not be undone: {e}"));
                        }
                    }
                    store.open_notes = notes;
                    for n in &store.open_notes {
                        tracing::warn!("{n}");
                    }
                    crate::memory::give_back_freed();
                    return Ok(store);
                }
                Err((e, d)) => {
                    notes.push(format!("generation {} unusable: {e}", sb.generation));
                    if e.is_corruption() && sb.manifest.is_some() {
                        cut_short.push(sb.clone());
                    }
                    disk = Some(d);
                    last_err = Some(e);
                }
            }
        }
        match last_err {
            Some(e) if e.is_corruption() => Err(Error::BadImage(format!("no usable generation: {}", notes.join("; ")))),
            Some(e) => Err(e),
            None => Err(Error::BadImage(notes.join("; "))),
        }
    }

    /// Writes the generation open chose over each newer superblock it passed over whose
    /// one-flush commit did not fully land, and flushes. Left in place, such a copy would
    /// name blocks the next commits reuse, under the generation number the next commit
    /// takes again: a later crash that lost that commit's superblock could make the stale
    /// one verify against the new commit's nodes.
    fn overwrite_cut_short(&mut self, cut_short: &[Superblock], notes: &mut Vec<String>) -> Result<()> {
        // (Its own slot too: the generation chosen may have come from the slot's mirror.)
        let mut slots: Vec<usize> = cut_short
            .iter()
            .filter(|c| c.generation > self.sb.generation)
            .map(|c| Superblock::copy_for_generation(c.generation))
            .collect();
        slots.sort_unstable();
        slots.dedup();
        if slots.is_empty() || self.pager.check_writable().is_err() {
            return Ok(());
        }
        let sb = self.sb.clone();
        for copy in slots {
            self.write_superblock(&sb, copy)?;
            notes.push(format!("superblock copy {copy} (a commit cut short) now holds generation {}", sb.generation));
        }
        self.pager.flush()
    }

    /// Keeps every block the older superblock copy reaches allocated until the next commit
    /// is durable: that commit overwrites the older copy, and until then it is the fallback.
    fn hold_older_generation(&mut self, older: &Superblock) -> Result<()> {
        if older.fsid != self.sb.fsid || older.generation >= self.sb.generation {
            return Ok(());
        }
        let root = Tree::on_disk(ROOT_TREE_ID, older.root_tree);
        let refcount = Tree::on_disk(REFCOUNT_TREE_ID, older.refcount_tree);
        let (slots, _, _) = load_datasets(&mut self.pager, &root, older)?;
        let mut held = Vec::new();
        let mut seen: HashMap<u64, std::collections::HashSet<u64>> = HashMap::new();
        self.pager.set_caching(false);
        let walked = [root, refcount].into_iter().chain(slots.values().map(|s| s.fs)).try_for_each(|tree| {
            walk_unseen(&mut self.pager, &tree, seen.entry(tree.owner).or_default(), Leaves::None, &mut |ptr, _| {
                held.extend(ptr.copies().map(|b| (b, 1)));
                Ok(())
            })
        });
        self.pager.set_caching(true);
        walked?;
        refcount.range(&mut self.pager, &Key::MIN, &Key::MAX, &mut |k, _| {
            held.push((k.objectid, k.offset));
            Ok(true)
        })?;
        for (start, len) in held {
            self.pager.hold_until_next_commit(start, len);
        }
        Ok(())
    }

    fn load(disk: Box<dyn Disk>, sb: Superblock) -> std::result::Result<Store, (Error, Box<dyn Disk>)> {
        let mut alloc = Allocator::new(sb.total_blocks, BLOCKS_PER_GROUP);
        alloc.mark_used(0, RESERVED_BLOCKS);
        let mut pager = Pager::new(disk, sb.fsid, sb.total_blocks, alloc);
        pager.set_copies(sb.meta_copies);
        let root_tree = Tree::on_disk(ROOT_TREE_ID, sb.root_tree);
        let refcount_tree = Tree::on_disk(REFCOUNT_TREE_ID, sb.refcount_tree);
        let loaded = (|| {
            let mut notes = Vec::new();
            for (at, e) in verify_one_flush_commit(&mut pager, &sb)? {
                notes.push(format!("a node copy the last commit wrote did not land (block {at}: {e}); rewritten"));
            }
            let (mut slots, catalog, dead) = load_datasets(&mut pager, &root_tree, &sb)?;
            let Some(default) = slots.remove(&DEFAULT_DATASET) else {
                return Err(Error::corrupt("root tree", sb.root_tree.block, "no root item for dataset 5"));
            };
            // Live trees first (their usage is counted, unless a USAGE item says it), then
            // the snapshots sharing them.
            let live = |d: &u64| catalog.by_id.get(d).is_some_and(|e| e.snap.is_none());
            let trees: Vec<(Option<u64>, Tree)> =
                [(None, root_tree), (None, refcount_tree), (Some(DEFAULT_DATASET), default.fs)]
                    .into_iter()
                    .chain(slots.iter().filter(|(d, _)| live(d)).map(|(&d, s)| (Some(d), s.fs)))
                    .chain(slots.iter().filter(|(d, _)| !live(d)).map(|(_, s)| (None, s.fs)))
                    .collect();
            let mut known = HashMap::new();
            for (d, tree) in trees.iter().filter_map(|(d, t)| Some((d.as_ref()?, t))) {
                let Some(root) = tree.root.on_disk(tree.level) else { continue };
                let stored = root_tree.get(&mut pager, &usage_key(tree.owner))?;
                if let Some((block, generation, blocks)) = stored.as_deref().and_then(decode_usage) {
                    if (block, generation) == (root.block, root.generation) {
                        known.insert(*d, blocks);
                    }
                }
            }
            pager.set_caching(false);
            let usage = rebuild_allocation(&mut pager, sb.generation, &trees, &known, &refcount_tree, &mut notes);
            pager.set_caching(true);
            let usage = usage?;
            if pager.alloc.used_blocks() != sb.used_blocks {
                notes.push(format!(
                    "superblock says {} blocks used, the trees reach {} (run crest fsck)",
                    sb.used_blocks,
                    pager.alloc.used_blocks()
                ));
            }
            Ok::<_, Error>((default, slots, catalog, usage, dead, notes))
        })();
        match loaded {
            Ok((default, parked, catalog, usage, dead, notes)) => {
                let mut store = Store {
                    pager,
                    sb,
                    root_tree,
                    refcount_tree,
                    fs: default.fs,
                    meta: default.meta,
                    committed_meta: default.meta,
                    active: DEFAULT_DATASET,
                    parked,
                    catalog,
                    usage,
                    dead,
                    view: None,
                    open_handles: HashMap::new(),
                    policy: CommitPolicy::default(),
                    last_commit_ms: None,
                    stats: Stats::default(),
                    open_notes: notes,
                    unit_depth: 0,
                    commit_wanted: false,
                    space: Default::default(),
                    rng: crest_rng::Stream::from_process(),
                    objects: Default::default(),
                };
                for d in store.catalog.by_id.keys().copied().collect::<Vec<_>>() {
                    store.update_keep(d);
                }
                Ok(store)
            }
            Err(e) => Err((e, pager.into_disk())),
        }
    }

    /// Sets when the store commits by itself.
    pub fn set_policy(&mut self, policy: CommitPolicy) {
        self.policy = policy;
    }

    /// Generation of the last durable commit.
    pub fn generation(&self) -> u64 {
        self.sb.generation
    }

    /// File system id.
    pub fn fsid(&self) -> [u8; 16] {
        self.sb.fsid
    }

    /// What open noticed (a superblock copy skipped, a count that disagreed).
    pub fn open_notes(&self) -> &[String] {
        &self.open_notes
    }

    /// Counters since open.
    pub fn stats(&self) -> Stats {
        Stats { bytes_written: self.pager.bytes_written, repaired: self.pager.repaired, ..self.stats.clone() }
    }

    /// True when something waits to be committed.
    pub fn is_dirty(&self) -> bool {
        self.fs.is_dirty()
            || self.root_tree.is_dirty()
            || self.refcount_tree.is_dirty()
            || self.meta != self.committed_meta
            || self.parked.values().any(|s| s.fs.is_dirty() || s.meta != s.committed_meta)
            || !self.pager.kept.is_empty()
            || self.dead.values().any(|l| l.dirty_from.is_some())
    }

    /// Closes the store, committing first; returns the disk.
    pub fn close(mut self) -> Result<Box<dyn Disk>> {
        self.commit()?;
        Ok(self.pager.into_disk())
    }

    /// Drops the store without committing (what a crash does); returns the disk.
    pub fn abandon(self) -> Box<dyn Disk> {
        self.pager.into_disk()
    }

    /// Commits when the policy's interval has passed, and frees some of the deleted files'
    /// blocks not yet freed; the caller supplies the clock.
    pub fn tick(&mut self, now_ms: u64) -> Result<()> {
        if self.unit_depth == 0 && self.pager.check_writable().is_ok() {
            // A bounded amount a tick (256 extents, at most 256 MiB), so other calls wait little.
            self.reclaim_some(16)?;
        }
        let last = *self.last_commit_ms.get_or_insert(now_ms);
        if now_ms.saturating_sub(last) >= self.policy.interval_ms {
            self.last_commit_ms = Some(now_ms);
            if self.is_dirty() {
                self.commit()?;
            }
        }
        Ok(())
    }

    /// Commits when the running transaction has grown past the policy's size.
    pub(crate) fn maybe_commit(&mut self) -> Result<()> {
        if self.pager.dirty_nodes() >= self.policy.max_dirty_nodes {
            self.commit_or_defer()?;
        }
        Ok(())
    }

    /// Commits now, or at the end of the running unit if one is open.
    pub(crate) fn commit_or_defer(&mut self) -> Result<()> {
        if self.unit_depth > 0 {
            self.commit_wanted = true;
            return Ok(());
        }
        self.commit()
    }

    /// Blocks freed but not yet allocatable: until the commits after the one that freed
    /// them, and while a read planned before they were freed runs (`plan_read`).
    pub fn pending_free_blocks(&self) -> u64 {
        self.pager.pending_free_blocks()
    }

    /// Makes everything done so far durable (see the module doc for the protocol).
    pub fn commit(&mut self) -> Result<()> {
        self.commit_now(false)
    }

    /// Moves an image of an older on-disk format to this crest's (version 2 to 3: commits
    /// made with one flush where they can be); false if it was already there. Both
    /// superblock copies are rewritten, so that an older crest refuses the image instead of
    /// falling back to a copy of the old format.
    pub fn upgrade_format(&mut self) -> Result<bool> {
        if self.sb.version == FORMAT_VERSION {
            return Ok(false);
        }
        self.sb.version = FORMAT_VERSION;
        self.sb.features = FEATURE_ONE_FLUSH;
        self.commit_now(true)?;
        self.commit_now(true)?;
        Ok(true)
    }

    /// The on-disk format version the image is in.
    pub fn format_version(&self) -> u32 {
        self.sb.version
    }

    fn commit_now(&mut self, even_if_clean: bool) -> Result<()> {
        self.pager.check_writable()?;
        if !even_if_clean && !self.is_dirty() && self.pager.pending_free_blocks() == 0 && self.sb.generation > 0 {
            return Ok(());
        }
        let generation = self.sb.generation + 1;
        let mut writes = Vec::new();
        self.write_deadlists()?;
        // Every dataset's tree, then its ROOT_ITEM if its root or counters moved.
        let mut roots = vec![(self.active, self.fs.write(&mut self.pager, generation, &mut writes)?, self.meta)];
        for (&d, slot) in self.parked.iter_mut() {
            if slot.fs.is_dirty() || slot.meta != slot.committed_meta || slot.committed_meta.next_ino == 0 {
                roots.push((d, slot.fs.write(&mut self.pager, generation, &mut writes)?, slot.meta));
            }
        }
        for (d, ptr, meta) in roots {
            let root_key = Key::new(datasets::tree_id(d), kind::ROOT_ITEM, 0);
            let item = encode_root_item(&ptr, &meta);
            if self.root_tree.get(&mut self.pager, &root_key)?.as_deref() != Some(item.as_slice()) {
                self.root_tree.insert(&mut self.pager, root_key, item)?;
            }
            if self.catalog.by_id.get(&d).is_none_or(|e| e.snap.is_none()) {
                let usage = encode_usage(&ptr, self.dataset_used_blocks(d));
                let key = usage_key(datasets::tree_id(d));
                if self.root_tree.get(&mut self.pager, &key)?.as_deref() != Some(usage.as_slice()) {
                    self.root_tree.insert(&mut self.pager, key, usage)?;
                }
            }
        }
        let refcount = self.refcount_tree.write(&mut self.pager, generation, &mut writes)?;
        let root = self.root_tree.write(&mut self.pager, generation, &mut writes)?;
        // One flush where the image allows it and the data written fits the manifest: the
        // superblock goes with the nodes, and `open` checks that all of them landed.
        let manifest = if self.sb.features & FEATURE_ONE_FLUSH != 0 { self.pager.manifest() } else { None };
        self.pager.write_batch(writes)?;
        if manifest.is_none() {
            self.pager.flush()?;
        }
        let sb = Superblock {
            generation,
            used_blocks: self.pager.alloc.used_blocks() - self.pager.pending_free_blocks(),
            root_tree: root,
            refcount_tree: refcount,
            manifest,
            ..self.sb.clone()
        };
        let copy = Superblock::copy_for_generation(generation);
        self.write_superblock(&sb, copy)?;
        if let Err(e) = self.pager.flush() {
            if sb.manifest.is_some() {
                // The one flush failed (a block written back in error, say), yet the new
                // superblock may reach the disk, and until a reboot the page cache serves
                // what failed as if it were there: the last good generation goes back in
                // its place (best effort: the store is poisoned either way).
                self.pager.restore_raw(&self.superblock_writes(&self.sb.clone(), copy));
            }
            return Err(e);
        }
        self.sb = sb;
        self.committed_meta = self.meta;
        for slot in self.parked.values_mut() {
            slot.committed_meta = slot.meta;
        }
        self.pager.finish_commit();
        self.objects.gone_uncommitted.clear();
        self.stats.commits += 1;
        Ok(())
    }
}

/// Every dataset's tree and counters (from the ROOT_ITEMs) and the catalog (from the
/// DATASET and NEXT_DATASET items) of the root tree of `sb`'s generation.
pub(crate) fn load_datasets(pager: &mut Pager, root_tree: &Tree, sb: &Superblock) -> Result<Loaded> {
    let mut items = Vec::new();
    let mut dead_items = Vec::new();
    root_tree.range(pager, &Key::MIN, &Key::MAX, &mut |k, v| {
        if matches!(k.kind, kind::ROOT_ITEM | kind::DATASET | kind::NEXT_DATASET) {
            items.push((*k, v.to_vec()));
        } else if k.kind == kind::DEADLIST {
            dead_items.push((*k, v.to_vec()));
        }
        Ok(true)
    })?;
    let mut slots = BTreeMap::new();
    let mut catalog = Catalog { next_id: 1, ..Catalog::default() };
    for (k, v) in items {
        match k.kind {
            kind::ROOT_ITEM => {
                let d = datasets::dataset_of_tree(k.objectid)
                    .filter(|_| k.offset == 0)
                    .ok_or_else(|| Error::bad_item(k, 0, "root item of no dataset"))?;
                let (ptr, meta) = decode_root_item(k, &v, sb.generation)?;
                slots.insert(d, Slot { fs: Tree::on_disk(k.objectid, ptr), meta, committed_meta: meta });
            }
            kind::DATASET => {
                let e = datasets::decode_entry(k, &v)?;
                if k.offset != 0 || catalog.by_name.contains_key(&e.name) {
                    return Err(Error::bad_item(k, 0, format!("dataset name {:?} used twice", e.name)));
                }
                catalog.insert(k.objectid, e);
            }
            _ => {
                let b: [u8; 8] = v.as_slice().try_into().map_err(|_| Error::bad_item(k, 0, "next dataset id"))?;
                catalog.next_id = u64::from_le_bytes(b);
            }
        }
    }
    if !catalog.by_id.contains_key(&DEFAULT_DATASET) && !catalog.by_name.contains_key(DEFAULT_NAME) {
        catalog
            .insert(DEFAULT_DATASET, Entry { name: DEFAULT_NAME.to_string(), props: Default::default(), snap: None });
    }
    let named: Vec<u64> = catalog.by_id.keys().copied().collect();
    if named.iter().any(|d| !slots.contains_key(d)) || slots.keys().any(|d| !catalog.by_id.contains_key(d)) {
        return Err(Error::corrupt(
            "root tree",
            sb.root_tree.block,
            "a dataset without its tree, or a tree without a name",
        ));
    }
    if slots.keys().any(|&d| d >= catalog.next_id && d != DEFAULT_DATASET) {
        return Err(Error::corrupt("root tree", sb.root_tree.block, "a dataset id at or above the next one"));
    }
    // A snapshot's tree is its dataset's, as of its generation: its nodes carry that
    // dataset's tree id.
    for (&s, e) in &catalog.by_id {
        let Some((origin, gen)) = e.snap else { continue };
        let good = catalog.by_id.get(&origin).is_some_and(|o| o.snap.is_none()) && gen <= sb.generation;
        let Some(slot) = slots.get_mut(&s).filter(|_| good) else {
            return Err(Error::corrupt("root tree", sb.root_tree.block, format!("snapshot {} of no dataset", e.name)));
        };
        slot.fs.owner = datasets::tree_id(origin);
    }
    let dead = crate::snapshots::load_deadlists(dead_items, sb.generation)?;
    if dead.keys().any(|id| !catalog.by_id.contains_key(id)) {
        return Err(Error::corrupt("root tree", sb.root_tree.block, "a deadlist of no dataset"));
    }
    Ok((slots, catalog, dead))
}

/// Every superblock copy that verifies, from the two slots and their mirrors, and a note
/// for each that does not (mirrors only when the image keeps them). An intact copy of a
/// format or feature this crest does not know refuses the whole image: falling back to an
/// older copy would silently undo what a newer crest did.
pub(crate) fn read_superblocks(disk: &dyn Disk, image_blocks: u64) -> Result<(Vec<Superblock>, Vec<String>)> {
    let mut newer = None;
    let mut found = Vec::new();
    let mut notes = Vec::new();
    let mut mirror_notes = Vec::new();
    let places = SUPERBLOCK_OFFSETS.iter().enumerate().map(|(c, &o)| (c, o, false));
    let mirrors = SUPERBLOCK_MIRROR_OFFSETS.iter().enumerate().map(|(c, &o)| (c, o, true));
    for (copy, off, mirror) in places.chain(mirrors) {
        let what = if mirror { "mirror of superblock copy" } else { "superblock copy" };
        let mut buf = vec![0u8; SUPERBLOCK_BYTES];
        let r = match disk.read_at(off, &mut buf) {
            Err(e) => Err(format!("read failed: {e}")),
            Ok(()) => match Superblock::decode(&buf, copy, image_blocks) {
                Err(Error::NotSupported(why)) => {
                    newer.get_or_insert(format!("{what} {copy}: {why}"));
                    continue;
                }
                other => other.map_err(|e| e.to_string()),
            },
        };
        match r {
            Ok(sb) => found.push(sb),
            Err(e) if mirror => mirror_notes.push(format!("{what} {copy}: {e} (at byte {off})")),
            Err(e) => notes.push(format!("{what} {copy}: {e} (at byte {off})")),
        }
    }
    if let Some(why) = newer {
        return Err(Error::BadImage(format!("{why}; upgrade crest to open it")));
    }
    if found.iter().any(|sb| sb.meta_copies == 2) {
        notes.extend(mirror_notes);
    }
    Ok((found, notes))
}

/// What `load_datasets` finds: every dataset's tree, the catalog, the deadlists.
pub(crate) type Loaded = (BTreeMap<u64, Slot>, Catalog, BTreeMap<u64, crate::snapshots::Deadlist>);

/// Which leaves a walk reads (every internal node is read: it holds its children's places).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Leaves {
    All,
    /// Those written at this generation or later (an open verifies what the last commit
    /// wrote: damage there makes it fall back to the generation before), and each tree's
    /// last leaf (where an fs tree keeps its orphan list, which an open reads).
    Since(u64),
    None,
}

/// Visits every node of `tree` (parents before children) not in `seen`, adding each; a
/// node seen before is skipped with everything below it (a snapshot shares it). A leaf
/// `leaves` does not want is visited by its pointer alone (`None` for the node).
pub(crate) fn walk_unseen(
    pager: &mut Pager,
    tree: &Tree,
    seen: &mut std::collections::HashSet<u64>,
    leaves: Leaves,
    visit: &mut dyn FnMut(&BlockPtr, Option<&crate::engine::node::Node>) -> Result<()>,
) -> Result<()> {
    let Some(root) = tree.root.on_disk(tree.level) else {
        return Err(Error::Invalid("walking a tree with uncommitted changes".into()));
    };
    // (Each with whether it is the tree's last node at its level.)
    let mut stack = vec![(root, true)];
    while let Some((ptr, last)) = stack.pop() {
        if !seen.insert(ptr.block) {
            continue;
        }
        let wanted = match leaves {
            Leaves::All => true,
            Leaves::Since(generation) => ptr.generation >= generation || last,
            Leaves::None => false,
        };
        if ptr.level == 0 && !wanted {
            // (Its place is in its parent's pointer; what it holds is not wanted.)
            visit(&ptr, None)?;
            continue;
        }
        let node = pager.read_node(&ptr, tree.owner)?;
        visit(&ptr, Some(&node))?;
        if let Body::Internal(children) = &node.body {
            for (i, (_, c)) in children.iter().enumerate().rev() {
                if let Some(child) = c.on_disk(ptr.level - 1) {
                    stack.push((child, last && i + 1 == children.len()));
                }
            }
        }
    }
    Ok(())
}

/// Marks every block the trees reach as used: all nodes of `trees`, and every data extent
/// listed in the refcount tree. A block reached twice is corruption. Returns, by dataset,
/// the data blocks its extent items map (its usage): from `known` (USAGE items), else
/// counted in its leaves. Of the other leaves only those the last commit (`generation`)
/// wrote are read and verified: every node's place is in its parent's pointer, and an
/// older leaf is verified when it is read (and by scrub and fsck).
fn rebuild_allocation(
    pager: &mut Pager,
    generation: u64,
    trees: &[(Option<u64>, Tree)],
    known: &HashMap<u64, u64>,
    refcount: &Tree,
    notes: &mut Vec<String>,
) -> Result<HashMap<u64, u64>> {
    let total = pager.total_blocks();
    let mut mapped = HashMap::new();
    // Nodes seen, by tree id: a snapshot shares its dataset's (same id), nothing else does.
    let mut seen: HashMap<u64, std::collections::HashSet<u64>> = HashMap::new();
    for (live, tree) in trees {
        let mut blocks = Vec::new();
        let mut data = 0;
        let count = live.is_some_and(|d| !known.contains_key(&d));
        let leaves = if count { Leaves::All } else { Leaves::Since(generation) };
        walk_unseen(pager, tree, seen.entry(tree.owner).or_default(), leaves, &mut |ptr, node| {
            blocks.extend(ptr.copies());
            if let Some(Body::Leaf(items)) = node.filter(|_| count).map(|n| &n.body) {
                // (A damaged extent counts nothing here: a read of it fails, as it did.)
                for (k, v) in items.iter().filter(|(k, _)| k.kind == kind::EXTENT) {
                    if let Ok(e) = crate::fs::extent::Extent::decode(*k, v, total) {
                        data += e.runs().iter().map(|r| r.1).sum::<u64>();
                    }
                }
            }
            Ok(())
        })?;
        if let Some(d) = live {
            mapped.insert(*d, known.get(d).copied().unwrap_or(data));
        }
        for b in blocks {
            if pager.alloc.try_mark_used(b, 1).is_err() {
                return Err(Error::corrupt("node", b, format!("block reached twice (tree {})", tree.owner)));
            }
        }
    }
    let mut extents = Vec::new();
    refcount.range(pager, &Key::MIN, &Key::MAX, &mut |k, v| {
        extents.push((*k, v.len()));
        Ok(true)
    })?;
    for (k, vlen) in extents {
        let good = |k: &Key| (vlen == 4 || vlen == 12) && k.kind == kind::EXTENT_REF && k.offset > 0;
        if good(&k) && crate::fs::objects::within_one_object(k.objectid, k.offset) {
            // Object blocks: no allocator owns them (`fs/objects.rs`).
            continue;
        }
        if !good(&k)
            || k.objectid < RESERVED_BLOCKS
            || k.objectid.checked_add(k.offset).is_none_or(|e| e > pager.total_blocks())
        {
            return Err(Error::bad_item(k, 0, "bad refcount item"));
        }
        if let Err(b) = pager.alloc.try_mark_used(k.objectid, k.offset) {
            notes.push(format!("data block {b} reached twice"));
            return Err(Error::corrupt("refcount tree", b, "extent overlaps another extent or a node"));
        }
    }
    Ok(mapped)
}

/// Checks that a generation committed with one flush (a superblock with a manifest) fully
/// reached the disk: every data block its manifest lists, and a good copy of every node its
/// commit wrote (the nodes whose pointers carry its generation, reached from the roots
/// through such nodes alone). Anything missing or torn means the power failed before that
/// commit's flush returned: the generation is unusable and the one before is what the last
/// completed commit left (`open` and fsck then both use it). A copy that did not land
/// beside a good one is rewritten from it where the pager repairs (open, not fsck), and
/// returned. A generation committed with two flushes has nothing to check here.
pub(crate) fn verify_one_flush_commit(pager: &mut Pager, sb: &Superblock) -> Result<Vec<(u64, Error)>> {
    let Some(listed) = &sb.manifest else { return Ok(Vec::new()) };
    let mut buf = vec![0u8; crate::limits::BLOCK_SIZE];
    for &(block, crc) in listed {
        pager.read_blocks(block, &mut buf)?;
        if crate::engine::checksum::crc32c(&buf) != crc {
            return Err(Error::corrupt("data block", block, "written by the last commit, not on disk"));
        }
    }
    let mut stack = vec![(sb.root_tree, ROOT_TREE_ID), (sb.refcount_tree, REFCOUNT_TREE_ID)];
    let mut seen = std::collections::HashSet::new();
    let mut bad_copies = Vec::new();
    let mut rewrites = Vec::new();
    while let Some((ptr, owner)) = stack.pop() {
        if ptr.generation != sb.generation || !seen.insert((owner, ptr.block)) {
            continue;
        }
        let mut good = None;
        let mut bad = Vec::new();
        for at in ptr.copies() {
            match pager.read_copy(&ptr, at, owner) {
                Ok(copy) => good = good.or(Some(copy)),
                Err(e) => bad.push((at, e)),
            }
        }
        let Some((node, bytes)) = good else {
            return Err(bad.pop().map_or_else(|| Error::corrupt("node", ptr.block, "no copy"), |b| b.1));
        };
        rewrites.extend(bad.iter().map(|(at, _)| (*at, bytes.clone())));
        bad_copies.extend(bad);
        match node.body {
            Body::Internal(children) => {
                stack.extend(children.iter().filter_map(|(_, c)| Some((c.on_disk(ptr.level - 1)?, owner))));
            }
            Body::Leaf(items) if owner == ROOT_TREE_ID => {
                for (k, v) in items.iter().filter(|(k, _)| k.kind == kind::ROOT_ITEM) {
                    stack.push((decode_root_item(*k, v, sb.generation)?.0, k.objectid));
                }
            }
            Body::Leaf(_) => {}
        }
    }
    for (at, bytes) in rewrites {
        pager.rewrite_copy(at, &bytes);
    }
    Ok(bad_copies)
}

/// Visits every node of a tree (parents before children) with its pointer and level.
pub(crate) fn walk_nodes(
    pager: &mut Pager,
    tree: &Tree,
    visit: &mut dyn FnMut(&BlockPtr, &crate::engine::node::Node) -> Result<()>,
) -> Result<()> {
    // (Within one tree every node is reached once: nothing is ever skipped.)
    walk_unseen(pager, tree, &mut std::collections::HashSet::new(), Leaves::All, &mut |ptr, node| match node {
        Some(n) => visit(ptr, n),
        None => Ok(()),
    })
}

impl Store {
    /// Draws the store's randomness (inode generations) from `seed` from now on: for
    /// simulations that must replay exactly.
    pub fn seed_randomness(&mut self, seed: u64) {
        self.rng = crest_rng::Stream::from_seed_u64(seed);
    }
}

impl std::fmt::Debug for Store {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Store")
            .field("generation", &self.sb.generation)
            .field("total_blocks", &self.sb.total_blocks)
            .finish()
    }
}

/// Entry points for the fuzz targets (fuzz/): the root item's decoder, as opening an
/// image runs it on what the disk holds.
#[doc(hidden)]
pub mod fuzzing {
    use super::*;

    /// Decodes `b` as a DATASET item's value; a decoded one must encode back to the same
    /// bytes (the decoder accepts nothing the encoder would not write).
    pub fn dataset_record(b: &[u8]) -> bool {
        let key = Key::new(1, kind::DATASET, 0);
        match datasets::decode_entry(key, b) {
            Ok(e) => {
                assert_eq!(
                    datasets::encode_entry(&e).ok().as_deref(),
                    Some(b),
                    "a dataset record decodes to what encodes it"
                );
                true
            }
            Err(_) => false,
        }
    }

    /// Decodes `b` as a root item of an image at `generation`; a decoded one must encode
    /// back to the same bytes.
    pub fn root_item(b: &[u8], generation: u64) -> bool {
        let key = Key::new(FS_TREE_ID, kind::ROOT_ITEM, 0);
        match decode_root_item(key, b, generation) {
            Ok((ptr, meta)) => {
                assert_eq!(encode_root_item(&ptr, &meta), b, "a root item decodes to what encodes it");
                true
            }
            Err(_) => false,
        }
    }
}
