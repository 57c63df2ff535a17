//! Receiving a send stream (`send.rs`) into a dataset: a full stream makes a new dataset,
//! an incremental one moves a dataset from the stream's base snapshot to its snapshot;
//! either ends by taking that snapshot (with the sender's guid, so the next incremental
//! stream finds its base).
//!
//! Records are applied as they arrive (a stream may be far larger than memory), so a
//! receive that fails — a damaged or cut-short stream, a stream that does not fit the
//! target, no space — is undone: a new dataset is destroyed, an existing one rolled back
//! to the base snapshot it was at. That is exact because an incremental receive starts
//! only from a dataset unchanged since its newest snapshot (or, with `force`, rolled back
//! to it first).
//!
//! Invariants:
//! - while a receive runs, a RECEIVE item in the root tree names its dataset and how to
//!   undo it; the commit that takes the final snapshot deletes it. `open` undoes every
//!   receive it finds, so a crash mid-stream leaves the target as it was;
//! - an object's attributes are what its INODE record says, except `blocks`, which count
//!   what this image mapped; its size is set once its records are done (`finish_object`).

use crate::datasets::check_name;
use crate::engine::key::Key;
use crate::error::{Error, Result};
use crate::fs::dirent::{self, DirEntry};
use crate::fs::inode::{FileKind, Inode, Timespec};
use crate::fs::keys::kind;
use crate::limits::{BLOCK_SIZE_U64, MAX_FILE_BYTES};
use crate::send::{abs, valid_rel, Begin, Record, StreamIn};
use crate::snapshots::check_snapshot_name;
use crate::store::Store;

/// RECEIVE item: a new dataset (undo: destroy it).
const UNDO_DESTROY: u8 = 0;
/// RECEIVE item: an existing dataset (undo: roll back to the snapshot it names).
const UNDO_ROLLBACK: u8 = 1;

/// A receive in progress.
#[derive(Debug)]
pub struct Receiving {
    target: String,
    force: bool,
    now: Timespec,
    input: StreamIn,
    /// Set by BEGIN: the dataset, what the stream is, the base snapshot (incremental).
    into: Option<(u64, Begin, Option<u64>)>,
    /// The object whose records are being applied: as it is now, and the attributes it
    /// ends with (its INODE record's, or those it had).
    object: Option<(Inode, Inode)>,
    /// Bytes received.
    pub bytes: u64,
}

impl Receiving {
    /// The dataset being received into, once the stream said which.
    pub fn dataset(&self) -> Option<u64> {
        self.into.as_ref().map(|i| i.0)
    }

    /// The dataset name it was started for.
    pub fn target(&self) -> &str {
        &self.target
    }
}

fn unfit(what: impl Into<String>) -> Error {
    Error::Invalid(format!("send stream does not apply here: {}", what.into()))
}

fn receive_key(d: u64) -> Key {
    Key::new(d, kind::RECEIVE, 0)
}

impl Store {
    /// Starts receiving into dataset `target` (nothing changes until the stream's first
    /// record arrives). `force`: an incremental stream may roll the dataset back to its
    /// base snapshot, discarding changes made since.
    pub fn receive_start(&self, target: &str, force: bool, now: Timespec) -> Result<Receiving> {
        check_name(target)?;
        Ok(Receiving {
            target: target.to_string(),
            force,
            now,
            input: StreamIn::default(),
            into: None,
            object: None,
            bytes: 0,
        })
    }

    /// Applies the records `bytes` complete. An error leaves the receive to `receive_abort`.
    pub fn receive_feed(&mut self, r: &mut Receiving, bytes: &[u8]) -> Result<()> {
        r.bytes += bytes.len() as u64;
        r.input.feed(bytes);
        while let Some(rec) = r.input.next()? {
            self.apply_record(r, rec)?;
            self.maybe_commit()?;
        }
        if r.input.pending_bytes() > crate::send::MAX_RECORD_BYTES + 64 {
            return Err(Error::Invalid("send stream: a record larger than any".into()));
        }
        Ok(())
    }

