//! File data on an object store (docs/objects.md). An image made with a data URL keeps
//! big files' data as immutable objects in an S3-compatible store; the image keeps the
//! metadata, small files and small writes, and every block's CRC-32C.
//!
//! Object blocks live in an address space of their own above the image's blocks:
//! block `b` of object `id` is address `OBJECT_SPACE | id << OBJECT_SHIFT | b`. An
//! extent naming such addresses is an ordinary extent (split, merged, counted in the
//! refcount tree, kept by snapshots on their deadlists) except that no allocator owns
//! its blocks: nothing marks them used, and when the last reference to an object's
//! blocks goes, the object's id goes on the **gone** list (a root-tree item) in the same
//! transaction, for the server to delete once that transaction is durable.
//!
//! Object ids come from a counter in the root tree; a session is granted ids before it
//! uploads (a GRANT item names the session), and mapping an object consumes its grant:
//! an id is written once and mapped once. Grants a session leaves unmapped go on the gone
//! list when it ends, so an upload that never got mapped is deleted, not kept for ever.
//!
//! Invariants (fsck): an object extent has no second copy and stays inside one object;
//! no object id is both referenced and gone or granted; every id is below the counter.

use crate::engine::key::Key;
use crate::error::{Error, Result};
use crate::fs::inode::{Inode, Timespec};
use crate::fs::keys::kind;
use crate::limits::{BLOCK_SIZE_U64, MAX_EXTENT_BLOCKS, MAX_FILE_BYTES};
use crate::store::Store;
use std::collections::BTreeSet;

/// First address of the object block space (far above any image's blocks).
pub const OBJECT_SPACE: u64 = 1 << 62;
/// Bits of an object address that number the block inside its object.
pub const OBJECT_SHIFT: u32 = 20;
/// Most blocks one object holds (64 MiB).
pub const MAX_OBJECT_BLOCKS: u64 = 1 << 14;
/// Largest object id (ids are below 2^40).
pub const MAX_OBJECT_ID: u64 = (1 << 40) - 1;
/// Most ids one session may hold granted and not yet mapped.
pub const MAX_GRANTS_PER_SESSION: usize = 256;
/// Most ids one grant gives.
pub const MAX_GRANT: u32 = 64;

/// Objectid of the root-tree items of the object store (config, counter, grants, gone).
const OBJECTS_OBJECTID: u64 = u64::MAX - 1;

/// The address of block `block` of object `id`.
pub fn object_block(id: u64, block: u64) -> u64 {
    OBJECT_SPACE | (id << OBJECT_SHIFT) | block
}

/// (object id, block in it) of an address in the object space, `None` for an image block.
pub fn object_of(addr: u64) -> Option<(u64, u64)> {
    (addr >= OBJECT_SPACE).then(|| ((addr - OBJECT_SPACE) >> OBJECT_SHIFT, addr & ((1 << OBJECT_SHIFT) - 1)))
}

/// Whether `n` blocks from `addr` lie inside one object (and its id is valid).
pub fn within_one_object(addr: u64, n: u64) -> bool {
    object_of(addr)
        .is_some_and(|(id, b)| id <= MAX_OBJECT_ID && b.checked_add(n).is_some_and(|e| e <= MAX_OBJECT_BLOCKS))
}

/// The object key of `id` under a store's prefix: `PREFIX/crest/<store id>/<id>`.
pub fn object_name(prefix: &str, store_id: u64, id: u64) -> String {
    let prefix = prefix.trim_matches('/');
    if prefix.is_empty() {
        format!("crest/{store_id:016x}/{id:016x}")
    } else {
        format!("{prefix}/crest/{store_id:016x}/{id:016x}")
    }
}

/// Where an image's file data lives: the URL given at mkfs (`s3://BUCKET[/PREFIX]`, no
/// credentials) and the random id that keeps two images' objects apart.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DataStore {
    /// `s3://BUCKET[/PREFIX]`.
    pub url: String,
    /// Random, chosen when the image was made.
    pub store_id: u64,
}

impl DataStore {
    /// (bucket, prefix) of the URL.
    pub fn bucket_and_prefix(&self) -> Result<(String, String)> {
        parse_data_url(&self.url)
    }

    /// The key of object `id`.
    pub fn object_key(&self, id: u64) -> String {
        let prefix = self.bucket_and_prefix().map(|(_, p)| p).unwrap_or_default();
        object_name(&prefix, self.store_id, id)
    }
}

