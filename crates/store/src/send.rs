//! Send streams: a snapshot, or what changed between two snapshots of one dataset, as a
//! byte stream another image applies (`receive.rs`); `crest send` and `crest receive`.
//! docs/format.md §7 has the bytes.
//!
//! The stream is logical: inodes numbered within their dataset (the receiver puts them in
//! its own dataset's range), directory entries, xattrs with their whole values, and file
//! bytes — nothing of the sender's block layout, checksum placement or tree shape, so any
//! image of this format version can apply it. An incremental stream reads only what the
//! later snapshot's tree does not share with the base's: a node born at or before the
//! base's generation that the later tree reaches is the base's too (copy-on-write never
//! changes a node in place), so both trees are read only outside what they share, and the
//! items that differ become records.
//!
//! Invariants:
//! - every record carries the CRC-32C of its bytes, and END the number of records before
//!   it and a chained check of their CRCs: a receiver applies only records it verified,
//!   and a stream cut short, reordered or spliced fails at END at the latest (and the
//!   receiver then undoes what it applied);
//! - a send resumes from its cursor (the next key, the records and check so far): the
//!   server keeps nothing between calls, and snapshots never change under it;
//! - an object goes whole (every item, not only what changed) when the receiver cannot
//!   have it: new since the base, or unlinked-but-open (nlink 0, never sent) there; an
//!   object the later snapshot no longer has is one DESTROY record.

use crate::datasets::INO_BITS;
use crate::engine::btree::Tree;
use crate::engine::checksum::crc32c;
use crate::engine::key::Key;
use crate::engine::node::BlockPtr;
use crate::error::{Error, Result};
use crate::fs::dirent::{self, DirEntry};
use crate::fs::extent::Extent;
use crate::fs::inode::{FileKind, Inode};
use crate::fs::keys::kind;
use crate::fs::xattr;
use crate::limits::BLOCK_SIZE_U64;
use crate::store::{Store, MAX_INO};

/// The first bytes of every stream (in its BEGIN record).
pub const STREAM_MAGIC: [u8; 8] = *b"CRESTSND";
/// The stream format this code writes and reads.
pub const STREAM_VERSION: u32 = 1;
/// Largest record payload (a DATA record holds at most one extent: 1 MiB).
pub const MAX_RECORD_BYTES: usize = 2 << 20;
/// Bytes of a record's frame around its payload: type, length, CRC.
const FRAME_BYTES: usize = 9;
/// Low bits of an inode number: its number within its dataset, as streams carry it.
const INO_MASK: u64 = (1 << INO_BITS) - 1;
/// Items read from each tree at a time.
const BATCH: usize = 64;

pub(crate) mod rec {
    pub const BEGIN: u8 = 1;
    pub const INODE: u8 = 2;
    pub const DIRENT: u8 = 3;
    pub const UNLINK: u8 = 4;
    pub const XATTR: u8 = 5;
    pub const RMXATTR: u8 = 6;
    pub const DATA: u8 = 7;
    pub const FREE: u8 = 8;
    pub const DESTROY: u8 = 9;
    pub const END: u8 = 10;
}

/// What a stream is of (its BEGIN record).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Begin {
    /// The snapshot's guid (the receiver's new snapshot takes it).
    pub guid: u64,
    /// For an incremental stream, the guid of the snapshot it applies to; 0 for a full one.
    pub base_guid: u64,
    /// The dataset's next inode number (within the dataset) at the snapshot.
    pub next_ino: u64,
    /// The snapshot's name after the `@`.
    pub snapshot: String,
    /// The dataset it was sent from (informative).
    pub origin: String,
}

/// One record. Inode numbers are within the dataset (`INO_MASK`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Record {
    Begin(Begin),
    /// An object's attributes (`blocks` is the receiver's own).
    Inode(Inode),
    /// A directory entry, added or replacing the one of the same name.
    Dirent {
        dir: u64,
        entry: DirEntry,
    },
    Unlink {
        dir: u64,
        name: Vec<u8>,
    },
    Xattr {
        ino: u64,
        name: Vec<u8>,
        value: Vec<u8>,
    },
    RmXattr {
        ino: u64,
        name: Vec<u8>,
    },
    Data {
        ino: u64,
        offset: u64,
        bytes: Vec<u8>,
    },
    /// Bytes that are a hole now (inside the file; what lies past its size goes with it).
    Free {
        ino: u64,
        offset: u64,
        len: u64,
    },
    Destroy {
        ino: u64,
    },
    End {
        records: u64,
        check: u32,
    },
}

fn put_name(out: &mut Vec<u8>, name: &[u8]) {
    out.extend_from_slice(&(name.len() as u16).to_le_bytes());
    out.extend_from_slice(name);
}

