//! Scrub, online: every copy of every tree node and superblock, and every data block every
//! dataset and snapshot maps, read back and checked, a bounded step at a time between the
//! server's other work, with its position kept in the image (a SCRUB item) so that it
//! resumes after a restart.
//!
//! Metadata first: the superblock slots and their mirrors and the root and refcount trees
//! at the first step, each dataset's tree as its data scan starts. Every copy of a node is
//! read straight from the disk and verified against its parent's pointer; a bad copy with
//! a good twin is rewritten from it (`Pager::rewrite_copy`: safe at any time, the block's
//! bytes do not change meaning) and counted as repaired. What the walk checks is the last
//! committed generation, whose blocks no allocation can reuse before the next commit.
//! A node with no good copy, or a bad data block (one copy), is reported by dataset and
//! path; reads of it fail with EIO, never bad data.

use crest_nvlist::{NvList, Value};

use crate::engine::btree::Tree;
use crate::engine::key::Key;
use crate::engine::node::Body;
use crate::engine::superblock::{Superblock, SUPERBLOCK_BYTES};
use crate::error::{Error, Result};
use crate::fs::extent::Extent;
use crate::fs::keys::kind;
use crate::limits::BLOCK_SIZE;
use crate::limits::{SUPERBLOCK_MIRROR_OFFSETS, SUPERBLOCK_OFFSETS};
use crate::store::Store;

/// Most problems a scrub keeps in memory (the count goes on).
const MAX_REPORTED: usize = 1000;

/// Bytes of the SCRUB item (within the item limit): the problems beyond it are counted.
const MAX_ITEM_USE: usize = 1700;

/// Repairs described in the SCRUB item (the count goes on).
const MAX_FIXED: usize = 8;

/// Where a scrub is and what it found.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Scrub {
    /// The dataset (or snapshot) being read, by id.
    pub dataset: u64,
    /// The next key to read in it.
    pub next: (u64, u8, u64),
    /// Data blocks read and checked.
    pub blocks: u64,
    /// Node and superblock copies read and checked.
    pub nodes: u64,
    /// Copies found bad and rewritten from a good twin.
    pub repaired: u64,
    /// What was repaired (the first few; `repaired` counts them all).
    pub fixed: Vec<String>,
    /// Problems found: (dataset name, inode, what), the path filled in when reported.
    pub bad: Vec<(String, u64, String)>,
    /// Problems found beyond those kept.
    pub more_bad: u64,
    /// Every dataset was read.
    pub done: bool,
}

fn scrub_key() -> Key {
    Key::new(0, kind::SCRUB, 0)
}

impl Scrub {
    /// The SCRUB item's value; the problems that do not fit in one item are counted only.
    fn encode(&self) -> Vec<u8> {
        let head = |more_bad: u64| {
            let mut l = NvList::new();
            let _ = l.add("dataset", Value::U64(self.dataset));
            let _ = l.add("objectid", Value::U64(self.next.0));
            let _ = l.add("kind", Value::U64(u64::from(self.next.1)));
            let _ = l.add("offset", Value::U64(self.next.2));
            let _ = l.add("blocks", Value::U64(self.blocks));
            let _ = l.add("nodes", Value::U64(self.nodes));
            let _ = l.add("repaired", Value::U64(self.repaired));
            let fixed = self.fixed.iter().take(MAX_FIXED).map(|f| f.chars().take(100).collect()).collect();
            let _ = l.add("fixed", Value::Strs(fixed));
            let _ = l.add("more_bad", Value::U64(more_bad));
            let _ = l.add("done", Value::Bool(self.done));
            l
        };
        let entry = |(d, ino, what): &(String, u64, String)| {
            let mut b = NvList::new();
            let _ = b.add("dataset", Value::Str(d.clone()));
            let _ = b.add("ino", Value::U64(*ino));
            let _ = b.add("what", Value::Str(what.chars().take(160).collect()));
            b
        };
        let mut kept: Vec<NvList> = Vec::new();
        let mut size = head(u64::MAX).encode().len() + 16;
        for e in &self.bad {
            let b = entry(e);
            let n = b.encode().len();
            if size + n > MAX_ITEM_USE {
                break;
            }
            size += n;
            kept.push(b);
        }
        let dropped = (self.bad.len() - kept.len()) as u64;
        let mut l = head(self.more_bad + dropped);
        let _ = l.add("bad", Value::Lists(kept));
        l.encode()
    }

