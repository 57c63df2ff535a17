//! The durable session record: what a restarted server knows of each client's session
//! (docs/format.md's SESSION items), and the marker of a fenced one.

use super::*;

/// The most places a session record lists as holes (changes that waited while later ones
/// ran). Only changes parked behind another session's exclusive rights leave one: a
/// client's synchronous calls, a handful at a time.
pub(super) const MAX_RECORD_HOLES: usize = 64;

/// Ranges of granted inode numbers a record keeps (the most recent; a session holds at
/// most this many, `MAX_GRANTED_RANGES`).
pub(super) const MAX_RECORD_GRANTS: usize = 16;

/// Longest client identity a record keeps (whole: a resume is checked against it). The
/// server's certificate names are far shorter; a longer identity gets no session.
pub(super) const MAX_RECORD_IDENTITY: usize = 255;

/// Longest client name a record keeps (status and logs only: cut to fit).
const MAX_RECORD_NAME: usize = 200;

/// A session's durable record: the token, how far its changes have run and are durable
/// (the highest `seq` that ran, and the places below it whose changes had not), its
/// dataset, the inode numbers granted to it and not yet used, its name, and the client
/// identity that made it (only that one may resume it). Layout: version 4 (u8), secret
/// (u64 LE), seq (u64 LE), dataset id (u64 LE), hole count (u8), holes (u64 LE each),
/// grant count (u8), grants (first u64 LE, count u32 LE each), name length (u8), name,
/// identity length (u8), identity. The name is cut to keep the record within
/// `MAX_SESSION_RECORD_BYTES`. (Version 3 had no identity, and is still written for a
/// session restored from one whose client has not come back; version 2 had no dataset,
/// the default one, and no grants: a session restored from it may use any reserved,
/// unused number; version 1 had no holes either.)
/// Whether records keep the identity (version 4). Not yet: the previous release refuses a
/// version-4 record, and a server downgraded under its mounts would forget their sessions
/// (their clients would send acknowledged work again). Until it reads them, a session
/// restored after a restart is bound to the identity that first resumes it; a running
/// one, to the identity that made it.
pub(super) const WRITE_IDENTITY: bool = false;

pub(super) fn encode_record(r: &Record) -> Vec<u8> {
    let holes = &r.holes[..r.holes.len().min(MAX_RECORD_HOLES)];
    let grants = r.grants.as_deref().unwrap_or_default();
    let grants = &grants[grants.len().saturating_sub(MAX_RECORD_GRANTS)..];
    let identity = r.identity.as_deref().map(|i| &i.as_bytes()[..i.len().min(MAX_RECORD_IDENTITY)]);
    let fixed = 28 + 8 * holes.len() + 12 * grants.len() + identity.map_or(0, |i| 1 + i.len());
    let room = s::sessions::MAX_SESSION_RECORD_BYTES.saturating_sub(fixed);
    let name = &r.name.as_bytes()[..r.name.len().min(MAX_RECORD_NAME).min(room)];
    let mut out = Vec::with_capacity(fixed + name.len());
    out.push(if identity.is_some() { 4 } else { 3 });
    out.extend_from_slice(&r.secret.to_le_bytes());
    out.extend_from_slice(&r.seq.to_le_bytes());
    out.extend_from_slice(&r.dataset.to_le_bytes());
    out.push(holes.len() as u8);
    for h in holes {
        out.extend_from_slice(&h.to_le_bytes());
    }
    out.push(grants.len() as u8);
    for g in grants {
        let count = u32::try_from(g.end.saturating_sub(g.start)).unwrap_or(u32::MAX);
        out.extend_from_slice(&g.start.to_le_bytes());
        out.extend_from_slice(&count.to_le_bytes());
    }
    out.push(name.len() as u8);
    out.extend_from_slice(name);
    if let Some(identity) = identity {
        out.push(identity.len() as u8);
        out.extend_from_slice(identity);
    }
    out
}

/// The first byte of the record a fenced session leaves in place of its own (then its
/// secret, u64 LE): so that a restarted server still tells its client, when it comes back,
/// that the session was fenced — else the client, its session merely unknown, would send
/// its unanswered work again in a new one (docs/protocol.md §4.4).
pub(super) const FENCED_MARKER: u8 = 0xfe;

pub(super) fn encode_fenced_marker(secret: u64) -> Vec<u8> {
    let mut out = vec![FENCED_MARKER];
    out.extend_from_slice(&secret.to_le_bytes());
    out
}

pub(super) fn is_fenced_marker(b: &[u8]) -> bool {
    b.len() == 9 && b[0] == FENCED_MARKER
}