impl Record {
    /// Appends the payload to `p`; returns the record's type.
    fn encode_payload(&self, p: &mut Vec<u8>) -> u8 {
        match self {
            Record::Begin(b) => {
                p.extend_from_slice(&STREAM_MAGIC);
                p.extend_from_slice(&STREAM_VERSION.to_le_bytes());
                p.extend_from_slice(&b.guid.to_le_bytes());
                p.extend_from_slice(&b.base_guid.to_le_bytes());
                p.extend_from_slice(&b.next_ino.to_le_bytes());
                put_name(p, b.snapshot.as_bytes());
                put_name(p, b.origin.as_bytes());
                rec::BEGIN
            }
            Record::Inode(i) => {
                p.extend_from_slice(&i.ino.to_le_bytes());
                p.extend_from_slice(&i.encode());
                rec::INODE
            }
            Record::Dirent { dir, entry } => {
                p.extend_from_slice(&dir.to_le_bytes());
                p.extend_from_slice(&entry.ino.to_le_bytes());
                p.extend_from_slice(&entry.index.to_le_bytes());
                p.push(entry.kind as u8);
                p.extend_from_slice(&entry.name);
                rec::DIRENT
            }
            Record::Unlink { dir, name } => {
                p.extend_from_slice(&dir.to_le_bytes());
                p.extend_from_slice(name);
                rec::UNLINK
            }
            Record::Xattr { ino, name, value } => {
                p.extend_from_slice(&ino.to_le_bytes());
                put_name(p, name);
                p.extend_from_slice(value);
                rec::XATTR
            }
            Record::RmXattr { ino, name } => {
                p.extend_from_slice(&ino.to_le_bytes());
                p.extend_from_slice(name);
                rec::RMXATTR
            }
            Record::Data { ino, offset, bytes } => {
                p.extend_from_slice(&ino.to_le_bytes());
                p.extend_from_slice(&offset.to_le_bytes());
                p.extend_from_slice(bytes);
                rec::DATA
            }
            Record::Free { ino, offset, len } => {
                for v in [ino, offset, len] {
                    p.extend_from_slice(&v.to_le_bytes());
                }
                rec::FREE
            }
            Record::Destroy { ino } => {
                p.extend_from_slice(&ino.to_le_bytes());
                rec::DESTROY
            }
            Record::End { records, check } => {
                p.extend_from_slice(&records.to_le_bytes());
                p.extend_from_slice(&check.to_le_bytes());
                rec::END
            }
        }
    }
}

/// A payload being taken apart; every read is bounds-checked.
struct Fields<'a> {
    b: &'a [u8],
    at: usize,
}

impl<'a> Fields<'a> {
    fn bad(what: &str) -> Error {
        Error::Invalid(format!("send stream: malformed {what} record"))
    }
    fn take(&mut self, n: usize, what: &str) -> Result<&'a [u8]> {
        let end = self.at.checked_add(n).filter(|&e| e <= self.b.len()).ok_or_else(|| Fields::bad(what))?;
        let s = &self.b[self.at..end];
        self.at = end;
        Ok(s)
    }
    fn u64(&mut self, what: &str) -> Result<u64> {
        let s = self.take(8, what)?;
        Ok(u64::from_le_bytes(s.try_into().map_err(|_| Fields::bad(what))?))
    }
    fn u32(&mut self, what: &str) -> Result<u32> {
        let s = self.take(4, what)?;
        Ok(u32::from_le_bytes(s.try_into().map_err(|_| Fields::bad(what))?))
    }
    fn name(&mut self, what: &str) -> Result<&'a [u8]> {
        let s = self.take(2, what)?;
        let n = usize::from(u16::from_le_bytes([s[0], s[1]]));
        self.take(n, what)
    }
    fn rest(&mut self) -> &'a [u8] {
        let s = &self.b[self.at..];
        self.at = self.b.len();
        s
    }
    fn done(&self, what: &str) -> Result<()> {
        if self.at == self.b.len() {
            Ok(())
        } else {
            Err(Fields::bad(what))
        }
    }
}

fn text(b: &[u8], what: &str) -> Result<String> {
    String::from_utf8(b.to_vec()).map_err(|_| Fields::bad(what))
}