    fn decode(v: &[u8]) -> Option<Scrub> {
        let l = NvList::decode(v).ok()?;
        let bad = match l.get("bad")? {
            Value::Lists(b) => b
                .iter()
                .map(|b| Some((b.get_str("dataset")?.to_string(), b.get_u64("ino")?, b.get_str("what")?.to_string())))
                .collect::<Option<Vec<_>>>()?,
            _ => return None,
        };
        Some(Scrub {
            dataset: l.get_u64("dataset")?,
            next: (l.get_u64("objectid")?, u8::try_from(l.get_u64("kind")?).ok()?, l.get_u64("offset")?),
            blocks: l.get_u64("blocks")?,
            nodes: l.get_u64("nodes")?,
            repaired: l.get_u64("repaired")?,
            fixed: match l.get("fixed")? {
                Value::Strs(f) => f.clone(),
                _ => return None,
            },
            bad,
            more_bad: l.get_u64("more_bad")?,
            done: l.get_bool("done")?,
        })
    }

    fn fixed(&mut self, what: String) {
        tracing::warn!("scrub repaired {what}");
        self.repaired += 1;
        if self.fixed.len() < MAX_FIXED {
            self.fixed.push(what);
        }
    }

    fn found(&mut self, dataset: String, ino: u64, what: String) {
        if self.bad.len() < MAX_REPORTED {
            self.bad.push((dataset, ino, what));
        } else {
            self.more_bad += 1;
        }
    }
}

impl Store {
    /// The scrub under way (or last finished), as the image keeps it.
    pub fn scrub_state(&mut self) -> Result<Scrub> {
        let v = self.root_tree.get(&mut self.pager, &scrub_key())?;
        Ok(v.and_then(|v| Scrub::decode(&v)).unwrap_or_default())
    }

    /// Starts a scrub from the beginning (forgetting the last one).
    pub fn scrub_restart(&mut self) -> Result<()> {
        self.select(crate::datasets::DEFAULT_DATASET)?;
        self.reserve(0, true)?;
        self.root_tree.insert(&mut self.pager, scrub_key(), Scrub::default().encode())?;
        Ok(())
    }

    /// Reads and checks up to `max_blocks` more data blocks (at least one extent) from
    /// where the scrub is; keeps the new position in the running transaction.
    pub fn scrub_step(&mut self, max_blocks: u64) -> Result<Scrub> {
        let mut st = self.scrub_state()?;
        if st.done {
            return Ok(st);
        }
        self.scrub_run(&mut st, max_blocks)?;
        self.select(crate::datasets::DEFAULT_DATASET)?;
        self.reserve(0, true)?;
        self.root_tree.insert(&mut self.pager, scrub_key(), st.encode())?;
        Ok(st)
    }