    /// Ends a receive whose stream is complete: takes its snapshot. Returns its name.
    pub fn receive_finish(&mut self, r: &mut Receiving) -> Result<String> {
        if !r.input.ended || r.input.pending_bytes() > 0 {
            return Err(Error::Invalid(format!("send stream cut short (after {} bytes): nothing received", r.bytes)));
        }
        let Some((d, begin, _)) = &r.into else { return Err(Error::Invalid("empty send stream".into())) };
        let (d, name) = (*d, format!("{}@{}", r.target, begin.snapshot));
        self.create_snapshots_with(std::slice::from_ref(&name), Some(&[begin.guid]))?;
        self.root_tree.delete(&mut self.pager, &receive_key(d))?;
        r.into = None;
        Ok(name)
    }

    /// Undoes a receive that did not finish: its new dataset goes, or its dataset goes
    /// back to the base snapshot.
    pub fn receive_abort(&mut self, r: Receiving) -> Result<()> {
        match r.into {
            Some((d, _, _)) => self.undo_receive(d),
            None => Ok(()),
        }
    }

    /// Undoes the receive the RECEIVE item of dataset `d` describes.
    fn undo_receive(&mut self, d: u64) -> Result<()> {
        let Some(v) = self.root_tree.get(&mut self.pager, &receive_key(d))? else { return Ok(()) };
        if v.len() != 9 {
            return Err(Error::bad_item(receive_key(d), 0, "receive item of the wrong size"));
        }
        let base = crate::fs::inode::le_u64(&v, 1);
        let name = |st: &Store, id: u64| st.catalog.by_id.get(&id).map(|e| e.name.clone());
        match v[0] {
            UNDO_DESTROY => {
                if let Some(n) = name(self, d) {
                    self.destroy_dataset(&n)?;
                }
            }
            UNDO_ROLLBACK => {
                let n = name(self, base).ok_or_else(|| Error::NotFound(format!("snapshot {base}")))?;
                self.rollback(&n)?;
            }
            other => return Err(Error::bad_item(receive_key(d), 0, format!("receive item of kind {other}"))),
        }
        self.root_tree.delete(&mut self.pager, &receive_key(d))?;
        tracing::warn!(dataset = d, "an unfinished receive was undone");
        Ok(())
    }

    /// At open: undoes every receive a crash interrupted.
    pub(crate) fn undo_interrupted_receives(&mut self) -> Result<()> {
        let mut found = Vec::new();
        self.root_tree.range(&mut self.pager, &Key::MIN, &Key::MAX, &mut |k, _| {
            if k.kind == kind::RECEIVE {
                found.push(k.objectid);
            }
            Ok(true)
        })?;
        if found.is_empty() {
            return Ok(());
        }
        for d in found {
            self.undo_receive(d)?;
        }
        self.commit()
    }