/// Decodes a record's payload. Values are checked for shape here; whether they fit the
/// target (inode ranges, names) is the receiver's to check.
fn decode_payload(t: u8, payload: &[u8]) -> Result<Record> {
    let mut f = Fields { b: payload, at: 0 };
    let r = match t {
        rec::BEGIN => {
            if f.take(8, "BEGIN")? != STREAM_MAGIC {
                return Err(Error::Invalid("not a crest send stream (bad magic)".into()));
            }
            let version = f.u32("BEGIN")?;
            if version != STREAM_VERSION {
                return Err(Error::Invalid(format!(
                    "send stream of format version {version}; this crest reads version {STREAM_VERSION}"
                )));
            }
            Record::Begin(Begin {
                guid: f.u64("BEGIN")?,
                base_guid: f.u64("BEGIN")?,
                next_ino: f.u64("BEGIN")?,
                snapshot: text(f.name("BEGIN")?, "BEGIN")?,
                origin: text(f.name("BEGIN")?, "BEGIN")?,
            })
        }
        rec::INODE => {
            let ino = f.u64("INODE")?;
            Record::Inode(Inode::decode(ino, f.rest(), 0).map_err(|_| Fields::bad("INODE"))?)
        }
        rec::DIRENT => {
            let dir = f.u64("DIRENT")?;
            let ino = f.u64("DIRENT")?;
            let index = f.u64("DIRENT")?;
            let k = f.take(1, "DIRENT")?[0];
            let kind = FileKind::from_u8(k).ok_or_else(|| Fields::bad("DIRENT"))?;
            let name = f.rest().to_vec();
            dirent::check_name(&name)?;
            Record::Dirent { dir, entry: DirEntry { name, ino, kind, index } }
        }
        rec::UNLINK => Record::Unlink { dir: f.u64("UNLINK")?, name: f.rest().to_vec() },
        rec::XATTR => Record::Xattr { ino: f.u64("XATTR")?, name: f.name("XATTR")?.to_vec(), value: f.rest().to_vec() },
        rec::RMXATTR => Record::RmXattr { ino: f.u64("RMXATTR")?, name: f.rest().to_vec() },
        rec::DATA => Record::Data { ino: f.u64("DATA")?, offset: f.u64("DATA")?, bytes: f.rest().to_vec() },
        rec::FREE => Record::Free { ino: f.u64("FREE")?, offset: f.u64("FREE")?, len: f.u64("FREE")? },
        rec::DESTROY => Record::Destroy { ino: f.u64("DESTROY")? },
        rec::END => Record::End { records: f.u64("END")?, check: f.u32("END")? },
        other => return Err(Error::Invalid(format!("send stream: unknown record type {other}"))),
    };
    f.done("a")?;
    Ok(r)
}

/// The chained check END carries: each record's CRC folded into the check so far.
fn chain(check: u32, record_crc: u32) -> u32 {
    let mut b = [0u8; 8];
    b[..4].copy_from_slice(&check.to_le_bytes());
    b[4..].copy_from_slice(&record_crc.to_le_bytes());
    crc32c(&b)
}

/// Writes records.
#[derive(Debug, Default)]
pub(crate) struct StreamOut {
    pub records: u64,
    pub check: u32,
    pub out: Vec<u8>,
    /// The chunked xattr value last sent whole because a chunk changed (object, chunk id):
    /// its other chunks need not send it again.
    pub last_xattr: Option<(u64, u64)>,
}

impl StreamOut {
    pub(crate) fn push(&mut self, r: &Record) {
        // The payload goes straight after a header whose length is filled in after.
        let start = self.out.len();
        self.out.extend_from_slice(&[0; 5]);
        let t = r.encode_payload(&mut self.out);
        let len = (self.out.len() - start - 5) as u32;
        self.out[start] = t;
        self.out[start + 1..start + 5].copy_from_slice(&len.to_le_bytes());
        let crc = crc32c(&self.out[start..]);
        self.out.extend_from_slice(&crc.to_le_bytes());
        self.records += 1;
        self.check = chain(self.check, crc);
    }

    /// Ends the stream.
    pub(crate) fn end(&mut self) {
        let r = Record::End { records: self.records, check: self.check };
        self.push(&r);
    }
}

/// Reads records from bytes as they come, verifying each; after END, nothing more.
#[derive(Debug, Default)]
pub(crate) struct StreamIn {
    buf: Vec<u8>,
    at: usize,
    records: u64,
    check: u32,
    pub ended: bool,
}

impl StreamIn {
    pub(crate) fn feed(&mut self, bytes: &[u8]) {
        if self.at > 0 && self.at * 2 >= self.buf.len() {
            self.buf.drain(..self.at);
            self.at = 0;
        }
        self.buf.extend_from_slice(bytes);
    }

    /// Bytes held that make no whole record yet.
    pub(crate) fn pending_bytes(&self) -> usize {
        self.buf.len() - self.at
    }

    /// The next whole, verified record, if one has arrived.
    pub(crate) fn next(&mut self) -> Result<Option<Record>> {
        let b = &self.buf[self.at..];
        if b.is_empty() {
            return Ok(None);
        }
        if self.ended {
            return Err(Error::Invalid("send stream: bytes after its END record".into()));
        }
        if b.len() < 5 {
            return Ok(None);
        }
        let len = u32::from_le_bytes([b[1], b[2], b[3], b[4]]) as usize;
        if len > MAX_RECORD_BYTES {
            return Err(Error::Invalid(format!("send stream: a record of {len} bytes (damaged?)")));
        }
        if b.len() < len + FRAME_BYTES {
            return Ok(None);
        }
        let body = &b[..5 + len];
        let crc = u32::from_le_bytes([b[5 + len], b[6 + len], b[7 + len], b[8 + len]]);
        if crc32c(body) != crc {
            return Err(Error::Invalid(format!("send stream: record {} fails its checksum (damaged)", self.records)));
        }
        let r = decode_payload(b[0], &body[5..])?;
        match (&r, self.records) {
            (Record::Begin(_), 0) => {}
            (Record::Begin(_), _) => return Err(Error::Invalid("send stream: a second BEGIN record".into())),
            (_, 0) => return Err(Error::Invalid("send stream: does not start with BEGIN".into())),
            (Record::End { records, check }, _) => {
                if *records != self.records || *check != self.check {
                    return Err(Error::Invalid(format!(
                        "send stream: records missing or out of order ({} received, the sender wrote {records})",
                        self.records
                    )));
                }
                self.ended = true;
            }
            _ => {}
        }
        self.at += len + FRAME_BYTES;
        self.records += 1;
        self.check = chain(self.check, crc);
        Ok(Some(r))
    }
}