/// (bucket, prefix) of `s3://BUCKET[/PREFIX]`; refuses anything else.
pub fn parse_data_url(url: &str) -> Result<(String, String)> {
    let rest = url.strip_prefix("s3://").ok_or_else(|| Error::Invalid(format!("data URL {url:?}: not s3://")))?;
    let (bucket, prefix) = rest.split_once('/').unwrap_or((rest, ""));
    let ok = |c: char| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-' || c == '.';
    if bucket.len() < 3 || bucket.len() > 63 || !bucket.chars().all(ok) {
        return Err(Error::Invalid(format!("data URL {url:?}: bad bucket name")));
    }
    let fine = |c: char| c.is_ascii_alphanumeric() || "-_./".contains(c);
    if prefix.len() > 512 || !prefix.chars().all(fine) || prefix.split('/').any(|s| s == "." || s == "..") {
        return Err(Error::Invalid(format!("data URL {url:?}: bad prefix")));
    }
    Ok((bucket.to_string(), prefix.trim_matches('/').to_string()))
}

/// What the store reads object bytes through when it must (a partial block merged by a
/// write, truncate or punch; a send stream): the server's HTTP client. A read returns
/// exactly `len` bytes from `offset` of object `id`, or an error.
pub trait ObjectSource: Send {
    /// Reads bytes `[offset, offset + len)` of object `id`.
    fn read(&mut self, id: u64, offset: u64, len: usize) -> std::io::Result<Vec<u8>>;
}

/// The store's object state that is not in the trees.
#[derive(Default)]
pub(crate) struct Objects {
    /// Reads object bytes for the store itself, if the server gave it a way.
    pub(crate) source: Option<Box<dyn ObjectSource>>,
    /// Ids put on the gone list by the running transaction (not deletable before it is
    /// durable).
    pub(crate) gone_uncommitted: BTreeSet<u64>,
}

fn config_key() -> Key {
    Key::new(OBJECTS_OBJECTID, kind::OBJECT_CONFIG, 0)
}
fn next_key() -> Key {
    Key::new(OBJECTS_OBJECTID, kind::OBJECT_NEXT, 0)
}
fn grant_key(id: u64) -> Key {
    Key::new(OBJECTS_OBJECTID, kind::OBJECT_GRANT, id)
}
fn gone_key(id: u64) -> Key {
    Key::new(OBJECTS_OBJECTID, kind::OBJECT_GONE, id)
}

fn le_u64_at(v: &[u8], key: Key) -> Result<u64> {
    let b: [u8; 8] = v.get(..8).and_then(|b| b.try_into().ok()).ok_or_else(|| Error::bad_item(key, 0, "short item"))?;
    Ok(u64::from_le_bytes(b))
}

impl Store {
    /// Makes this image keep big files' data in the object store at `url`
    /// (`s3://BUCKET[/PREFIX]`); once, on an image with no data yet in objects. Durable
    /// with the next commit.
    pub fn set_data_store(&mut self, url: &str) -> Result<DataStore> {
        parse_data_url(url)?;
        if let Some(d) = self.data_store()? {
            return Err(Error::Exists(format!("the image already keeps its data at {}", d.url)));
        }
        self.pager.check_writable()?;
        let store_id = self.rng.next_u64();
        let mut v = store_id.to_le_bytes().to_vec();
        v.extend_from_slice(url.as_bytes());
        self.root_tree.insert(&mut self.pager, config_key(), v)?;
        self.root_tree.insert(&mut self.pager, next_key(), 1u64.to_le_bytes().to_vec())?;
        Ok(DataStore { url: url.to_string(), store_id })
    }

    /// Where this image keeps big files' data, if in an object store.
    pub fn data_store(&mut self) -> Result<Option<DataStore>> {
        let key = config_key();
        let Some(v) = self.root_tree.get(&mut self.pager, &key)? else { return Ok(None) };
        let store_id = le_u64_at(&v, key)?;
        let url = String::from_utf8(v[8..].to_vec()).map_err(|_| Error::bad_item(key, 0, "data URL not UTF-8"))?;
        parse_data_url(&url).map_err(|e| Error::bad_item(key, 0, e.to_string()))?;
        Ok(Some(DataStore { url, store_id }))
    }

    /// Gives the store a way to read object bytes itself (see `ObjectSource`).
    pub fn set_object_source(&mut self, source: Box<dyn ObjectSource>) {
        self.objects.source = Some(source);
    }