    fn apply_record(&mut self, r: &mut Receiving, rec: Record) -> Result<()> {
        let rec = match rec {
            Record::Begin(b) => return self.receive_begin(r, b),
            other => other,
        };
        let Some((d, _, _)) = r.into else { return Err(unfit("no BEGIN record")) };
        self.select(d)?;
        let ino = |i: u64| if valid_rel(i) { Ok(abs(d, i)) } else { Err(unfit(format!("inode number {i}"))) };
        match rec {
            Record::Begin(_) => return Err(unfit("a second BEGIN record")),
            Record::Inode(mut sent) => {
                sent.ino = ino(sent.ino)?;
                if sent.kind == FileKind::Directory {
                    sent.parent = ino(sent.parent)?;
                } else {
                    sent.parent = 0;
                }
                self.finish_object_unless(r, sent.ino)?;
                let cur = match self.getattr(sent.ino) {
                    Ok(cur) if cur.kind == sent.kind => cur,
                    Ok(cur) => return Err(unfit(format!("inode {} is a {:?} here", sent.ino, cur.kind))),
                    Err(Error::NotFound(_)) => {
                        self.meta.inode_count += 1;
                        Inode { size: 0, blocks: 0, ..sent.clone() }
                    }
                    Err(e) => return Err(e),
                };
                self.put_inode(&Inode { size: cur.size, blocks: cur.blocks, ..sent.clone() })?;
                r.object = Some((cur, sent));
            }
            Record::Dirent { dir, entry } => {
                let e = DirEntry { ino: ino(entry.ino)?, ..entry };
                self.receive_dirent(ino(dir)?, e)?;
            }
            Record::Unlink { dir, name } => self.receive_unlink(ino(dir)?, &name)?,
            Record::Xattr { ino: i, name, value } => {
                let i = ino(i)?;
                self.object_for(r, i)?;
                self.setxattr(i, &name, &value, r.now)?;
            }
            Record::RmXattr { ino: i, name } => {
                let i = ino(i)?;
                self.object_for(r, i)?;
                self.removexattr(i, &name, r.now)?;
            }
            Record::Data { ino: i, offset, bytes } => {
                let i = ino(i)?;
                let end = offset.checked_add(bytes.len() as u64).filter(|&e| e <= MAX_FILE_BYTES);
                if end.is_none() || bytes.is_empty() {
                    return Err(unfit("data past the largest file"));
                }
                let mut cur = self.object_for(r, i)?;
                if !cur.kind.has_data() {
                    return Err(unfit(format!("data for inode {i}, a {:?}", cur.kind)));
                }
                self.reserve(bytes.len() as u64 / BLOCK_SIZE_U64 + 2, false)?;
                self.write_data(&mut cur, offset, &bytes, None)?;
                self.set_object(r, cur);
            }
            Record::Free { ino: i, offset, len } => {
                let i = ino(i)?;
                let mut cur = self.object_for(r, i)?;
                if !cur.kind.has_data() {
                    return Err(unfit(format!("a hole in inode {i}, a {:?}", cur.kind)));
                }
                self.reserve(2, true)?;
                self.punch_data(&mut cur, offset, len)?;
                self.set_object(r, cur);
            }
            Record::Destroy { ino: i } => {
                let i = ino(i)?;
                if i == crate::datasets::root_of(d) {
                    return Err(unfit("the root directory destroyed"));
                }
                self.finish_object_unless(r, u64::MAX)?;
                let inode = self.getattr(i).map_err(|_| unfit(format!("inode {i} to destroy is not here")))?;
                self.reserve(0, true)?;
                self.destroy_inode_now(&inode)?;
            }
            Record::End { .. } => self.finish_object_unless(r, u64::MAX)?,
        }
        Ok(())
    }

    /// BEGIN: checks that the stream fits the target and prepares it.
    fn receive_begin(&mut self, r: &mut Receiving, b: Begin) -> Result<()> {
        let snap = format!("{}@{}", r.target, b.snapshot);
        check_snapshot_name(&snap)?;
        if self.catalog.by_name.contains_key(&snap) {
            return Err(Error::Exists(format!("snapshot {snap}")));
        }
        if !valid_rel(b.next_ino.saturating_sub(1)) {
            return Err(unfit(format!("next inode number {}", b.next_ino)));
        }
        let (d, undo, base) = if b.base_guid == 0 {
            if self.catalog.by_name.contains_key(&r.target) {
                return Err(Error::Exists(format!(
                    "dataset {} (a full stream makes a new dataset; send an incremental one)",
                    r.target
                )));
            }
            let d = self.create_dataset(&r.target, Default::default(), (0, 0, 0o755), r.now)?;
            (d, UNDO_DESTROY, None)
        } else {
            let d = self.dataset_id(&r.target)?;
            if self.is_snapshot(d) {
                return Err(Error::Invalid(format!("{} is a snapshot", r.target)));
            }
            let newest = self.catalog.snaps.get(&d).and_then(|s| s.last()).copied();
            let Some((g, s)) = newest.filter(|&(_, s)| self.snapshot_guid(s) == b.base_guid) else {
                return Err(unfit(format!(
                    "the stream applies to a snapshot of {} (guid {:#x}) that is not {}'s newest",
                    b.origin, b.base_guid, r.target
                )));
            };
            if !r.force && self.changed_beyond_atime(d, s, g)? {
                return Err(Error::Busy(format!(
                    "{} changed since its snapshot {}; receive --force rolls it back first",
                    r.target,
                    self.catalog.by_id.get(&s).map_or("", |e| e.name.as_str())
                )));
            }
            // Changed (forced), or only read since (access times): back to the base, so
            // that the received snapshot is exactly the sender's.
            if self.changed_since(d, g)? {
                let name = self.catalog.by_id.get(&s).map(|e| e.name.clone()).unwrap_or_default();
                self.rollback(&name)?;
            }
            (d, UNDO_ROLLBACK, Some(s))
        };
        let mut v = vec![undo];
        v.extend_from_slice(&base.unwrap_or(0).to_le_bytes());
        self.root_tree.insert(&mut self.pager, receive_key(d), v)?;
        self.select(d)?;
        self.meta.next_ino = self.meta.next_ino.max(abs(d, b.next_ino.max(2)));
        r.into = Some((d, b, base));
        Ok(())
    }