/// Where a send is: before BEGIN, at a key, or done; and the stream's count and check.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Cursor {
    phase: u8,
    key: Key,
    records: u64,
    check: u32,
}

const CURSOR_BYTES: usize = 30;

impl Cursor {
    fn encode(&self) -> Vec<u8> {
        let mut v = Vec::with_capacity(CURSOR_BYTES);
        v.push(self.phase);
        v.extend_from_slice(&self.key.objectid.to_le_bytes());
        v.push(self.key.kind);
        v.extend_from_slice(&self.key.offset.to_le_bytes());
        v.extend_from_slice(&self.records.to_le_bytes());
        v.extend_from_slice(&self.check.to_le_bytes());
        v
    }

    fn decode(b: &[u8]) -> Result<Cursor> {
        if b.is_empty() {
            return Ok(Cursor { phase: 0, key: Key::MIN, records: 0, check: 0 });
        }
        let mut f = Fields { b, at: 0 };
        let phase = f.take(1, "cursor")?[0];
        let objectid = f.u64("cursor")?;
        let k = f.take(1, "cursor")?[0];
        let key = Key::new(objectid, k, f.u64("cursor")?);
        let c = Cursor { phase, key, records: f.u64("cursor")?, check: f.u32("cursor")? };
        f.done("cursor")?;
        if phase > 2 {
            return Err(Error::Invalid("send cursor: bad phase".into()));
        }
        Ok(c)
    }
}

/// One call's part of a stream.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SendChunk {
    /// The stream's next bytes.
    pub data: Vec<u8>,
    /// What the next call passes to continue.
    pub cursor: Vec<u8>,
    /// The stream is complete (`data` ends with its END record).
    pub done: bool,
}

/// The first key after `k`.
fn after(k: Key) -> Key {
    if k.offset < u64::MAX {
        Key::new(k.objectid, k.kind, k.offset + 1)
    } else if k.kind < u8::MAX {
        Key::new(k.objectid, k.kind + 1, 0)
    } else {
        Key::new(k.objectid.saturating_add(1), 0, 0)
    }
}

fn last_key_of(x: u64) -> Key {
    Key::new(x, u8::MAX, u64::MAX)
}

/// An inode number within its dataset.
fn rel(ino: u64) -> u64 {
    ino & INO_MASK
}

/// The two trees of a send and how to tell what they share.
struct Pair {
    t: Tree,
    b: Option<(Tree, u64)>,
    /// Blocks of the base tree the later one reaches (the roots of what they share).
    shared: std::collections::HashSet<u64>,
}

impl Pair {
    fn t_skip(&self) -> impl Fn(&BlockPtr) -> bool + '_ {
        move |p: &BlockPtr| self.b.is_some_and(|(_, g)| p.generation <= g)
    }
    fn b_skip(&self) -> impl Fn(&BlockPtr) -> bool + '_ {
        move |p: &BlockPtr| self.shared.contains(&p.block)
    }
}

/// What a send does with the items of one object.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Mode {
    /// Both snapshots have it: what differs.
    Diff,
    /// Only the later one (as far as the receiver knows): all of it.
    Whole,
    /// Only the base: DESTROY.
    Gone,
    /// Neither (nlink 0 in both, or not an inode): nothing.
    Skip,
}

impl Store {
    /// The tree of dataset or snapshot `d`.
    fn tree_of(&self, d: u64) -> Option<Tree> {
        if d == self.active {
            Some(self.fs)
        } else {
            self.parked.get(&d).map(|s| s.fs)
        }
    }

    /// The guid of snapshot `s`: its `guid` property (snapshots taken before guids existed
    /// get one derived from the image's id and the snapshot's id and generation).
    pub fn snapshot_guid(&self, s: u64) -> u64 {
        let Some(e) = self.catalog.by_id.get(&s) else { return 0 };
        if let Some(g) = e.props.get_u64("guid") {
            return g;
        }
        let g = e.snap.map_or(0, |(_, g)| g);
        let mut b = self.sb.fsid.to_vec();
        b.extend_from_slice(&s.to_le_bytes());
        b.extend_from_slice(&g.to_le_bytes());
        (u64::from(crc32c(&b)) << 32) | u64::from(crc32c(&b[4..])) | 1
    }