    /// Goes on with scrub `st` for up to `max_blocks` data blocks (at least one extent).
    fn scrub_run(&mut self, st: &mut Scrub, max_blocks: u64) -> Result<()> {
        let before = self.view;
        let repaired = self.pager.repaired;
        let ids = self.dataset_ids();
        let mut checked = 0;
        while checked < max_blocks.max(1) {
            let Some(&d) = ids.iter().find(|&&d| d >= st.dataset) else {
                st.done = true;
                break;
            };
            if d != st.dataset {
                *st = Scrub { dataset: d, next: (0, 0, 0), ..std::mem::take(st) };
            }
            let name = self.catalog.by_id.get(&d).map_or_else(|| d.to_string(), |e| e.name.clone());
            if st.nodes == 0 {
                self.scrub_metadata(None, st)?;
            }
            if st.next == (0, 0, 0) {
                self.scrub_metadata(Some((d, &name)), st)?;
            }
            // (A snapshot is read as the store's view of its dataset.)
            self.view = self.is_snapshot(d).then_some(d);
            let origin = self.origin_of(d);
            let from = Key::new(st.next.0.max(crate::datasets::root_of(origin) & !1), st.next.1, st.next.2);
            let to = Key::new(crate::store::MAX_INO, u8::MAX, u64::MAX);
            let collected = self.select_for_read(d).and_then(|()| self.fs.collect(&mut self.pager, &from, &to, 64));
            let items = match collected {
                Ok(items) => items,
                Err(e) if e.is_corruption() => {
                    st.found(name, 0, format!("metadata: {e}"));
                    *st = Scrub { dataset: d + 1, next: (0, 0, 0), ..std::mem::take(st) };
                    continue;
                }
                Err(e) => {
                    self.view = before;
                    return Err(e);
                }
            };
            let Some(last) = items.last().map(|(k, _)| *k) else {
                *st = Scrub { dataset: d + 1, next: (0, 0, 0), ..std::mem::take(st) };
                continue;
            };
            for (k, v) in items {
                if k.kind != kind::EXTENT {
                    continue;
                }
                let (disk_block, twin, csums) = match Extent::decode(k, &v, self.pager.total_blocks()) {
                    Ok(Extent::Regular { disk_block, twin, csums }) => (disk_block, twin, csums),
                    // (Inline data is checked with its leaf.)
                    Ok(Extent::Inline(_)) => continue,
                    Err(e) => {
                        st.found(name.clone(), k.objectid, format!("extent at file offset {}: {e}", k.offset));
                        continue;
                    }
                };
                if crate::fs::objects::object_of(disk_block).is_some() {
                    // An object's blocks: the data store keeps them (and `crest scrub`
                    // lists the bucket against the image), not this image.
                    continue;
                }
                self.scrub_extent(&name, k, [disk_block, twin], &csums, st);
                checked += csums.len() as u64;
                st.blocks += csums.len() as u64;
            }
            st.next = match last.offset.checked_add(1) {
                Some(o) => (last.objectid, last.kind, o),
                None => (last.objectid, last.kind.saturating_add(1), 0),
            };
        }
        self.view = before;
        if self.pager.repaired > repaired {
            self.pager.flush()?;
        }
        Ok(())
    }

    /// Reads every copy of one extent's blocks (`copies[1]` is 0 with one copy) and checks
    /// each against its checksum; a bad block with a good copy is rewritten from it, one
    /// with none is reported (the first of the extent).
    fn scrub_extent(&mut self, name: &str, k: Key, copies: [u64; 2], csums: &[u32], st: &mut Scrub) {
        let read: Vec<Option<Vec<u8>>> = copies
            .iter()
            .map(|&at| {
                let mut buf = vec![0u8; csums.len() * BLOCK_SIZE];
                (at != 0 && self.pager.read_blocks(at, &mut buf).is_ok()).then_some(buf)
            })
            .collect();
        let mut lost = None;
        for (i, c) in csums.iter().enumerate() {
            let block = |b: &Vec<u8>| b[i * BLOCK_SIZE..(i + 1) * BLOCK_SIZE].to_vec();
            let good: Vec<bool> = read
                .iter()
                .map(|b| b.as_ref().is_some_and(|b| crate::engine::checksum::crc32c(&block(b)) == *c))
                .collect();
            let file_offset = k.offset + (i * BLOCK_SIZE) as u64;
            let Some(from) = good.iter().position(|&g| g) else {
                lost = lost.or(Some(file_offset));
                continue;
            };
            let bytes = read[from].as_ref().map(block).unwrap_or_default();
            for (j, &at) in copies.iter().enumerate() {
                if at == 0 || good[j] {
                    continue;
                }
                let bad = at + i as u64;
                if self.pager.rewrite_copy(bad, &bytes) {
                    st.fixed(format!("{name}: inode {} block {bad} at file offset {file_offset}", k.objectid));
                } else {
                    st.found(name.to_string(), k.objectid, format!("copy at block {bad} unrepairable"));
                }
            }
        }
        if let Some(at) = lost {
            st.found(name.to_string(), k.objectid, format!("data checksum mismatch at file offset {at}"));
        }
    }

