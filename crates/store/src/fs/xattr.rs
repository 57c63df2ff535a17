//! Extended attributes, up to the Linux limits: names of 1–255 bytes, values of up to
//! 64 KiB (`XATTR_SIZE_MAX`), and as many per inode as fit a 64 KiB name list
//! (`XATTR_LIST_MAX`, what one `listxattr` can return).
//!
//! Layout (docs/format.md §5.4, §5.7):
//! - XATTR items `(ino, XATTR, name hash)` hold every xattr of the inode whose name has
//!   that hash (colliding names share the item), one record each. A small xattr (name +
//!   value ≤ `XATTR_INLINE_MAX`) is stored *inline*: `[name_len][value_len u16][name][value]`.
//!   A larger one is stored *out of line*: the record `[0][name_len][value_len u32]
//!   [chunk id u64][name]` (a leading 0 was never a valid name length, so version-1 items
//!   read unchanged) and its value in XATTR_CHUNK items `(ino, XATTR_CHUNK, id << 8 | i)`,
//!   chunk `i` holding bytes `[i·C, min(len, (i+1)·C))` with `C = XATTR_CHUNK_BYTES`,
//!   after a header naming its owner (name hash, value length).
//! - Which form a record takes depends only on its name and value length
//!   (`record_bytes`), so a client that knows an inode's xattrs can tell exactly whether
//!   the store will accept one more (the FUSE writeback rule).
//!
//! Invariant (kept by `Store::setxattr`/`removexattr`/`destroy_inode`, checked by fsck):
//! the chunks of an inode are exactly those its out-of-line records name — chunk ids are
//! unique within the inode, every record's chunks `0..chunk_count(len)` exist with its
//! name hash, its length and the right number of bytes, and no other chunk exists. Each
//! setxattr/removexattr changes the record and its chunks in one store operation (one
//! transaction), so a crash leaves all of it or none. Tests: `tests/xattr.rs` (random sizes
//! around the chunk boundaries, thousands per inode, colliding names, big↔small, reopen,
//! destroy + fsck), `tests/model.rs` (against a map), `tests/crash.rs` (power cuts during
//! big xattr changes), `tests/corruption.rs` (orphan and short chunks found by fsck).

use crate::engine::key::Key;
use crate::engine::node::{LEAF_ITEM_BYTES, LEAF_SPACE};
use crate::error::{Error, Result};
use crate::fs::keys::{kind, name_hash};
use crate::limits::{MAX_ITEM_BYTES, XATTR_CHUNK_BYTES, XATTR_INLINE_MAX, XATTR_NAME_MAX, XATTR_SIZE_MAX};

/// Bytes of an out-of-line record besides its name: marker, name length, value length,
/// chunk id.
const OUTLINE_HEADER: usize = 1 + 1 + 4 + 8;
/// Bytes of an inline record besides its name and value: name length, value length.
const INLINE_HEADER: usize = 3;
/// Bytes of a chunk item's header: owner name hash, whole value length.
pub const CHUNK_HEADER: usize = 8 + 4;
/// Chunk ids are below this (the low 8 bits of a chunk key's offset are the index).
const CHUNK_ID_LIMIT: u64 = 1 << 56;

// The layout's arithmetic, checked when the crate compiles: three chunk items fill a leaf
// (four do not), a 64 KiB value's chunk indices fit the key's low byte, and the largest
// record of either form fits an item by itself.
const _: () = {
    let chunk_item = LEAF_ITEM_BYTES + CHUNK_HEADER + XATTR_CHUNK_BYTES;
    assert!(3 * chunk_item <= LEAF_SPACE && 4 * chunk_item > LEAF_SPACE);
    assert!(CHUNK_HEADER + XATTR_CHUNK_BYTES <= MAX_ITEM_BYTES);
    assert!(XATTR_SIZE_MAX.div_ceil(XATTR_CHUNK_BYTES) < 256);
    assert!(INLINE_HEADER + XATTR_INLINE_MAX <= MAX_ITEM_BYTES);
    assert!(OUTLINE_HEADER + XATTR_NAME_MAX <= MAX_ITEM_BYTES);
};

/// Where an xattr's value lives.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Value {
    /// In the record itself.
    Inline(Vec<u8>),
    /// In `chunk_count(len)` XATTR_CHUNK items of chunk id `id`.
    Chunked {
        /// Value length in bytes.
        len: u32,
        /// Chunk id (below 2^56).
        id: u64,
    },
}

/// One record of an XATTR item.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Entry {
    /// The xattr's name.
    pub name: Vec<u8>,
    /// Its value or where the value is.
    pub value: Value,
}

