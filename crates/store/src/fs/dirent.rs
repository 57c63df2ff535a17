//! Directory items. Each entry is stored twice: under DIR_ENTRY keyed by the name's hash
//! (lookups in O(log n); names that collide share one item) and under DIR_INDEX keyed by
//! a per-directory counter (readdir in creation order with offsets that stay valid while
//! entries come and go).

use crate::engine::key::Key;
use crate::error::{Error, Result};
use crate::fs::inode::{le_u64, FileKind};
use crate::fs::keys::{kind, name_hash};
use crate::limits::NAME_MAX;

/// One directory entry.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DirEntry {
    /// Name (no '/', no NUL, not "." or "..").
    pub name: Vec<u8>,
    /// Inode it names.
    pub ino: u64,
    /// Its type (saves a lookup for readdir).
    pub kind: FileKind,
    /// Its DIR_INDEX position.
    pub index: u64,
}

/// Key of the DIR_ENTRY item holding `name` in `dir`.
pub fn entry_key(dir: u64, name: &[u8]) -> Key {
    Key::new(dir, kind::DIR_ENTRY, name_hash(name))
}

/// Key of the DIR_INDEX item at `index` in `dir`.
pub fn index_key(dir: u64, index: u64) -> Key {
    Key::new(dir, kind::DIR_INDEX, index)
}

/// Checks a name a caller gave.
pub fn check_name(name: &[u8]) -> Result<()> {
    if name.len() > NAME_MAX {
        return Err(Error::NameTooLong { len: name.len(), max: NAME_MAX });
    }
    if name.is_empty() || name == b"." || name == b".." || name.contains(&b'/') || name.contains(&0) {
        return Err(Error::Invalid(format!("bad name {:?}", String::from_utf8_lossy(name))));
    }
    Ok(())
}

fn encode_one(out: &mut Vec<u8>, e: &DirEntry, with_index: bool) {
    out.extend_from_slice(&e.ino.to_le_bytes());
    if with_index {
        out.extend_from_slice(&e.index.to_le_bytes());
    }
    out.push(e.kind as u8);
    out.push(e.name.len() as u8);
    out.extend_from_slice(&e.name);
}

/// Encodes the entries sharing one DIR_ENTRY item.
pub fn encode_entries(entries: &[DirEntry]) -> Vec<u8> {
    let mut out = Vec::new();
    for e in entries {
        encode_one(&mut out, e, true);
    }
    out
}

/// Encodes a DIR_INDEX item.
pub fn encode_index(e: &DirEntry) -> Vec<u8> {
    let mut out = Vec::new();
    encode_one(&mut out, e, false);
    out
}

fn decode_one(b: &[u8], at: &mut usize, with_index: bool, index: u64, key: Key, block: u64) -> Result<DirEntry> {
    let fixed = if with_index { 18 } else { 10 };
    if b.len() - *at < fixed {
        return Err(Error::bad_item(key, block, "truncated directory entry"));
    }
    let ino = le_u64(b, *at);
    let index = if with_index { le_u64(b, *at + 8) } else { index };
    let p = *at + fixed - 2;
    let kind =
        FileKind::from_u8(b[p]).ok_or_else(|| Error::bad_item(key, block, format!("unknown file type {}", b[p])))?;
    let len = usize::from(b[p + 1]);
    let start = p + 2;
    if len == 0 || b.len() < start + len {
        return Err(Error::bad_item(key, block, "directory entry name runs past the item"));
    }
    let name = b[start..start + len].to_vec();
    check_name(&name).map_err(|e| Error::bad_item(key, block, e.to_string()))?;
    *at = start + len;
    Ok(DirEntry { name, ino, kind, index })
}

/// Decodes a DIR_ENTRY item (one or more colliding entries), validating every field.
pub fn decode_entries(key: Key, b: &[u8], block: u64) -> Result<Vec<DirEntry>> {
    let mut at = 0;
    let mut out = Vec::new();
    while at < b.len() {
        let e = decode_one(b, &mut at, true, 0, key, block)?;
        if name_hash(&e.name) != key.offset {
            return Err(Error::bad_item(
                key,
                block,
                format!("name {:?} does not hash to the key", String::from_utf8_lossy(&e.name)),
            ));
        }
        out.push(e);
    }
    if out.is_empty() {
        return Err(Error::bad_item(key, block, "empty directory entry item"));
    }
    Ok(out)
}

/// Decodes a DIR_INDEX item.
pub fn decode_index(key: Key, b: &[u8], block: u64) -> Result<DirEntry> {
    let mut at = 0;
    let e = decode_one(b, &mut at, false, key.offset, key, block)?;
    if at != b.len() {
        return Err(Error::bad_item(key, block, "trailing bytes after the entry"));
    }
    Ok(e)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn roundtrip_and_truncation() {
        let a = DirEntry { name: b"hello".to_vec(), ino: 42, kind: FileKind::Regular, index: 3 };
        let b = DirEntry { name: vec![b'x'; 255], ino: 43, kind: FileKind::Directory, index: 9 };
        let key = entry_key(1, b"hello");
        let enc = encode_entries(std::slice::from_ref(&a));
        assert_eq!(decode_entries(key, &enc, 0).ok(), Some(vec![a.clone()]));
        for cut in 0..enc.len() {
            assert!(decode_entries(key, &enc[..cut], 0).is_err(), "cut {cut}");
        }
        // A name that does not hash to the key is refused.
        assert!(decode_entries(entry_key(1, b"other"), &enc, 0).is_err());
        let ik = index_key(1, 9);
        assert_eq!(decode_index(ik, &encode_index(&b), 0).ok(), Some(b));
    }

    #[test]
    fn names() {
        assert!(check_name(b"ok").is_ok());
        for bad in [&b""[..], b".", b"..", b"a/b", b"a\0b"] {
            assert!(check_name(bad).is_err());
        }
        assert!(matches!(check_name(&[b'a'; 256]), Err(Error::NameTooLong { .. })));
    }
}