    /// The next part of the send stream of `snapshot` (incremental from `base` when
    /// given: an older snapshot of the same dataset), from `cursor` (empty: the start),
    /// about `budget` bytes (at least one record; DATA records hold up to an extent).
    pub fn send_chunk(
        &mut self,
        snapshot: &str,
        base: Option<&str>,
        cursor: &[u8],
        budget: usize,
    ) -> Result<SendChunk> {
        let t = self.dataset_id(snapshot)?;
        let Some((origin, tg)) = self.catalog.by_id.get(&t).and_then(|e| e.snap) else {
            return Err(Error::Invalid(format!("{snapshot} is not a snapshot (DATASET@NAME)")));
        };
        let b = match base {
            Some(name) => {
                let b = self.dataset_id(name)?;
                match self.catalog.by_id.get(&b).and_then(|e| e.snap) {
                    Some((o, g)) if o == origin && g < tg => Some((b, g)),
                    _ => {
                        return Err(Error::Invalid(format!("{name} is no older snapshot of the dataset of {snapshot}")))
                    }
                }
            }
            None => None,
        };
        let mut cur = Cursor::decode(cursor)?;
        let mut out = StreamOut { records: cur.records, check: cur.check, ..Default::default() };
        if cur.phase == 2 {
            return Ok(SendChunk { data: Vec::new(), cursor: cur.encode(), done: true });
        }
        if cur.phase == 0 {
            let meta = self.parked.get(&t).map_or(self.meta, |s| s.meta);
            let origin_name = self.catalog.by_id.get(&origin).map(|e| e.name.clone()).unwrap_or_default();
            out.push(&Record::Begin(Begin {
                guid: self.snapshot_guid(t),
                base_guid: b.map_or(0, |(b, _)| self.snapshot_guid(b)),
                next_ino: rel(meta.next_ino),
                snapshot: snapshot.split_once('@').map_or(snapshot, |(_, s)| s).to_string(),
                origin: origin_name,
            }));
            cur = Cursor { phase: 1, key: Key::MIN, records: out.records, check: out.check };
        }
        let saved = self.view;
        self.set_view(Some(t));
        let r = self.send_items(t, b, &mut cur.key, &mut out, budget);
        self.set_view(saved);
        let finished = r?;
        if finished {
            out.end();
            cur.phase = 2;
        }
        cur.records = out.records;
        cur.check = out.check;
        Ok(SendChunk { data: out.out, cursor: cur.encode(), done: finished })
    }

    /// Records from `key` on until `budget` bytes are out; true when the trees are done.
    fn send_items(
        &mut self,
        t: u64,
        b: Option<(u64, u64)>,
        key: &mut Key,
        out: &mut StreamOut,
        budget: usize,
    ) -> Result<bool> {
        self.select(t)?;
        let missing = || Error::NotFound("a snapshot's tree".into());
        let t_tree = self.tree_of(t).ok_or_else(missing)?;
        let b_tree = match b {
            Some((b, g)) => Some((self.tree_of(b).ok_or_else(missing)?, g)),
            None => None,
        };
        let mut pair = Pair { t: t_tree, b: b_tree, shared: Default::default() };
        if b.is_some() {
            let shared = t_tree.frontier(&mut self.pager, &pair.t_skip())?;
            pair.shared = shared;
        }
        while out.out.len() < budget {
            let end = Key::new(MAX_INO, 0, 0);
            let tn = pair.t.collect_unshared(&mut self.pager, key, &end, &pair.t_skip(), 1)?;
            let bn = match pair.b {
                Some((bt, _)) => bt.collect_unshared(&mut self.pager, key, &end, &pair.b_skip(), 1)?,
                None => Vec::new(),
            };
            let Some(next) = tn.first().map(|i| i.0).into_iter().chain(bn.first().map(|i| i.0)).min() else {
                return Ok(true);
            };
            let x = next.objectid;
            *key = (*key).max(Key::new(x, 0, 0));
            let t_inode = present(&pair.t, &mut self.pager, x)?;
            let in_b = match pair.b {
                Some((bt, _)) => present(&bt, &mut self.pager, x)?.is_some(),
                None => false,
            };
            let mode = match (&t_inode, in_b) {
                (Some(_), true) => Mode::Diff,
                (Some(_), false) => Mode::Whole,
                (None, true) => Mode::Gone,
                (None, false) => Mode::Skip,
            };
            match (mode, t_inode) {
                (Mode::Gone, _) => {
                    out.push(&Record::Destroy { ino: rel(x) });
                    *key = Key::new(x + 1, 0, 0);
                }
                (Mode::Skip, _) | (_, None) => *key = Key::new(x + 1, 0, 0),
                (Mode::Whole, Some(ti)) => {
                    let items = pair.t.collect(&mut self.pager, key, &last_key_of(x), BATCH)?;
                    let full = items.len() == BATCH;
                    for (k, v) in &items {
                        self.send_item(&ti, *k, None, Some(v), false, out)?;
                        *key = after(*k);
                        if out.out.len() >= budget {
                            return Ok(false);
                        }
                    }
                    if !full {
                        *key = Key::new(x + 1, 0, 0);
                    }
                }
                (Mode::Diff, Some(ti)) => self.send_diff(&pair, &ti, key, out, budget)?,
            }
        }
        Ok(false)
    }