impl Entry {
    /// Bytes of the value.
    pub fn value_len(&self) -> usize {
        match &self.value {
            Value::Inline(v) => v.len(),
            Value::Chunked { len, .. } => *len as usize,
        }
    }
}

/// Key of the item holding xattr `name` of `ino`.
pub fn xattr_key(ino: u64, name: &[u8]) -> Key {
    Key::new(ino, kind::XATTR, name_hash(name))
}

/// Key of chunk `index` of chunk id `id` of `ino`.
pub fn chunk_key(ino: u64, id: u64, index: usize) -> Key {
    Key::new(ino, kind::XATTR_CHUNK, id << 8 | index as u64)
}

/// The first chunk id to try for a value of the xattr with name hash `hash` (ids are
/// taken in order from here until a free one is found, so they stay near their name).
pub fn preferred_chunk_id(hash: u64) -> u64 {
    hash >> 8
}

/// The chunk id after `id` (wrapping inside the id space).
pub fn next_chunk_id(id: u64) -> u64 {
    (id + 1) % CHUNK_ID_LIMIT
}

/// True when xattr `name` with a value of `value_len` bytes is stored inline.
pub fn is_inline(name_len: usize, value_len: usize) -> bool {
    name_len + value_len <= XATTR_INLINE_MAX
}

/// Bytes the record of an xattr takes in its XATTR item. An item (the records of the
/// names sharing one hash) may hold at most `MAX_ITEM_BYTES`.
pub fn record_bytes(name_len: usize, value_len: usize) -> usize {
    if is_inline(name_len, value_len) {
        INLINE_HEADER + name_len + value_len
    } else {
        OUTLINE_HEADER + name_len
    }
}

/// Chunks of an out-of-line value of `len` bytes.
pub fn chunk_count(len: usize) -> usize {
    len.div_ceil(XATTR_CHUNK_BYTES)
}

/// Bytes of chunk `index` of a value of `len` bytes.
fn chunk_len(len: usize, index: usize) -> usize {
    len.saturating_sub(index * XATTR_CHUNK_BYTES).min(XATTR_CHUNK_BYTES)
}

/// Checks a name a caller gave, with Linux's errors: ERANGE for an empty or too long
/// name (what `setxattr(2)` returns), EINVAL for a NUL inside (a C string cannot have one).
pub fn check_name(name: &[u8]) -> Result<()> {
    if name.is_empty() || name.len() > XATTR_NAME_MAX {
        return Err(Error::Range(format!("xattr name of {} bytes (1 to {XATTR_NAME_MAX})", name.len())));
    }
    if name.contains(&0) {
        return Err(Error::Invalid("xattr name contains NUL".into()));
    }
    Ok(())
}

/// Checks a name and value a caller gave: E2BIG for a value over 64 KiB, as Linux.
pub fn check(name: &[u8], value_len: usize) -> Result<()> {
    check_name(name)?;
    if value_len > XATTR_SIZE_MAX {
        return Err(Error::TooBig(format!("xattr value of {value_len} bytes (max {XATTR_SIZE_MAX})")));
    }
    Ok(())
}

/// Bytes the records take once encoded.
pub fn item_bytes(entries: &[Entry]) -> usize {
    entries.iter().map(|e| record_bytes(e.name.len(), e.value_len())).sum()
}

/// Encodes the records sharing one item. Each must take the form `is_inline` gives it.
pub fn encode(entries: &[Entry]) -> Vec<u8> {
    let mut out = Vec::with_capacity(item_bytes(entries));
    for e in entries {
        match &e.value {
            Value::Inline(v) => {
                out.push(e.name.len() as u8);
                out.extend_from_slice(&(v.len() as u16).to_le_bytes());
                out.extend_from_slice(&e.name);
                out.extend_from_slice(v);
            }
            Value::Chunked { len, id } => {
                out.push(0);
                out.push(e.name.len() as u8);
                out.extend_from_slice(&len.to_le_bytes());
                out.extend_from_slice(&id.to_le_bytes());
                out.extend_from_slice(&e.name);
            }
        }
    }
    out
}

fn u32_at(b: &[u8], at: usize) -> u32 {
    let mut a = [0u8; 4];
    a.copy_from_slice(&b[at..at + 4]);
    u32::from_le_bytes(a)
}

fn u64_at(b: &[u8], at: usize) -> u64 {
    let mut a = [0u8; 8];
    a.copy_from_slice(&b[at..at + 8]);
    u64::from_le_bytes(a)
}

