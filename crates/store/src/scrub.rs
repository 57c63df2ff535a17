//! Scrub, online: every data block every dataset and snapshot maps, read back and checked
//! against its checksum, a bounded step at a time between the server's other work, with
//! its position kept in the image (a SCRUB item) so that it resumes after a restart.
//! Tree nodes are verified as the walk reads them (and all of them at every open). A bad
//! block is reported by dataset and path; reads of it fail with EIO, never bad data.
//! (Blocks have one copy each so far: nothing to repair them from yet; a bad node ends
//! the walk of its dataset, reported.)

use crest_nvlist::{NvList, Value};

use crate::engine::key::Key;
use crate::error::{Error, Result};
use crate::fs::extent::Extent;
use crate::fs::keys::kind;
use crate::limits::BLOCK_SIZE;
use crate::store::Store;

/// Most problems a scrub keeps in memory (the count goes on).
const MAX_REPORTED: usize = 1000;

/// Bytes of the SCRUB item (within the item limit): the problems beyond it are counted.
const MAX_ITEM_USE: usize = 1700;

/// Where a scrub is and what it found.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Scrub {
    /// The dataset (or snapshot) being read, by id.
    pub dataset: u64,
    /// The next key to read in it.
    pub next: (u64, u8, u64),
    /// Data blocks read and checked.
    pub blocks: u64,
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
            bad,
            more_bad: l.get_u64("more_bad")?,
            done: l.get_bool("done")?,
        })
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
        let before = self.view;
        let ids = self.dataset_ids();
        let mut checked = 0;
        while checked < max_blocks.max(1) {
            let Some(&d) = ids.iter().find(|&&d| d >= st.dataset) else {
                st.done = true;
                break;
            };
            if d != st.dataset {
                st = Scrub { dataset: d, next: (0, 0, 0), ..st };
            }
            let name = self.catalog.by_id.get(&d).map_or_else(|| d.to_string(), |e| e.name.clone());
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
                    st = Scrub { dataset: d + 1, next: (0, 0, 0), ..st };
                    continue;
                }
                Err(e) => {
                    self.view = before;
                    return Err(e);
                }
            };
            let Some(last) = items.last().map(|(k, _)| *k) else {
                st = Scrub { dataset: d + 1, next: (0, 0, 0), ..st };
                continue;
            };
            for (k, v) in items {
                if k.kind != kind::EXTENT {
                    continue;
                }
                let (disk_block, csums) = match Extent::decode(k, &v, self.pager.total_blocks()) {
                    Ok(Extent::Regular { disk_block, csums }) => (disk_block, csums),
                    // (Inline data is checked with its leaf.)
                    Ok(Extent::Inline(_)) => continue,
                    Err(e) => {
                        st.found(name.clone(), k.objectid, format!("extent at file offset {}: {e}", k.offset));
                        continue;
                    }
                };
                let mut buf = vec![0u8; csums.len() * BLOCK_SIZE];
                let bad = match self.pager.read_blocks(disk_block, &mut buf) {
                    Err(e) => Some(format!("extent at file offset {}: {e}", k.offset)),
                    Ok(()) => csums.iter().enumerate().find_map(|(i, c)| {
                        let found = crate::engine::checksum::crc32c(&buf[i * BLOCK_SIZE..(i + 1) * BLOCK_SIZE]);
                        (found != *c).then(|| {
                            format!("data checksum mismatch at file offset {}", k.offset + (i * BLOCK_SIZE) as u64)
                        })
                    }),
                };
                if let Some(what) = bad {
                    st.found(name.clone(), k.objectid, what);
                }
                checked += csums.len() as u64;
                st.blocks += csums.len() as u64;
            }
            st.next = match last.offset.checked_add(1) {
                Some(o) => (last.objectid, last.kind, o),
                None => (last.objectid, last.kind.saturating_add(1), 0),
            };
        }
        self.view = before;
        self.select(crate::datasets::DEFAULT_DATASET)?;
        self.reserve(0, true)?;
        self.root_tree.insert(&mut self.pager, scrub_key(), st.encode())?;
        Ok(st)
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