    /// A whole scrub at once, the SCRUB item left alone: every copy of every superblock,
    /// tree node and data block of the last committed generation, every dataset and
    /// snapshot included, each bad copy rewritten from a good one: what `crest fsck
    /// --repair` does offline. Returns what was repaired and what could not be.
    pub fn repair_all(&mut self) -> Result<Scrub> {
        let mut st = Scrub::default();
        self.scrub_run(&mut st, u64::MAX)?;
        // (Also what reads rewrote before: opening the image reads its internal nodes and
        // newest leaves.)
        self.pager.flush()?;
        Ok(st)
    }

    /// Checks every copy of the superblocks and of the root and refcount trees' nodes
    /// (`which` = None), or of dataset `d`'s tree's, as last committed; repairs the copies
    /// it can. A write error while repairing ends the step (the store is poisoned).
    fn scrub_metadata(&mut self, which: Option<(u64, &str)>, st: &mut Scrub) -> Result<()> {
        let sb = self.sb.clone();
        let root = Tree::on_disk(crate::store::ROOT_TREE_ID, sb.root_tree);
        let trees: Vec<(String, Tree)> = match which {
            None => {
                self.scrub_superblocks(st);
                vec![
                    ("root tree".into(), root),
                    ("refcount tree".into(), Tree::on_disk(crate::store::REFCOUNT_TREE_ID, sb.refcount_tree)),
                ]
            }
            Some((d, name)) => match crate::store::load_datasets(&mut self.pager, &root, &sb) {
                // (A dataset made since the last commit has nothing on disk yet.)
                Ok((slots, _, _)) => slots.get(&d).map(|s| (name.to_string(), s.fs)).into_iter().collect(),
                Err(e) => {
                    st.found(name.to_string(), 0, format!("metadata: {e}"));
                    Vec::new()
                }
            },
        };
        let before = self.pager.repaired;
        for (name, tree) in trees {
            self.scrub_tree(&name, &tree, st);
        }
        if self.pager.repaired > before {
            self.pager.flush()?;
        }
        Ok(())
    }

    /// Every copy of every node of `tree`, parents first; below a node with no good copy
    /// nothing can be reached (reported once).
    fn scrub_tree(&mut self, name: &str, tree: &Tree, st: &mut Scrub) {
        let Some(root) = tree.root.on_disk(tree.level) else { return };
        let mut stack = vec![root];
        while let Some(ptr) = stack.pop() {
            let mut good = None;
            let mut bad = Vec::new();
            for at in ptr.copies() {
                st.nodes += 1;
                match self.pager.read_copy(&ptr, at, tree.owner) {
                    Ok((node, bytes)) => good = good.or(Some((node, bytes))),
                    Err(e) => bad.push((at, e)),
                }
            }
            let Some((node, bytes)) = good else {
                let why = bad.first().map_or_else(String::new, |(_, e)| e.to_string());
                st.found(name.to_string(), 0, format!("metadata node {} (no good copy): {why}", ptr.block));
                continue;
            };
            for (at, e) in bad {
                if self.pager.rewrite_copy(at, &bytes) {
                    st.fixed(format!("{name}: copy at block {at} of node {} ({e})", ptr.block));
                } else {
                    st.found(name.to_string(), 0, format!("copy at block {at} of node {}: {e}", ptr.block));
                }
            }
            if let Body::Internal(children) = &node.body {
                stack.extend(children.iter().filter_map(|(_, c)| c.on_disk(ptr.level - 1)));
            }
        }
    }