    /// Records for what differs between the two trees in object `ti.ino`, from `key` on.
    fn send_diff(&mut self, pair: &Pair, ti: &Inode, key: &mut Key, out: &mut StreamOut, budget: usize) -> Result<()> {
        let x = ti.ino;
        let hi = last_key_of(x);
        let ts = pair.t.collect_unshared(&mut self.pager, key, &hi, &pair.t_skip(), BATCH)?;
        let bs = match pair.b {
            Some((bt, _)) => bt.collect_unshared(&mut self.pager, key, &hi, &pair.b_skip(), BATCH)?,
            None => Vec::new(),
        };
        // Only keys both batches have seen past are settled.
        let mut upto = hi;
        for s in [&ts, &bs] {
            if s.len() == BATCH {
                upto = upto.min(s[BATCH - 1].0);
            }
        }
        let (mut i, mut j) = (0, 0);
        loop {
            let tk = ts.get(i).map(|e| e.0).filter(|k| *k <= upto);
            let bk = bs.get(j).map(|e| e.0).filter(|k| *k <= upto);
            let k = match (tk, bk) {
                (None, None) => break,
                (Some(a), Some(b)) => a.min(b),
                (Some(a), None) => a,
                (None, Some(b)) => b,
            };
            let tv = (tk == Some(k)).then(|| &ts[i].1);
            let bv = (bk == Some(k)).then(|| &bs[j].1);
            i += usize::from(tv.is_some());
            j += usize::from(bv.is_some());
            if tv != bv {
                self.send_item(ti, k, bv.map(|v| &v[..]), tv.map(|v| &v[..]), true, out)?;
            }
            *key = after(k);
            if out.out.len() >= budget {
                return Ok(());
            }
        }
        *key = if upto == hi { Key::new(x + 1, 0, 0) } else { after(upto) };
        Ok(())
    }

    /// Records for one item that differs: `bv` what the base has there, `tv` the later
    /// snapshot (`diff`: the receiver has the base's object, else it has nothing of it).
    fn send_item(
        &mut self,
        ti: &Inode,
        k: Key,
        bv: Option<&[u8]>,
        tv: Option<&[u8]>,
        diff: bool,
        out: &mut StreamOut,
    ) -> Result<()> {
        let x = k.objectid;
        match k.kind {
            kind::INODE => {
                if let Some(tv) = tv {
                    let mut i = Inode::decode(x, tv, 0)?;
                    i.ino = rel(x);
                    i.parent = rel(i.parent);
                    out.push(&Record::Inode(i));
                }
            }
            kind::DIR_ENTRY => {
                let te = tv.map(|v| dirent::decode_entries(k, v, 0)).transpose()?.unwrap_or_default();
                let be = bv.map(|v| dirent::decode_entries(k, v, 0)).transpose()?.unwrap_or_default();
                for e in be.iter().filter(|e| !te.iter().any(|t| t.name == e.name)) {
                    out.push(&Record::Unlink { dir: rel(x), name: e.name.clone() });
                }
                for e in te.iter().filter(|e| !be.contains(e)) {
                    let entry = DirEntry { ino: rel(e.ino), ..e.clone() };
                    out.push(&Record::Dirent { dir: rel(x), entry });
                }
            }
            kind::DIR_INDEX => {}
            kind::XATTR => {
                let te = tv.map(|v| xattr::decode(k, v, 0)).transpose()?.unwrap_or_default();
                let be = bv.map(|v| xattr::decode(k, v, 0)).transpose()?.unwrap_or_default();
                for e in be.iter().filter(|e| !te.iter().any(|t| t.name == e.name)) {
                    out.push(&Record::RmXattr { ino: rel(x), name: e.name.clone() });
                }
                for e in te.iter().filter(|e| !be.contains(e)) {
                    let value = self.getxattr(x, &e.name)?;
                    out.push(&Record::Xattr { ino: rel(x), name: e.name.clone(), value });
                }
            }
            kind::XATTR_CHUNK => {
                // A value rewritten in place keeps its record (same length, same chunk
                // id): its chunks are what changed. Whole objects send whole values.
                if let (true, Some(tv)) = (diff, tv) {
                    let chunk = xattr::decode_chunk(k, tv, 0)?;
                    let owner = Key::new(x, kind::XATTR, chunk.owner_hash);
                    let entries = match self.fs.get(&mut self.pager, &owner)? {
                        Some(v) => xattr::decode(owner, &v, 0)?,
                        None => Vec::new(),
                    };
                    for e in entries {
                        let ours = matches!(e.value, xattr::Value::Chunked { id, .. } if id == chunk.id);
                        if ours && out.last_xattr != Some((x, chunk.id)) {
                            out.last_xattr = Some((x, chunk.id));
                            let value = self.getxattr(x, &e.name)?;
                            out.push(&Record::Xattr { ino: rel(x), name: e.name, value });
                        }
                    }
                }
            }
            kind::EXTENT => self.send_extent(ti, k, bv, tv, out)?,
            other => return Err(Error::corrupt("item", 0, format!("send: item kind {other} in an fs tree"))),
        }
        Ok(())
    }