/// Decodes and validates an XATTR item: lengths, names (no NUL, hashing to the key, no
/// name twice), each record in the form its size gives it, chunk ids in range.
pub fn decode(key: Key, b: &[u8], block: u64) -> Result<Vec<Entry>> {
    let bad = |what: &str| Error::bad_item(key, block, what);
    let mut at = 0;
    let mut out: Vec<Entry> = Vec::new();
    while at < b.len() {
        let rest = &b[at..];
        let (entry, used) = if rest[0] != 0 {
            if rest.len() < INLINE_HEADER {
                return Err(bad("truncated xattr header"));
            }
            let nl = usize::from(rest[0]);
            let vl = usize::from(u16::from_le_bytes([rest[1], rest[2]]));
            if rest.len() - INLINE_HEADER < nl + vl {
                return Err(bad("xattr runs past the item"));
            }
            let name = rest[INLINE_HEADER..INLINE_HEADER + nl].to_vec();
            if !is_inline(nl, vl) {
                return Err(bad("xattr too big for a record stored inline"));
            }
            let value = rest[INLINE_HEADER + nl..INLINE_HEADER + nl + vl].to_vec();
            (Entry { name, value: Value::Inline(value) }, INLINE_HEADER + nl + vl)
        } else {
            if rest.len() < OUTLINE_HEADER {
                return Err(bad("truncated out-of-line xattr header"));
            }
            let nl = usize::from(rest[1]);
            let len = u32_at(rest, 2);
            let id = u64_at(rest, 6);
            if nl == 0 || rest.len() - OUTLINE_HEADER < nl {
                return Err(bad("out-of-line xattr name runs past the item"));
            }
            if len == 0 || len as usize > XATTR_SIZE_MAX {
                return Err(bad("out-of-line xattr value length out of range"));
            }
            if is_inline(nl, len as usize) {
                return Err(bad("xattr small enough to be inline stored out of line"));
            }
            if id >= CHUNK_ID_LIMIT {
                return Err(bad("xattr chunk id out of range"));
            }
            let name = rest[OUTLINE_HEADER..OUTLINE_HEADER + nl].to_vec();
            (Entry { name, value: Value::Chunked { len, id } }, OUTLINE_HEADER + nl)
        };
        if entry.name.contains(&0) {
            return Err(bad("xattr name contains NUL"));
        }
        if name_hash(&entry.name) != key.offset {
            return Err(bad("xattr name does not hash to the key"));
        }
        if out.iter().any(|e| e.name == entry.name) {
            return Err(bad("xattr name appears twice"));
        }
        out.push(entry);
        at += used;
    }
    if out.is_empty() {
        return Err(bad("empty xattr item"));
    }
    Ok(out)
}

/// Bytes the item's names take in a `listxattr` answer (each name and its NUL), without
/// copying the values (a setxattr of a new name sums this over every item of the inode).
pub fn list_bytes(key: Key, b: &[u8], block: u64) -> Result<usize> {
    Ok(decode(key, b, block)?.iter().map(|e| e.name.len() + 1).sum())
}

/// A decoded XATTR_CHUNK item.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Chunk {
    /// Chunk id (the key's offset without its low 8 bits).
    pub id: u64,
    /// Its place in the value.
    pub index: usize,
    /// Name hash of the xattr it belongs to.
    pub owner_hash: u64,
    /// Length of the whole value.
    pub value_len: usize,
    /// This chunk's bytes.
    pub data: Vec<u8>,
}

/// Encodes chunk `index` of `value` (owned by the xattr whose name hashes to `owner_hash`).
pub fn encode_chunk(owner_hash: u64, value: &[u8], index: usize) -> Vec<u8> {
    let start = index * XATTR_CHUNK_BYTES;
    let data = &value[start..start + chunk_len(value.len(), index)];
    let mut out = Vec::with_capacity(CHUNK_HEADER + data.len());
    out.extend_from_slice(&owner_hash.to_le_bytes());
    out.extend_from_slice(&(value.len() as u32).to_le_bytes());
    out.extend_from_slice(data);
    out
}

/// Decodes and validates an XATTR_CHUNK item on its own: the value length is one an
/// out-of-line record may have, the index is one of its chunks, and the chunk holds
/// exactly that chunk's bytes. (That its owner names it is for the caller to check.)
pub fn decode_chunk(key: Key, b: &[u8], block: u64) -> Result<Chunk> {
    let bad = |what: &str| Error::bad_item(key, block, what);
    if b.len() < CHUNK_HEADER {
        return Err(bad("truncated xattr chunk header"));
    }
    let owner_hash = u64_at(b, 0);
    let value_len = u32_at(b, 8) as usize;
    let index = (key.offset & 0xff) as usize;
    if value_len == 0 || value_len > XATTR_SIZE_MAX {
        return Err(bad("xattr chunk's value length out of range"));
    }
    if index >= chunk_count(value_len) {
        return Err(bad("xattr chunk index past the value's end"));
    }
    if b.len() - CHUNK_HEADER != chunk_len(value_len, index) {
        return Err(bad("xattr chunk holds the wrong number of bytes"));
    }
    Ok(Chunk { id: key.offset >> 8, index, owner_hash, value_len, data: b[CHUNK_HEADER..].to_vec() })
}