    /// Both superblock slots and their mirrors: where the newest valid copy of a slot
    /// and its other place differ, the other place is rewritten from it.
    fn scrub_superblocks(&mut self, st: &mut Scrub) {
        if self.sb.meta_copies < 2 {
            return;
        }
        let image_blocks = self.pager.total_blocks();
        for copy in 0..2 {
            let places = [SUPERBLOCK_OFFSETS[copy], SUPERBLOCK_MIRROR_OFFSETS[copy]];
            let read: Vec<(u64, std::result::Result<Superblock, String>)> = places
                .iter()
                .map(|&off| {
                    let mut buf = vec![0u8; SUPERBLOCK_BYTES];
                    let r = self.pager.disk().read_at(off, &mut buf).map_err(|e| e.to_string());
                    (off, r.and_then(|()| Superblock::decode(&buf, copy, image_blocks).map_err(|e| e.to_string())))
                })
                .collect();
            st.nodes += 2;
            // (A newer generation than the one open settled on is one whose trees failed:
            // not a model to copy.)
            let newest = read
                .iter()
                .filter_map(|(_, r)| r.as_ref().ok())
                .filter(|sb| sb.generation <= self.sb.generation)
                .max_by_key(|sb| sb.generation)
                .cloned();
            let Some(good) = newest.filter(|sb| sb.fsid == self.sb.fsid) else {
                st.found("-".into(), 0, format!("superblock copy {copy}: no valid copy in its slot or mirror"));
                continue;
            };
            for (off, r) in &read {
                if r.as_ref().is_ok_and(|sb| *sb == good) {
                    continue;
                }
                let why = match r {
                    Ok(sb) => format!("generation {}, its twin {}", sb.generation, good.generation),
                    Err(e) => e.clone(),
                };
                if self.pager.rewrite_raw(*off, &good.encode(copy)) {
                    st.fixed(format!("superblock copy {copy} at byte {off} ({why})"));
                } else {
                    st.found("-".into(), 0, format!("superblock copy {copy} at byte {off}: {why}"));
                }
            }
        }
    }

    /// Makes dataset (or snapshot) `d`'s tree the active one to read it.
    fn select_for_read(&mut self, d: u64) -> Result<()> {
        self.select(d)
    }

    /// A path of inode `ino` in dataset `d` (its root `/`), for reports: found by the
    /// directory entries naming it, each directory's by its parent. `None` if nothing
    /// names it (an open file unlinked).
    pub fn path_of(&mut self, d: u64, mut ino: u64) -> Result<Option<String>> {
        let before = self.view;
        self.view = self.is_snapshot(d).then_some(d);
        let origin = self.origin_of(d);
        let root = crate::datasets::root_of(origin);
        let mut parts = Vec::new();
        let r = (|| {
            for _ in 0..4096 {
                if ino == root {
                    parts.reverse();
                    return Ok(Some(format!("/{}", parts.join("/"))));
                }
                let Some((dir, name)) = self.name_of(root, ino)? else { return Ok(None) };
                parts.push(name);
                ino = dir;
            }
            Err(Error::corrupt("directory tree", 0, "a parent chain with no end"))
        })();
        self.view = before;
        r
    }

    /// The (directory, name) of some entry of the dataset rooted at `root` naming `ino`.
    fn name_of(&mut self, root: u64, ino: u64) -> Result<Option<(u64, String)>> {
        self.enter(root)?;
        let inode = self.getattr(ino)?;
        let dirs: Vec<u64> = if inode.kind == crate::fs::inode::FileKind::Directory {
            vec![inode.parent]
        } else {
            let mut all = Vec::new();
            let lo = Key::new(root, kind::INODE, 0);
            let hi = Key::new(crate::store::MAX_INO, kind::INODE, 0);
            self.fs.range(&mut self.pager, &lo, &hi, &mut |k, v| {
                if k.kind == kind::INODE
                    && crate::fs::inode::Inode::decode(k.objectid, v, 0)
                        .is_ok_and(|i| i.kind == crate::fs::inode::FileKind::Directory)
                {
                    all.push(k.objectid);
                }
                Ok(true)
            })?;
            all
        };
        for dir in dirs {
            let mut from = 0;
            loop {
                let batch = self.readdir(dir, from, 256)?;
                if batch.is_empty() {
                    break;
                }
                for (e, _) in &batch {
                    if e.ino == ino {
                        return Ok(Some((dir, String::from_utf8_lossy(&e.name).into_owned())));
                    }
                }
                from = batch.last().map_or(from, |(e, _)| e.index + 1);
            }
        }
        Ok(None)
    }
}