    /// Grants session `session` `count` fresh object ids to upload to (at most
    /// `MAX_GRANT`; refused past `MAX_GRANTS_PER_SESSION` unmapped). Durable with the
    /// next commit: a caller that hands them out commits first.
    pub fn grant_objects(&mut self, session: u64, count: u32) -> Result<Vec<u64>> {
        if self.data_store()?.is_none() {
            return Err(Error::Invalid("this image keeps no data in an object store".into()));
        }
        if count == 0 || count > MAX_GRANT {
            return Err(Error::Invalid(format!("a grant of {count} objects (1 to {MAX_GRANT})")));
        }
        let held = self.grants_of(session)?.len();
        if held + count as usize > MAX_GRANTS_PER_SESSION {
            return Err(Error::Busy(format!("session {session} holds {held} object ids unmapped")));
        }
        self.select(crate::datasets::DEFAULT_DATASET)?;
        self.reserve(0, false)?;
        let key = next_key();
        let next = match self.root_tree.get(&mut self.pager, &key)? {
            Some(v) => le_u64_at(&v, key)?,
            None => 1,
        };
        let end = next + u64::from(count);
        if end > MAX_OBJECT_ID {
            return Err(Error::NoSpace("object ids used up".into()));
        }
        self.root_tree.insert(&mut self.pager, key, end.to_le_bytes().to_vec())?;
        for id in next..end {
            self.root_tree.insert(&mut self.pager, grant_key(id), session.to_le_bytes().to_vec())?;
        }
        Ok((next..end).collect())
    }

    /// The ids granted to `session` and not yet mapped.
    pub fn grants_of(&mut self, session: u64) -> Result<Vec<u64>> {
        Ok(self.all_grants()?.into_iter().filter(|&(_, s)| s == session).map(|(id, _)| id).collect())
    }

    /// Every granted, unmapped id with its session.
    pub fn all_grants(&mut self) -> Result<Vec<(u64, u64)>> {
        let mut out = Vec::new();
        let (lo, hi) = (grant_key(0), grant_key(u64::MAX));
        let mut bad = None;
        self.root_tree.range(&mut self.pager, &lo, &hi, &mut |k, v| {
            match <[u8; 8]>::try_from(v) {
                Ok(b) => out.push((k.offset, u64::from_le_bytes(b))),
                Err(_) => bad = Some(*k),
            }
            Ok(true)
        })?;
        match bad {
            Some(k) => Err(Error::bad_item(k, 0, "bad object grant")),
            None => Ok(out),
        }
    }

    /// Ends session `session`'s grants: the ids it never mapped go on the gone list (an
    /// upload it may have made is deleted). Returns how many.
    pub fn release_grants(&mut self, session: u64) -> Result<usize> {
        let ids = self.grants_of(session)?;
        if ids.is_empty() {
            return Ok(0);
        }
        self.select(crate::datasets::DEFAULT_DATASET)?;
        self.reserve(0, true)?;
        for &id in &ids {
            self.root_tree.delete(&mut self.pager, &grant_key(id))?;
            self.mark_gone(id)?;
        }
        Ok(ids.len())
    }

    /// Ends one grant of `session` (a map of it failed): the id goes on the gone list.
    pub fn release_grant(&mut self, session: u64, id: u64) -> Result<()> {
        let key = grant_key(id);
        match self.root_tree.get(&mut self.pager, &key)? {
            Some(v) if le_u64_at(&v, key)? == session => {}
            _ => return Ok(()),
        }
        self.select(crate::datasets::DEFAULT_DATASET)?;
        self.reserve(0, true)?;
        self.root_tree.delete(&mut self.pager, &key)?;
        self.mark_gone(id)
    }

