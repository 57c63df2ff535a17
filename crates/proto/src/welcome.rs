//! A welcome's encoding, which follows its version field: the server answers each client in
//! the version they agreed (`agree_version`), and a client of an older release must decode
//! it with the layout it knows. The fields go in declaration order, as postcard lays out a
//! struct; those a version added follow those of the versions before, and a decoder reads
//! them only when the welcome's version has them. Every other message has one layout in
//! every version the range covers.
//!
//! Invariant: a welcome of version `v` encodes exactly the fields of version `v`, byte for
//! byte what the release that introduced `v` wrote (the tests pin version 13's bytes).

use std::fmt;

use serde::de::{self, SeqAccess, Visitor};
use serde::ser::SerializeTuple;
use serde::{Deserialize, Deserializer, Serialize, Serializer};

use crate::{IdentityMap, SessionToken, Welcome, PROTOCOL_WELCOME_NAMES_RELEASE};

/// Fields of a version-13 welcome.
const FIELDS_13: usize = 9;

impl Serialize for Welcome {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let names_release = self.version >= PROTOCOL_WELCOME_NAMES_RELEASE;
        let mut t = s.serialize_tuple(FIELDS_13 + usize::from(names_release))?;
        t.serialize_element(&self.version)?;
        t.serialize_element(&self.session)?;
        t.serialize_element(&self.resumed)?;
        t.serialize_element(&self.durable_seq)?;
        t.serialize_element(&self.durable_holes)?;
        t.serialize_element(&self.fsid)?;
        t.serialize_element(&self.fenced)?;
        t.serialize_element(&self.noatime)?;
        t.serialize_element(&self.identity)?;
        if names_release {
            t.serialize_element(&self.server_release)?;
        }
        t.end()
    }
}

impl<'de> Deserialize<'de> for Welcome {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_tuple(FIELDS_13 + 1, WelcomeVisitor)
    }
}

struct WelcomeVisitor;

fn next<'de, T: Deserialize<'de>, A: SeqAccess<'de>>(seq: &mut A, what: &'static str) -> Result<T, A::Error> {
    seq.next_element()?.ok_or_else(|| de::Error::custom(format!("welcome without {what}")))
}

impl<'de> Visitor<'de> for WelcomeVisitor {
    type Value = Welcome;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a welcome")
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Welcome, A::Error> {
        let version: u32 = next(&mut seq, "version")?;
        let session: SessionToken = next(&mut seq, "session")?;
        let resumed = next(&mut seq, "resumed")?;
        let durable_seq = next(&mut seq, "durable_seq")?;
        let durable_holes = next(&mut seq, "durable_holes")?;
        let fsid = next(&mut seq, "fsid")?;
        let fenced = next(&mut seq, "fenced")?;
        let noatime = next(&mut seq, "noatime")?;
        let identity: IdentityMap = next(&mut seq, "identity")?;
        let server_release =
            if version >= PROTOCOL_WELCOME_NAMES_RELEASE { next(&mut seq, "server_release")? } else { String::new() };
        Ok(Welcome {
            version,
            session,
            resumed,
            durable_seq,
            durable_holes,
            fsid,
            fenced,
            noatime,
            identity,
            server_release,
        })
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use crate::{decode_frame, encode_frame, ServerMessage, FRAME_HEADER_BYTES};

    /// Version 13's welcome as the release that spoke only 13 declared it (derived serde,
    /// fields in this order): what an older client decodes.
    #[derive(Debug, PartialEq, Serialize, Deserialize)]
    struct Welcome13 {
        version: u32,
        session: SessionToken,
        resumed: bool,
        durable_seq: Option<u64>,
        durable_holes: Vec<u64>,
        fsid: [u8; 16],
        fenced: bool,
        noatime: bool,
        identity: IdentityMap,
    }
    #[derive(Debug, PartialEq, Serialize, Deserialize)]
    enum ServerMessage13 {
        Welcome(Welcome13),
    }

    fn welcome(version: u32, seed: u64) -> Welcome {
        Welcome {
            version,
            session: SessionToken { id: seed % 1000, secret: seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) },
            resumed: seed.is_multiple_of(2),
            durable_seq: (!seed.is_multiple_of(3)).then_some(seed >> 3),
            durable_holes: (0..seed % 5).map(|i| i * 7 + seed % 11).collect(),
            fsid: [(seed % 256) as u8; 16],
            fenced: seed.is_multiple_of(7),
            noatime: seed % 4 == 1,
            identity: IdentityMap { root_squash: seed % 2 == 1, anon_uid: seed as u32, ..IdentityMap::default() },
            server_release: format!("crest test ({seed:x})"),
        }
    }

    fn frame(m: &impl Serialize) -> Vec<u8> {
        let mut out = Vec::new();
        encode_frame(m, &mut out).unwrap();
        out.split_off(FRAME_HEADER_BYTES)
    }

    #[test]
    fn a_version_13_welcome_is_the_bytes_the_release_that_spoke_13_wrote_and_read() {
        for seed in [0u64, 1, 2, 6, 7, 12345, u64::MAX] {
            let w = welcome(13, seed);
            let old = Welcome13 {
                version: 13,
                session: w.session,
                resumed: w.resumed,
                durable_seq: w.durable_seq,
                durable_holes: w.durable_holes.clone(),
                fsid: w.fsid,
                fenced: w.fenced,
                noatime: w.noatime,
                identity: w.identity.clone(),
            };
            let ours = frame(&ServerMessage::Welcome(w.clone()));
            assert_eq!(ours, frame(&ServerMessage13::Welcome(old)), "seed {seed}");
            // An old server's welcome reads back as version 13 with no release named.
            let back: ServerMessage = decode_frame(&ours).unwrap();
            assert_eq!(back, ServerMessage::Welcome(Welcome { server_release: String::new(), ..w }), "seed {seed}");
        }
    }

    #[test]
    fn a_newer_welcome_round_trips_and_an_older_decoder_refuses_it() {
        for seed in [0u64, 3, 99, 1 << 40] {
            let w = welcome(14, seed);
            let bytes = frame(&ServerMessage::Welcome(w.clone()));
            assert_eq!(decode_frame::<ServerMessage>(&bytes).unwrap(), ServerMessage::Welcome(w), "seed {seed}");
            // (A client of 13 never gets one: the server answers it in 13. Were it sent,
            // the trailing release is refused, not misread.)
            assert!(decode_frame::<ServerMessage13>(&bytes).is_err(), "seed {seed}");
        }
    }

    #[test]
    fn a_welcome_cut_short_or_lengthened_does_not_decode() {
        for version in [13, 14] {
            let bytes = frame(&ServerMessage::Welcome(welcome(version, 42)));
            for cut in 0..bytes.len() {
                assert!(decode_frame::<ServerMessage>(&bytes[..cut]).is_err(), "version {version} cut {cut}");
            }
            let mut longer = bytes.clone();
            longer.push(0);
            assert!(decode_frame::<ServerMessage>(&longer).is_err(), "version {version}");
        }
    }
}