/// A decoded session record.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) struct Record {
    pub(super) secret: u64,
    pub(super) seq: u64,
    pub(super) dataset: u64,
    pub(super) holes: Vec<u64>,
    /// `None` from a version 2 or 1 record, which kept no grants.
    pub(super) grants: Option<Vec<std::ops::Range<u64>>>,
    pub(super) name: String,
    /// `None` from a version 3, 2 or 1 record, which kept no identity.
    pub(super) identity: Option<String>,
}

/// Decodes a session record; `None` for anything malformed (such a record is dropped).
pub(super) fn decode_record(b: &[u8]) -> Option<Record> {
    decode_with_raw_name(b).map(|(r, _)| r)
}

/// `decode_record`, and the name's bytes as stored (a name cut at 200 bytes inside a
/// character is read lossily, so that its session is still restored).
fn decode_with_raw_name(b: &[u8]) -> Option<(Record, &[u8])> {
    let (&version, rest) = b.split_first()?;
    // (No record the store holds is longer; the encoder cuts names to fit.)
    if !(1..=4).contains(&version) || rest.len() < 17 || b.len() > s::sessions::MAX_SESSION_RECORD_BYTES {
        return None;
    }
    let secret = u64::from_le_bytes(rest[0..8].try_into().ok()?);
    let seq = u64::from_le_bytes(rest[8..16].try_into().ok()?);
    let mut rest = &rest[16..];
    let mut dataset = 0;
    if version >= 3 {
        dataset = u64::from_le_bytes(rest.get(..8)?.try_into().ok()?);
        rest = &rest[8..];
    }
    let mut holes = Vec::new();
    if version >= 2 {
        let (&n, after) = rest.split_first()?;
        if usize::from(n) > MAX_RECORD_HOLES || after.len() < 8 * usize::from(n) {
            return None;
        }
        for i in 0..usize::from(n) {
            holes.push(u64::from_le_bytes(after[8 * i..8 * i + 8].try_into().ok()?));
        }
        rest = &after[8 * usize::from(n)..];
    }
    let mut grants = None;
    if version >= 3 {
        let (&n, after) = rest.split_first()?;
        let n = usize::from(n);
        if n > MAX_RECORD_GRANTS || after.len() < 12 * n {
            return None;
        }
        let mut g = Vec::with_capacity(n);
        for i in 0..n {
            let first = u64::from_le_bytes(after[12 * i..12 * i + 8].try_into().ok()?);
            let count = u32::from_le_bytes(after[12 * i + 8..12 * i + 12].try_into().ok()?);
            g.push(first..first.checked_add(u64::from(count))?);
        }
        grants = Some(g);
        rest = &after[12 * n..];
    }
    let (&len, after) = rest.split_first()?;
    let name = after.get(..usize::from(len))?;
    let rest = &after[usize::from(len)..];
    let mut identity = None;
    if version == 4 {
        // (Kept exactly, unlike the name: a damaged one drops the record.)
        let (&len, i) = rest.split_first()?;
        if i.len() != usize::from(len) {
            return None;
        }
        identity = Some(String::from_utf8(i.to_vec()).ok()?);
    } else if !rest.is_empty() {
        return None;
    }
    if holes.iter().any(|&h| h == 0 || h >= seq) {
        return None;
    }
    let r = Record { secret, seq, dataset, holes, grants, name: String::from_utf8_lossy(name).into_owned(), identity };
    Some((r, name))
}

/// See `crate::fuzzing::session_record`.
pub(crate) fn fuzz_record(b: &[u8]) -> bool {
    let Some((r, raw_name)) = decode_with_raw_name(b) else { return false };
    assert!(r.holes.iter().all(|&h| h > 0 && h < r.seq), "{r:?}");
    // (Only a version 3 or 4 record whose name was whole UTF-8 encodes back byte for byte.)
    if b[0] >= 3 && raw_name == r.name.as_bytes() && r.name.len() <= MAX_RECORD_NAME {
        let again = encode_record(&r);
        assert_eq!(again, b, "a record decodes to what encodes it");
    }
    true
}

impl Server {
    /// A session that changes something or takes a lock gets a durable record if it has
    /// none yet, so that after a restart it is restored and the grace period waits for its
    /// client: to replay its acknowledged changes, to take its locks again. Committed at
    /// once (once per session): a crash before the next periodic commit must not lose the
    /// record while the client holds a lock or an acknowledged change.
    pub(super) fn record_session(&mut self, session: SessionId, what: &str) {
        let Some(s) = self.sessions.get_mut(&session) else { return };
        if s.recorded {
            return;
        }
        s.recorded = true;
        // No unit is open here (a changing request calls this before its unit begins),
        // so this commit never cuts a unit in two.
        let record = encode_record(&s.record());
        if let Err(e) = self.store.put_session_record(session, &record).and_then(|()| self.store.commit()) {
            tracing::error!(session, "cannot record the session of {what}: {e}");
        }
        // What was applied before is durable now; what the caller applies next is not.
        self.note_commits();
    }
}
