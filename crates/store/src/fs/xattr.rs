//! XATTR items: keyed by the name's hash; colliding names share one item.
//! Value: repeated `[name_len u8][value_len u16][name][value]`.

use crate::error::{Error, Result};
use crate::key::{kind, name_hash, Key};
use crate::limits::{XATTR_NAME_MAX, XATTR_SIZE_MAX};

/// Key of the item holding xattr `name` of `ino`.
pub fn xattr_key(ino: u64, name: &[u8]) -> Key {
    Key::new(ino, kind::XATTR, name_hash(name))
}

/// Checks a name and value a caller gave.
pub fn check(name: &[u8], value_len: usize) -> Result<()> {
    if name.is_empty() || name.contains(&0) {
        return Err(Error::Invalid("empty xattr name".into()));
    }
    if name.len() > XATTR_NAME_MAX {
        return Err(Error::NameTooLong { len: name.len(), max: XATTR_NAME_MAX });
    }
    if name.len() + value_len > XATTR_SIZE_MAX {
        return Err(Error::TooBig(format!(
            "xattr of {} bytes (max {XATTR_SIZE_MAX} for name and value)",
            name.len() + value_len
        )));
    }
    Ok(())
}

/// Encodes (name, value) pairs sharing one item.
pub fn encode(pairs: &[(Vec<u8>, Vec<u8>)]) -> Vec<u8> {
    let mut out = Vec::new();
    for (n, v) in pairs {
        out.push(n.len() as u8);
        out.extend_from_slice(&(v.len() as u16).to_le_bytes());
        out.extend_from_slice(n);
        out.extend_from_slice(v);
    }
    out
}

/// Decodes and validates an XATTR item.
pub fn decode(key: Key, b: &[u8], block: u64) -> Result<Vec<(Vec<u8>, Vec<u8>)>> {
    let mut at = 0;
    let mut out = Vec::new();
    while at < b.len() {
        if b.len() - at < 3 {
            return Err(Error::bad_item(key, block, "truncated xattr header"));
        }
        let nl = usize::from(b[at]);
        let vl = usize::from(u16::from_le_bytes([b[at + 1], b[at + 2]]));
        let start = at + 3;
        if nl == 0 || b.len() - start < nl + vl {
            return Err(Error::bad_item(key, block, "xattr runs past the item"));
        }
        let name = b[start..start + nl].to_vec();
        if name.contains(&0) {
            return Err(Error::bad_item(key, block, "xattr name contains NUL"));
        }
        if name_hash(&name) != key.offset {
            return Err(Error::bad_item(key, block, "xattr name does not hash to the key"));
        }
        out.push((name, b[start + nl..start + nl + vl].to_vec()));
        at = start + nl + vl;
    }
    if out.is_empty() {
        return Err(Error::bad_item(key, block, "empty xattr item"));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn roundtrip_and_truncation() {
        let pairs = vec![(b"user.a".to_vec(), b"value".to_vec())];
        let key = xattr_key(5, b"user.a");
        let enc = encode(&pairs);
        assert_eq!(decode(key, &enc, 0).ok(), Some(pairs));
        for cut in 0..enc.len() {
            assert!(decode(key, &enc[..cut], 0).is_err());
        }
        assert!(check(b"user.x", XATTR_SIZE_MAX).is_err());
        assert!(check(b"", 1).is_err());
    }
}