    /// FREE for the base's bytes of an extent no extent of the later snapshot covers
    /// (within its size), and DATA for the later snapshot's extent.
    fn send_extent(
        &mut self,
        ti: &Inode,
        k: Key,
        bv: Option<&[u8]>,
        tv: Option<&[u8]>,
        out: &mut StreamOut,
    ) -> Result<()> {
        let x = k.objectid;
        let total = self.pager.total_blocks();
        let span = |e: &Extent| match e {
            Extent::Inline(d) => (0, d.len() as u64),
            Extent::Regular { csums, .. } => (k.offset, k.offset + csums.len() as u64 * BLOCK_SIZE_U64),
        };
        if let Some(bv) = bv {
            let (s, e) = span(&Extent::decode(k, bv, total)?);
            let e = e.min(ti.size);
            let mut pos = s;
            let mut covered: Vec<(u64, u64)> = self
                .extents_overlapping(x, s, e)?
                .iter()
                .map(|(o, ext)| match ext {
                    Extent::Inline(_) => (0, ti.size),
                    Extent::Regular { csums, .. } => (*o, *o + csums.len() as u64 * BLOCK_SIZE_U64),
                })
                .collect();
            covered.sort_unstable();
            for (cs, ce) in covered.into_iter().chain([(e, e)]) {
                if cs > pos && pos < e {
                    out.push(&Record::Free { ino: rel(x), offset: pos, len: cs.min(e) - pos });
                }
                pos = pos.max(ce);
            }
        }
        if let Some(tv) = tv {
            let (s, e) = span(&Extent::decode(k, tv, total)?);
            let e = e.min(ti.size);
            if s < e {
                let bytes = self.read_data(ti, s, e - s)?;
                out.push(&Record::Data { ino: rel(x), offset: s, bytes });
            }
        }
        Ok(())
    }
}

impl Store {
    /// Whether dataset `d`'s tree differs from its snapshot `s` (taken at generation `g`)
    /// in more than access times: read by what they do not share, so in time proportional
    /// to the difference. (A backup mounted and read has newer access times; nothing else.)
    pub(crate) fn changed_beyond_atime(&mut self, d: u64, s: u64, g: u64) -> Result<bool> {
        let missing = || Error::NotFound("a dataset's tree".into());
        let live = self.tree_of(d).ok_or_else(missing)?;
        let base = self.tree_of(s).ok_or_else(missing)?;
        let pair = Pair { t: live, b: Some((base, g)), shared: Default::default() };
        let shared = live.frontier(&mut self.pager, &pair.t_skip())?;
        let pair = Pair { shared, ..pair };
        let mut key = Key::MIN;
        loop {
            let ls = pair.t.collect_unshared(&mut self.pager, &key, &Key::MAX, &pair.t_skip(), BATCH)?;
            let bs = base.collect_unshared(&mut self.pager, &key, &Key::MAX, &pair.b_skip(), BATCH)?;
            let mut upto = Key::MAX;
            for x in [&ls, &bs] {
                if x.len() == BATCH {
                    upto = upto.min(x[BATCH - 1].0);
                }
            }
            let l: std::collections::BTreeMap<Key, &Vec<u8>> =
                ls.iter().filter(|e| e.0 <= upto).map(|(k, v)| (*k, v)).collect();
            let b: std::collections::BTreeMap<Key, &Vec<u8>> =
                bs.iter().filter(|e| e.0 <= upto).map(|(k, v)| (*k, v)).collect();
            for k in l.keys().chain(b.keys()) {
                let same = match (l.get(k), b.get(k)) {
                    (Some(x), Some(y)) if k.kind == kind::INODE && x.len() == y.len() && x.len() > 68 => {
                        x[..56] == y[..56] && x[68..] == y[68..]
                    }
                    (x, y) => x == y,
                };
                if !same {
                    return Ok(true);
                }
            }
            if upto == Key::MAX {
                return Ok(false);
            }
            key = after(upto);
        }
    }
}

/// Object `x` of `tree` if it is linked somewhere (an unlinked-but-open one, nlink 0, is
/// not sent: it is gone once its last handle closes).
fn present(tree: &Tree, pager: &mut crate::engine::pager::Pager, x: u64) -> Result<Option<Inode>> {
    if x >= MAX_INO {
        return Ok(None);
    }
    match tree.get(pager, &Inode::key(x))? {
        Some(v) => Ok(Some(Inode::decode(x, &v, 0)?).filter(|i| i.nlink > 0)),
        None => Ok(None),
    }
}

/// Whether inode number `ino` (within a dataset) can be one.
pub(crate) fn valid_rel(ino: u64) -> bool {
    (1..=INO_MASK).contains(&ino)
}

/// `ino` within dataset `d`.
pub(crate) fn abs(d: u64, ino: u64) -> u64 {
    (d << INO_BITS) | (ino & INO_MASK)
}

/// For fuzz targets: streams built from arbitrary records, framed as a sender frames them.
pub mod fuzzing {
    use super::*;

    /// A BEGIN record's payload for a full stream of snapshot `snap`.
    pub fn begin(snap: &str, next_ino: u64) -> Vec<u8> {
        let b = Begin { guid: 1, base_guid: 0, next_ino, snapshot: snap.into(), origin: "fuzz".into() };
        let mut p = Vec::new();
        Record::Begin(b).encode_payload(&mut p);
        p
    }

