//! File data on the wire carries its CRC-32C: the sender computes it as it encodes the
//! bytes (a client for a write, the server for a read's reply, right after the store
//! verified the blocks against their own checksums) and the receiver's decoder verifies it
//! before anything uses them. A mismatch is a frame that does not decode: the connection is
//! closed and the request resent from the sender's copy, so bytes damaged between the two
//! ends (a NIC, a middlebox, a plain-TCP link whose 16-bit checksum missed it) never reach
//! the disk or a page cache.
//!
//! Encoding: the bytes as before (postcard: varint length, bytes), then the u32 CRC-32C
//! of them (postcard varint). Used with `#[serde(with = "crate::checked")]`. The CRC is
//! `crc-fast`'s (carry-less multiply), as the store's block checksums are: it runs over
//! every byte of every write and read on both ends.

use std::fmt;

use serde::de::{Error as _, SeqAccess, Visitor};
use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// Writes `data` and its CRC-32C.
pub fn serialize<S: Serializer>(data: &[u8], s: S) -> Result<S::Ok, S::Error> {
    (Bytes(data), crc_fast::crc32_iscsi(data)).serialize(s)
}

/// Reads bytes and their CRC-32C; refuses them if the CRC does not match.
pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<u8>, D::Error> {
    let (OwnedBytes(data), sent): (OwnedBytes, u32) = Deserialize::deserialize(d)?;
    let found = crc_fast::crc32_iscsi(&data);
    if found != sent {
        return Err(D::Error::custom(format!(
            "file data checksum mismatch: sent {sent:#010x}, received bytes sum to {found:#010x}"
        )));
    }
    Ok(data)
}

/// Bytes as one block (`serialize_bytes`): the same encoding as a sequence of u8 in
/// postcard (a length, then the bytes), without a call per byte.
struct Bytes<'a>(&'a [u8]);

impl Serialize for Bytes<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_bytes(self.0)
    }
}

/// What `Bytes` wrote, read back as one block.
struct OwnedBytes(Vec<u8>);

impl<'de> Deserialize<'de> for OwnedBytes {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = OwnedBytes;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("file data bytes")
            }
            fn visit_bytes<E: serde::de::Error>(self, v: &[u8]) -> Result<OwnedBytes, E> {
                Ok(OwnedBytes(v.to_vec()))
            }
            fn visit_byte_buf<E: serde::de::Error>(self, v: Vec<u8>) -> Result<OwnedBytes, E> {
                Ok(OwnedBytes(v))
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<OwnedBytes, A::Error> {
                // (Formats without a bytes type; postcard never calls this.)
                let mut v = Vec::with_capacity(seq.size_hint().unwrap_or(0).min(1 << 16));
                while let Some(b) = seq.next_element::<u8>()? {
                    v.push(b);
                }
                Ok(OwnedBytes(v))
            }
        }
        d.deserialize_byte_buf(V)
    }
}

/// Bytes that carry their own checks (administrative calls: name-value lists, send
/// streams), written and read as one block: `#[serde(with = "crate::checked::plain")]`.
/// The encoding is postcard's for a `Vec<u8>`, so the wire does not change.
pub mod plain {
    use super::*;

    /// Writes `data` as one block.
    pub fn serialize<S: Serializer>(data: &[u8], s: S) -> Result<S::Ok, S::Error> {
        Bytes(data).serialize(s)
    }

    /// Reads what `serialize` wrote.
    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<u8>, D::Error> {
        let OwnedBytes(data) = Deserialize::deserialize(d)?;
        Ok(data)
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    #[test]
    fn the_checksum_is_crc32c() {
        // Seeded and printed: lengths and offsets that straddle the fast path's blocks.
        let seed = crest_rng::next_u64();
        eprintln!("seed {seed}");
        let mut rng = crest_rng::Stream::from_seed_u64(seed);
        let mut buf = vec![0u8; 70_000];
        rng.fill_bytes(&mut buf);
        for _ in 0..200 {
            let start = rng.below(64) as usize;
            let len = rng.below(buf.len() as u64 - 64) as usize;
            let data = &buf[start..start + len];
            assert_eq!(crc_fast::crc32_iscsi(data), crc32c::crc32c(data), "seed {seed}: {start}+{len}");
        }
        assert_eq!(crc_fast::crc32_iscsi(b"123456789"), 0xE306_9283);
    }

    #[test]
    fn plain_bytes_are_encoded_as_a_vec_of_bytes_was() {
        for len in [0usize, 1, 127, 128, 300, 70_000] {
            let call: Vec<u8> = (0..len).map(|i| (i * 7) as u8).collect();
            let admin = crate::Admin { magic: crate::HELLO_MAGIC, version: 3, call: call.clone() };
            let new = postcard::to_allocvec(&admin).unwrap();
            let old = postcard::to_allocvec(&(crate::HELLO_MAGIC, 3u32, call.clone())).unwrap();
            assert_eq!(new, old, "len {len}");
            let back: crate::Admin = postcard::from_bytes(&new).unwrap();
            assert_eq!(back.call, call);
        }
    }
}