    /// Maps object `id` (granted to `session`) over file bytes `[offset, offset + len)`
    /// of regular file `ino`: the object holds `csums.len()` blocks, the last zero-padded
    /// past `len`; what was mapped there is dropped. `offset` is block-aligned; the file
    /// grows to `offset + len` if shorter. Consumes the grant.
    #[allow(clippy::too_many_arguments)]
    pub fn map_object(
        &mut self,
        session: u64,
        ino: u64,
        offset: u64,
        len: u64,
        id: u64,
        csums: &[u32],
        now: Timespec,
    ) -> Result<Inode> {
        let mut inode = self.file_to_write(ino)?;
        let n = csums.len() as u64;
        if !offset.is_multiple_of(BLOCK_SIZE_U64)
            || n == 0
            || n > MAX_OBJECT_BLOCKS
            || len.div_ceil(BLOCK_SIZE_U64) != n
        {
            return Err(Error::Invalid(format!("object of {n} blocks for {len} bytes at {offset}")));
        }
        let end = offset.checked_add(len).filter(|&e| e <= MAX_FILE_BYTES);
        let end = end.ok_or_else(|| Error::FileTooBig(format!("write ending past {MAX_FILE_BYTES}")))?;
        let key = grant_key(id);
        match self.root_tree.get(&mut self.pager, &key)? {
            Some(v) if le_u64_at(&v, key)? == session => {}
            _ => return Err(Error::NotPermitted(format!("object {id} is not granted to this session"))),
        }
        if inode.size > end && !len.is_multiple_of(BLOCK_SIZE_U64) {
            // The object's last block is padding past `len`, but the file goes on there:
            // those bytes are the file's, not zeros.
            return Err(Error::Invalid("an object ending inside a block before the file's end".into()));
        }
        self.check_quota(n)?;
        self.reserve(0, false)?;
        self.root_tree.delete(&mut self.pager, &key)?;
        inode.blocks += self.uninline(ino)?;
        let first = offset / BLOCK_SIZE_U64;
        inode.blocks -= self.unmap_blocks(ino, first, first + n)?;
        let mut done = 0;
        while done < n {
            let k = (n - done).min(MAX_EXTENT_BLOCKS);
            let at = object_block(id, done);
            self.refs_add(at, k)?;
            self.charge(k);
            self.map_extent(ino, first + done, at, 0, csums[done as usize..(done + k) as usize].to_vec())?;
            done += k;
        }
        inode.blocks += n;
        inode.size = inode.size.max(end);
        inode.mtime = now;
        inode.ctime = now;
        self.put_inode(&inode)?;
        self.maybe_commit()?;
        Ok(inode)
    }

    /// Puts object `id` on the gone list in the running transaction.
    pub(crate) fn mark_gone(&mut self, id: u64) -> Result<()> {
        self.root_tree.insert(&mut self.pager, gone_key(id), Vec::new())?;
        self.objects.gone_uncommitted.insert(id);
        Ok(())
    }

    /// Called as the last reference to some blocks of object `id` is dropped: if no
    /// refcount item names any block of it any more, it is gone.
    pub(crate) fn object_blocks_freed(&mut self, id: u64) -> Result<()> {
        let lo = Key::new(object_block(id, 0), kind::EXTENT_REF, 0);
        let hi = Key::new(object_block(id, MAX_OBJECT_BLOCKS - 1), kind::EXTENT_REF, u64::MAX);
        if self.refcount_tree.collect(&mut self.pager, &lo, &hi, 1)?.is_empty() {
            self.mark_gone(id)?;
        }
        Ok(())
    }

    /// Up to `limit` objects to delete from the store: on the gone list in a durable
    /// transaction (`objects_deleted` takes them off).
    pub fn gone_objects(&mut self, limit: usize) -> Result<Vec<u64>> {
        let mut out = Vec::new();
        let skip = &self.objects.gone_uncommitted;
        self.root_tree.range(&mut self.pager, &gone_key(0), &gone_key(u64::MAX), &mut |k, _| {
            if !skip.contains(&k.offset) {
                out.push(k.offset);
            }
            Ok(out.len() < limit)
        })?;
        Ok(out)
    }

    /// Takes deleted objects off the gone list.
    pub fn objects_deleted(&mut self, ids: &[u64]) -> Result<()> {
        if ids.is_empty() {
            return Ok(());
        }
        self.select(crate::datasets::DEFAULT_DATASET)?;
        self.reserve(0, true)?;
        for id in ids {
            self.root_tree.delete(&mut self.pager, &gone_key(*id))?;
        }
        Ok(())
    }

    /// Reads `buf.len()` bytes of object blocks from `addr` through the object source.
    pub(crate) fn read_object_blocks(&mut self, addr: u64, buf: &mut [u8]) -> Result<()> {
        let (id, block) = object_of(addr).ok_or_else(|| Error::Invalid(format!("block {addr} is no object's")))?;
        let io = |source: std::io::Error| Error::Io { op: "object read", offset: addr, source };
        let Some(src) = self.objects.source.as_mut() else {
            return Err(io(std::io::Error::other(format!("object {id}: this server cannot read objects"))));
        };
        let got = src.read(id, block * BLOCK_SIZE_U64, buf.len()).map_err(io)?;
        if got.len() != buf.len() {
            let short = format!("object {id}: {} bytes read of {} asked", got.len(), buf.len());
            return Err(io(std::io::Error::other(short)));
        }
        buf.copy_from_slice(&got);
        Ok(())
    }
}