    /// Whether dataset `d` changed after generation `g` (its newest snapshot's).
    fn changed_since(&mut self, d: u64, g: u64) -> Result<bool> {
        self.select(d)?;
        Ok(match self.fs.root.on_disk(self.fs.level) {
            Some(p) => p.generation > g,
            None => true,
        })
    }

    /// The object `ino` as records leave it, finishing the previous one first.
    fn object_for(&mut self, r: &mut Receiving, ino: u64) -> Result<Inode> {
        self.finish_object_unless(r, ino)?;
        if let Some((cur, _)) = &r.object {
            return Ok(cur.clone());
        }
        // Without an INODE record its attributes did not change: they are these, whatever
        // the records' operations (xattr changes) do to them here.
        let cur = self.getattr(ino).map_err(|_| unfit(format!("inode {ino} is not here")))?;
        r.object = Some((cur.clone(), cur.clone()));
        Ok(cur)
    }

    fn set_object(&mut self, r: &mut Receiving, cur: Inode) {
        if let Some(o) = &mut r.object {
            o.0 = cur;
        }
    }

    /// Finishes the object being received unless it is `ino`: its size as sent (freeing or
    /// adding a hole at the end), then its attributes as sent with the blocks it maps here.
    fn finish_object_unless(&mut self, r: &mut Receiving, ino: u64) -> Result<()> {
        if r.object.as_ref().is_some_and(|(cur, _)| cur.ino == ino) {
            return Ok(());
        }
        let Some((mut cur, attrs)) = r.object.take() else { return Ok(()) };
        if cur.kind.has_data() && cur.size != attrs.size {
            self.reserve(2, true)?;
            self.truncate_data(&mut cur, attrs.size)?;
        }
        let size = if cur.kind.has_data() { cur.size } else { attrs.size };
        self.put_inode(&Inode { size, blocks: cur.blocks, ..attrs })
    }

    /// Adds `e` to directory `dir`, replacing an entry of the same name.
    fn receive_dirent(&mut self, dir: u64, e: DirEntry) -> Result<()> {
        let key = dirent::entry_key(dir, &e.name);
        let mut entries = match self.fs.get(&mut self.pager, &key)? {
            Some(v) => dirent::decode_entries(key, &v, 0)?,
            None => Vec::new(),
        };
        if let Some(pos) = entries.iter().position(|o| o.name == e.name) {
            let old = entries.remove(pos);
            self.fs.delete(&mut self.pager, &dirent::index_key(dir, old.index))?;
        }
        self.fs.insert(&mut self.pager, dirent::index_key(dir, e.index), dirent::encode_index(&e))?;
        entries.push(e);
        self.fs.insert(&mut self.pager, key, dirent::encode_entries(&entries))?;
        Ok(())
    }

    /// Removes `name` from directory `dir`.
    fn receive_unlink(&mut self, dir: u64, name: &[u8]) -> Result<()> {
        let key = dirent::entry_key(dir, name);
        let missing = || unfit(format!("no entry {:?} in directory {dir}", String::from_utf8_lossy(name)));
        let v = self.fs.get(&mut self.pager, &key)?.ok_or_else(missing)?;
        let mut entries = dirent::decode_entries(key, &v, 0)?;
        let pos = entries.iter().position(|o| o.name == name).ok_or_else(missing)?;
        let old = entries.remove(pos);
        self.fs.delete(&mut self.pager, &dirent::index_key(dir, old.index))?;
        if entries.is_empty() {
            self.fs.delete(&mut self.pager, &key)?;
        } else {
            self.fs.insert(&mut self.pager, key, dirent::encode_entries(&entries))?;
        }
        Ok(())
    }
}