    /// Records (type, payload) framed with their checksums, then END.
    pub fn frame(parts: &[(u8, Vec<u8>)]) -> Vec<u8> {
        let mut out = StreamOut::default();
        for (t, p) in parts {
            let start = out.out.len();
            out.out.push(*t);
            out.out.extend_from_slice(&(p.len() as u32).to_le_bytes());
            out.out.extend_from_slice(p);
            let crc = crc32c(&out.out[start..]);
            out.out.extend_from_slice(&crc.to_le_bytes());
            out.records += 1;
            out.check = chain(out.check, crc);
        }
        out.end();
        out.out
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn sample() -> Vec<Record> {
        let inode = Inode::decode(5, &Inode::encode(&test_inode()), 0).unwrap();
        vec![
            Record::Begin(Begin { guid: 7, base_guid: 0, next_ino: 99, snapshot: "s".into(), origin: "d".into() }),
            Record::Inode(inode),
            Record::Dirent {
                dir: 1,
                entry: DirEntry { name: b"a".to_vec(), ino: 5, kind: FileKind::Regular, index: 3 },
            },
            Record::Unlink { dir: 1, name: b"b".to_vec() },
            Record::Xattr { ino: 5, name: b"user.x".to_vec(), value: vec![1; 3000] },
            Record::RmXattr { ino: 5, name: b"user.y".to_vec() },
            Record::Data { ino: 5, offset: 4096, bytes: vec![9; 5000] },
            Record::Free { ino: 5, offset: 0, len: 4096 },
            Record::Destroy { ino: 6 },
        ]
    }

    fn test_inode() -> Inode {
        Inode {
            ino: 5,
            generation: 1,
            kind: FileKind::Regular,
            mode: 0o644,
            nlink: 1,
            uid: 1,
            gid: 2,
            size: 9096,
            blocks: 0,
            rdev: 0,
            atime: Default::default(),
            mtime: Default::default(),
            ctime: Default::default(),
            crtime: Default::default(),
            parent: 0,
            next_index: 0,
            flags: 0,
        }
    }

    fn stream() -> Vec<u8> {
        let mut out = StreamOut::default();
        for r in sample() {
            out.push(&r);
        }
        out.end();
        out.out
    }

    fn read_all(bytes: &[u8], step: usize) -> Result<Vec<Record>> {
        let mut inp = StreamIn::default();
        let mut got = Vec::new();
        for part in bytes.chunks(step.max(1)) {
            inp.feed(part);
            while let Some(r) = inp.next()? {
                got.push(r);
            }
        }
        if !inp.ended {
            return Err(Error::Invalid("cut short".into()));
        }
        Ok(got)
    }

    #[test]
    fn records_round_trip_whatever_the_pieces_they_arrive_in() {
        let bytes = stream();
        for step in [1, 2, 7, 100, 4096, bytes.len()] {
            let got = read_all(&bytes, step).unwrap();
            assert_eq!(got.len(), sample().len() + 1, "step {step}");
            assert_eq!(&got[..sample().len()], &sample()[..]);
        }
    }

    #[test]
    fn every_flipped_byte_and_every_cut_is_refused() {
        let bytes = stream();
        for at in 0..bytes.len() {
            let mut bad = bytes.clone();
            bad[at] ^= 0x20;
            assert!(read_all(&bad, 64).is_err(), "flip at {at} accepted");
            assert!(read_all(&bytes[..at], 64).is_err(), "cut at {at} accepted");
        }
    }

    #[test]
    fn a_dropped_or_repeated_record_fails_at_end() {
        let mut out = StreamOut::default();
        let mut parts = Vec::new();
        for r in sample() {
            let before = out.out.len();
            out.push(&r);
            parts.push(out.out[before..].to_vec());
        }
        out.end();
        let end = out.out[out.out.len() - (FRAME_BYTES + 12)..].to_vec();
        let mut dropped: Vec<u8> =
            parts.iter().enumerate().filter(|(i, _)| *i != 3).flat_map(|(_, p)| p.clone()).collect();
        dropped.extend_from_slice(&end);
        assert!(read_all(&dropped, 64).is_err());
        let mut swapped: Vec<u8> = Vec::new();
        for i in [0, 2, 1, 3, 4, 5, 6, 7, 8] {
            swapped.extend_from_slice(&parts[i]);
        }
        swapped.extend_from_slice(&end);
        assert!(read_all(&swapped, 64).is_err());
    }

    #[test]
    fn cursors_round_trip_and_bad_ones_are_refused() {
        let c = Cursor { phase: 1, key: Key::new(3, 5, 8192), records: 12, check: 0xdead };
        assert_eq!(Cursor::decode(&c.encode()).unwrap(), c);
        assert!(Cursor::decode(&[1, 2, 3]).is_err());
        let mut bad = c.encode();
        bad[0] = 9;
        assert!(Cursor::decode(&bad).is_err());
    }
}