/// Joins the chunks of an out-of-line value read from the tree (`items`: every chunk
/// item of chunk id `id`, in key order), checking they are exactly the ones the record
/// of the xattr with name hash `owner_hash` and length `len` needs.
pub fn join_chunks(owner_hash: u64, len: usize, id: u64, items: &[(Key, Vec<u8>)]) -> Result<Vec<u8>> {
    let mut value = Vec::with_capacity(len);
    for (i, (k, v)) in items.iter().enumerate() {
        let c = decode_chunk(*k, v, 0)?;
        if c.id != id || c.index != i || c.owner_hash != owner_hash || c.value_len != len {
            return Err(Error::bad_item(*k, 0, "xattr chunk does not belong to the value that names it"));
        }
        value.extend_from_slice(&c.data);
    }
    if items.len() != chunk_count(len) || value.len() != len {
        return Err(Error::corrupt(
            "item",
            0,
            format!("xattr chunks {id}: {} of {} present", items.len(), chunk_count(len)),
        ));
    }
    Ok(value)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn inline(name: &[u8], v: &[u8]) -> Entry {
        Entry { name: name.to_vec(), value: Value::Inline(v.to_vec()) }
    }

    #[test]
    fn roundtrip_and_truncation() {
        let entries = vec![inline(b"user.a", b"value")];
        let key = xattr_key(5, b"user.a");
        let enc = encode(&entries);
        assert_eq!(decode(key, &enc, 0).ok(), Some(entries));
        for cut in 0..enc.len() {
            assert!(decode(key, &enc[..cut], 0).is_err());
        }
        assert!(check(b"user.x", XATTR_SIZE_MAX).is_ok());
        assert_eq!(check(b"user.x", XATTR_SIZE_MAX + 1).map_err(|e| e.errno()), Err(7));
        assert_eq!(check(b"", 1).map_err(|e| e.errno()), Err(34));
        assert_eq!(check(&[b'a'; 256], 1).map_err(|e| e.errno()), Err(34));
        assert_eq!(check(b"a\0b", 1).map_err(|e| e.errno()), Err(22));
    }

    #[test]
    fn out_of_line_records_roundtrip_and_are_checked() {
        let key = xattr_key(5, b"user.big");
        let big = Entry { name: b"user.big".to_vec(), value: Value::Chunked { len: 65_536, id: 77 } };
        let enc = encode(std::slice::from_ref(&big));
        assert_eq!(enc.len(), record_bytes(8, 65_536));
        assert_eq!(decode(key, &enc, 0).ok(), Some(vec![big.clone()]));
        for cut in 0..enc.len() {
            assert!(decode(key, &enc[..cut], 0).is_err(), "cut at {cut}");
        }
        let mut twice = enc.clone();
        twice.extend_from_slice(&enc);
        assert!(decode(key, &twice, 0).is_err(), "a name twice");
        let mut too_long = enc.clone();
        too_long[2..6].copy_from_slice(&65_537u32.to_le_bytes());
        assert!(decode(key, &too_long, 0).is_err());
        let mut bad_id = enc;
        bad_id[6..14].copy_from_slice(&CHUNK_ID_LIMIT.to_le_bytes());
        assert!(decode(key, &bad_id, 0).is_err());
    }

    #[test]
    fn chunks_split_join_and_validate() {
        let hash = name_hash(b"user.big");
        for len in [1, XATTR_CHUNK_BYTES - 1, XATTR_CHUNK_BYTES, XATTR_CHUNK_BYTES + 1, 3 * XATTR_CHUNK_BYTES, 65_536] {
            let value: Vec<u8> = (0..len).map(|i| (i * 7 + len) as u8).collect();
            let items: Vec<(Key, Vec<u8>)> =
                (0..chunk_count(len)).map(|i| (chunk_key(9, 42, i), encode_chunk(hash, &value, i))).collect();
            assert!(items.iter().all(|(_, v)| v.len() <= MAX_ITEM_BYTES));
            assert_eq!(join_chunks(hash, len, 42, &items).ok(), Some(value.clone()), "len {len}");
            assert!(join_chunks(hash, len, 42, &items[..items.len() - 1]).is_err(), "a chunk missing");
            assert!(join_chunks(hash ^ 1, len, 42, &items).is_err(), "another owner");
            let (k, v) = &items[0];
            for cut in 0..v.len() {
                assert!(decode_chunk(*k, &v[..cut], 0).is_err());
            }
        }
    }
}
