//! Frames: a little-endian u32 length, then a postcard message of that many bytes.
//!
//! Invariants:
//! - a length above `MAX_FRAME_BYTES` is an error before any byte of the body is buffered,
//!   so a peer cannot make us allocate more than one frame's worth;
//! - a decoded frame must consume its body exactly (no trailing bytes);
//! - the decoder never panics on any input (fuzzed: `fuzz/fuzz_targets/decode_frame.rs`).

use serde::{de::DeserializeOwned, Serialize};

/// Bytes of the length prefix.
pub const FRAME_HEADER_BYTES: usize = 4;
/// Largest frame body: a 4 MiB write plus room for its envelope.
pub const MAX_FRAME_BYTES: usize = (4 << 20) + 64 * 1024;

/// A protocol violation; the connection that caused it is closed.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[non_exhaustive]
pub enum ProtoError {
    /// The length prefix exceeds the limit.
    #[error("frame of {len} bytes exceeds the limit of {max}")]
    TooLarge {
        /// Announced length.
        len: usize,
        /// Limit.
        max: usize,
    },
    /// The body is not a valid message.
    #[error("malformed frame of {len} bytes: {detail}")]
    Malformed {
        /// Body length.
        len: usize,
        /// What postcard said.
        detail: String,
    },
    /// The peer sent an encoding we cannot produce (a bug on our side).
    #[error("cannot encode message: {0}")]
    Encode(String),
}

/// Encodes one message as a frame appended to `out`.
pub fn encode_frame<T: Serialize>(msg: &T, out: &mut Vec<u8>) -> Result<(), ProtoError> {
    let start = out.len();
    out.extend_from_slice(&[0; FRAME_HEADER_BYTES]);
    let body = postcard::to_extend(msg, std::mem::take(out)).map_err(|e| ProtoError::Encode(e.to_string()))?;
    *out = body;
    let len = out.len() - start - FRAME_HEADER_BYTES;
    if len > MAX_FRAME_BYTES {
        out.truncate(start);
        return Err(ProtoError::TooLarge { len, max: MAX_FRAME_BYTES });
    }
    out[start..start + FRAME_HEADER_BYTES].copy_from_slice(&(len as u32).to_le_bytes());
    Ok(())
}

/// The bytes `msg` takes encoded (a frame body's length), counted without encoding it;
/// `usize::MAX` if it cannot be encoded.
pub fn encoded_len<T: Serialize + ?Sized>(msg: &T) -> usize {
    postcard::serialize_with_flavor(msg, postcard::ser_flavors::Size::default()).unwrap_or(usize::MAX)
}

/// Decodes a frame body.
pub fn decode_frame<T: DeserializeOwned>(body: &[u8]) -> Result<T, ProtoError> {
    let (msg, rest) = postcard::take_from_bytes(body)
        .map_err(|e| ProtoError::Malformed { len: body.len(), detail: e.to_string() })?;
    if !rest.is_empty() {
        return Err(ProtoError::Malformed { len: body.len(), detail: format!("{} trailing bytes", rest.len()) });
    }
    Ok(msg)
}

/// Incremental decoder over a byte stream.
///
/// Decoded frames are not cut off the front of the buffer one by one (each cut would
/// shift everything behind it: quadratic in the frames of one read, which a peer sending
/// tiny frames turns into a stall of the server's one thread). A read offset moves
/// instead, and the undecoded tail is shifted to the front only when new bytes come and
/// the consumed prefix is at least as long as the tail: each byte is shifted at most once
/// per byte consumed before it, so the work stays linear in the bytes fed
/// (`bytes_moved`). A reader reads into the buffer itself (`spare` or `read_room`, then
/// `filled`): a big write's bytes are not copied once more on their way in.
///
/// `read_room` sizes each read by the last ones: it doubles while reads fill it (up to the
/// caller's maximum) and halves when they bring less than a quarter, and an empty decoder
/// whose reads are small again gives its memory back. A connection that moves big writes
/// reads in big bites; an idle one, or one of small requests, holds `MIN_READ_BYTES`.
#[derive(Debug, Default)]
pub struct FrameDecoder {
    /// Initialised storage: `start..end` holds the bytes not yet decoded, `end..` room.
    buf: Vec<u8>,
    /// Start of the bytes not yet decoded.
    start: usize,
    /// End of the bytes fed.
    end: usize,
    /// Bytes shifted by compaction so far.
    moved: u64,
    /// What `read_room` gives next (0: `MIN_READ_BYTES`).
    read_size: usize,
    /// What the last `read_room` gave, until `filled` says how much came.
    asked: usize,
}

/// The smallest read `FrameDecoder::read_room` asks for.
pub const MIN_READ_BYTES: usize = 16 * 1024;

impl FrameDecoder {
    /// An empty decoder.
    pub fn new() -> FrameDecoder {
        FrameDecoder::default()
    }

    /// Adds bytes read from the peer.
    pub fn handle_bytes(&mut self, bytes: &[u8]) {
        self.spare(bytes.len())[..bytes.len()].copy_from_slice(bytes);
        self.filled(bytes.len());
    }

    /// Room for `want` bytes behind those buffered, to read into; `filled` says how many
    /// came. (Compacts first, by the rule above; grows the buffer, zeroing only what it
    /// had never used.)
    pub fn spare(&mut self, want: usize) -> &mut [u8] {
        if self.start == self.end {
            self.start = 0;
            self.end = 0;
        } else if self.start > 0 && self.start >= self.end - self.start {
            let tail = self.end - self.start;
            self.buf.copy_within(self.start..self.end, 0);
            self.start = 0;
            self.end = tail;
            self.moved += tail as u64;
        }
        let need = self.end.saturating_add(want);
        if self.buf.len() < need {
            self.buf.resize(need, 0);
        }
        &mut self.buf[self.end..need]
    }

    /// Room for the next read, sized by the reads before it (see the type's doc), at most
    /// `max` bytes; `filled` says how many came.
    pub fn read_room(&mut self, max: usize) -> &mut [u8] {
        let least = MIN_READ_BYTES.min(max);
        let want = self.read_size.clamp(least, max.max(least));
        if self.start == self.end && want == least && self.buf.len() > 4 * least {
            self.buf = Vec::new();
            self.start = 0;
            self.end = 0;
        }
        self.asked = want;
        self.spare(want)
    }

    /// `n` bytes were read into the room `spare` or `read_room` gave (at most what it
    /// gave).
    pub fn filled(&mut self, n: usize) {
        self.end = self.end.saturating_add(n).min(self.buf.len());
        let asked = std::mem::take(&mut self.asked);
        if asked > 0 {
            self.read_size = if n >= asked {
                asked.saturating_mul(2)
            } else if n < asked / 4 {
                asked / 2
            } else {
                asked
            };
        }
    }

    /// Bytes of memory the decoder holds (for tests: an idle connection holds little).
    pub fn capacity(&self) -> usize {
        self.buf.capacity()
    }

    /// Bytes buffered and not yet decoded.
    pub fn buffered(&self) -> usize {
        self.end - self.start
    }

    /// Bytes shifted inside the buffer so far: at most the bytes fed (for tests and the
    /// fuzzer, which check that decoding stays linear).
    pub fn bytes_moved(&self) -> u64 {
        self.moved
    }

    /// The next complete message, `Ok(None)` if more bytes are needed.
    pub fn poll_message<T: DeserializeOwned>(&mut self) -> Result<Option<T>, ProtoError> {
        let pending = &self.buf[self.start..self.end];
        let Some(header) = pending.first_chunk::<FRAME_HEADER_BYTES>() else {
            return Ok(None);
        };
        let len = u32::from_le_bytes(*header) as usize;
        if len > MAX_FRAME_BYTES {
            return Err(ProtoError::TooLarge { len, max: MAX_FRAME_BYTES });
        }
        let Some(body) = pending.get(FRAME_HEADER_BYTES..FRAME_HEADER_BYTES + len) else {
            return Ok(None);
        };
        let msg = decode_frame(body);
        self.start += FRAME_HEADER_BYTES + len;
        msg.map(Some)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::message::*;

    fn sample() -> ClientMessage {
        ClientMessage::Request(Request {
            id: 77,
            ops: vec![
                Op::Lookup { parent: 1, name: b"hello".to_vec() },
                Op::Write { ino: 9, offset: 4096, data: vec![7; 1000] },
                Op::Rename { parent: 1, name: b"a".to_vec(), new_parent: 2, new_name: b"b".to_vec(), flags: 1 },
                Op::SetLock {
                    ino: 9,
                    owner: u64::MAX - 1,
                    start: 10,
                    end: LOCK_TO_EOF,
                    kind: LockKind::Write,
                    flock: false,
                    pid: 4242,
                },
            ],
            time: Some(Time { sec: 5, nsec: 6 }),
            caller: Caller { uid: 1000, gid: 100, groups: vec![4, 27] },
        })
    }

    /// Reads from `wire` as a socket would: at most `room` bytes, and at most `avail` of
    /// them (what has arrived).
    fn read_into(room: &mut [u8], wire: &[u8], at: &mut usize, avail: usize) -> usize {
        let n = room.len().min(avail).min(wire.len() - *at);
        room[..n].copy_from_slice(&wire[*at..*at + n]);
        *at += n;
        n
    }

    #[test]
    fn read_room_grows_with_big_reads_and_an_idle_decoder_gives_its_memory_back() {
        let max = 256 * 1024;
        let big = ClientMessage::Request(Request {
            id: 1,
            ops: vec![Op::Write { ino: 9, offset: 0, data: vec![7; 3 << 20] }],
            time: None,
            caller: Caller::default(),
        });
        let mut wire = Vec::new();
        encode_frame(&big, &mut wire).expect("encode");
        let mut d = FrameDecoder::new();
        let (mut at, mut rooms) = (0, Vec::new());
        while at < wire.len() {
            let room = d.read_room(max);
            rooms.push(room.len());
            let n = read_into(room, &wire, &mut at, usize::MAX);
            d.filled(n);
        }
        assert_eq!(rooms[0], MIN_READ_BYTES, "a new connection starts small");
        assert!(rooms.windows(2).all(|w| w[1] == (w[0] * 2).min(max)), "doubles while reads fill it: {rooms:?}");
        assert_eq!(d.poll_message::<ClientMessage>().expect("decode"), Some(big));
        // Then small requests only: reads shrink back, and the empty decoder lets go.
        let mut small = Vec::new();
        encode_frame(&ClientMessage::Goodbye, &mut small).expect("encode");
        for _ in 0..12 {
            let mut at = 0;
            let room = d.read_room(max);
            let n = read_into(room, &small, &mut at, usize::MAX);
            d.filled(n);
            assert_eq!(d.poll_message::<ClientMessage>().expect("decode"), Some(ClientMessage::Goodbye));
        }
        assert_eq!(d.read_room(max).len(), MIN_READ_BYTES);
        assert!(d.capacity() <= 4 * MIN_READ_BYTES, "an idle decoder holds {} bytes", d.capacity());
    }

    #[test]
    fn frames_come_out_whole_whatever_the_reads_bring() {
        // Seeded, printed: frames of random sizes, read as random amounts arrive.
        let seed = std::env::var("CREST_CODEC_SEED").ok().and_then(|s| s.parse().ok()).unwrap_or_else(|| {
            std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(1, |d| d.as_nanos() as u64)
        });
        println!("CREST_CODEC_SEED={seed}");
        let mut x = seed | 1;
        let mut next = |bound: u64| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x % bound
        };
        let mut sent = Vec::new();
        let mut wire = Vec::new();
        for id in 0..200 {
            let len = match next(4) {
                0 => next(64),
                1 => next(20_000),
                2 => next(300_000),
                _ => 1 << next(22),
            } as usize;
            let m = ClientMessage::Request(Request {
                id,
                ops: vec![Op::Write { ino: id, offset: 0, data: vec![id as u8; len] }],
                time: None,
                caller: Caller::default(),
            });
            encode_frame(&m, &mut wire).expect("encode");
            sent.push(m);
        }
        let mut d = FrameDecoder::new();
        let (mut at, mut got) = (0, Vec::new());
        while at < wire.len() {
            let max = [4096, MIN_READ_BYTES, 256 * 1024][next(3) as usize];
            let avail = 1 + next(400_000) as usize;
            let room = d.read_room(max);
            assert!(room.len() <= max.max(MIN_READ_BYTES.min(max)), "room {} over {max}", room.len());
            let n = read_into(room, &wire, &mut at, avail);
            d.filled(n);
            while let Some(m) = d.poll_message::<ClientMessage>().expect("decode") {
                got.push(m);
            }
        }
        assert_eq!(got.len(), sent.len(), "seed {seed}");
        assert!(got == sent, "seed {seed}: a frame came out changed");
        assert!(d.bytes_moved() <= wire.len() as u64, "seed {seed}: compaction not linear");
    }

    #[test]
    fn roundtrip_byte_by_byte() {
        let mut wire = Vec::new();
        encode_frame(&sample(), &mut wire).expect("encode");
        encode_frame(&ClientMessage::Goodbye, &mut wire).expect("encode");
        let mut d = FrameDecoder::new();
        let mut got = Vec::new();
        for b in &wire {
            d.handle_bytes(&[*b]);
            while let Some(m) = d.poll_message::<ClientMessage>().expect("decode") {
                got.push(m);
            }
        }
        assert_eq!(got, vec![sample(), ClientMessage::Goodbye]);
        assert_eq!(d.buffered(), 0);
    }

    /// Flips bits of the file data inside an encoded frame and expects the decoder to refuse
    /// the frame (the bytes are opaque: without their checksum it would decode, wrong).
    fn damaged_data_is_refused<T: serde::de::DeserializeOwned + Serialize>(msg: &T, data: &[u8]) {
        let mut wire = Vec::new();
        encode_frame(msg, &mut wire).expect("encode");
        let at = wire.windows(data.len()).position(|w| w == data).expect("the data in the frame");
        for i in [0, data.len() / 3, data.len() - 1] {
            for bit in [0, 3, 7] {
                let mut bad = wire.clone();
                bad[at + i] ^= 1 << bit;
                assert!(decode_frame::<T>(&bad[FRAME_HEADER_BYTES..]).is_err(), "byte {i} bit {bit} accepted");
            }
        }
        assert!(decode_frame::<T>(&wire[FRAME_HEADER_BYTES..]).is_ok(), "the undamaged frame decodes");
    }

    #[test]
    fn file_data_damaged_on_the_wire_is_refused_both_ways() {
        let data: Vec<u8> = (0..5000u32).map(|i| (i * 7 + 1) as u8).collect();
        let write = ClientMessage::Request(Request {
            id: 1,
            ops: vec![Op::Write { ino: 9, offset: 12, data: data.clone() }, Op::Append { ino: 9, data: data.clone() }],
            time: None,
            caller: Caller { uid: 0, gid: 0, groups: vec![] },
        });
        damaged_data_is_refused(&write, &data);
        let read = ServerMessage::Response(Response {
            id: 1,
            results: vec![Ok(Reply::Data(data.clone()))],
            seq: 0,
            durable: 0,
            time: None,
        });
        damaged_data_is_refused(&read, &data);
    }

    #[test]
    fn encoded_len_is_the_frame_bodys_length() {
        for m in [sample(), ClientMessage::Goodbye] {
            let mut wire = Vec::new();
            encode_frame(&m, &mut wire).expect("encode");
            assert_eq!(encoded_len(&m), wire.len() - FRAME_HEADER_BYTES);
        }
    }

    #[test]
    fn oversized_length_is_refused_before_buffering() {
        let mut d = FrameDecoder::new();
        d.handle_bytes(&u32::MAX.to_le_bytes());
        assert!(matches!(d.poll_message::<ClientMessage>(), Err(ProtoError::TooLarge { .. })));
    }

    #[test]
    fn truncated_and_trailing_bodies_are_malformed() {
        let mut wire = Vec::new();
        encode_frame(&sample(), &mut wire).expect("encode");
        let body = &wire[FRAME_HEADER_BYTES..];
        for cut in 0..body.len() {
            assert!(decode_frame::<ClientMessage>(&body[..cut]).is_err(), "cut {cut}");
        }
        let mut longer = body.to_vec();
        longer.push(0);
        assert!(decode_frame::<ClientMessage>(&longer).is_err());
    }

    #[test]
    fn hostile_lengths_inside_the_body_do_not_allocate() {
        // A vector length of 2^60 inside a small frame is an error, not an allocation.
        let mut body = vec![1u8]; // ClientMessage::Request
        body.push(5); // id
        body.extend_from_slice(&[0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x0f]); // ops len varint
        assert!(decode_frame::<ClientMessage>(&body).is_err());
    }

    #[test]
    fn hello_checks() {
        let mut h = Hello {
            magic: HELLO_MAGIC,
            version: PROTOCOL_VERSION,
            client_name: "t".into(),
            resume: None,
            dataset: String::new(),
        };
        assert_eq!(check_hello(&h), Ok(PROTOCOL_VERSION));
        // A newer client is answered in this server's newest version; an older one in its
        // own, down to the oldest this code speaks; one older still is refused, naming both.
        h.version = 99;
        assert_eq!(check_hello(&h), Ok(PROTOCOL_VERSION));
        h.version = OLDEST_PROTOCOL_VERSION;
        assert_eq!(check_hello(&h), Ok(OLDEST_PROTOCOL_VERSION));
        h.version = OLDEST_PROTOCOL_VERSION - 1;
        let old = (OLDEST_PROTOCOL_VERSION - 1).to_string();
        assert!(check_hello(&h).is_err_and(|e| e.contains(&old) && e.contains(&PROTOCOL_VERSION.to_string())));
        h.version = PROTOCOL_VERSION;
        h.magic = *b"HTTP";
        assert!(check_hello(&h).is_err());
    }

    #[test]
    fn a_refused_client_retries_only_in_an_older_version_it_speaks() {
        assert_eq!(retry_version(PROTOCOL_VERSION, OLDEST_PROTOCOL_VERSION), Some(OLDEST_PROTOCOL_VERSION));
        assert_eq!(retry_version(PROTOCOL_VERSION, PROTOCOL_VERSION), None, "refused for another reason");
        assert_eq!(retry_version(PROTOCOL_VERSION, PROTOCOL_VERSION + 1), None);
        assert_eq!(retry_version(PROTOCOL_VERSION, OLDEST_PROTOCOL_VERSION - 1), None, "too old for this client");
        assert_eq!(retry_version(OLDEST_PROTOCOL_VERSION, OLDEST_PROTOCOL_VERSION), None, "no loop");
        // A server that answers newer clients in its own version refused for another
        // reason: a join's token is spent, say; asking again would only hide why.
        assert_eq!(retry_version(LAST_EXACT_PROTOCOL_VERSION + 2, LAST_EXACT_PROTOCOL_VERSION + 1), None);
    }

    /// The messages by which any two releases learn each other's version keep the layout
    /// the first ranged release (13 and 14) gave them.
    #[test]
    fn the_version_handshake_messages_keep_their_layout() {
        let hello = ClientMessage::Hello(Hello {
            magic: HELLO_MAGIC,
            version: 13,
            client_name: "h".into(),
            resume: Some(SessionToken { id: 2, secret: 3 }),
            dataset: "d".into(),
        });
        let admin = ClientMessage::Admin(Admin { magic: HELLO_MAGIC, version: 13, call: vec![9] });
        let renew = ClientMessage::Renew(Renew { magic: HELLO_MAGIC, version: 16, csr: vec![8, 9] });
        let refused = ServerMessage::Refused { reason: "r".into(), version: 13 };
        let body = |m: &dyn erased::Encode| m.body();
        assert_eq!(body(&hello), [0, b'C', b'R', b'S', b'T', 13, 1, b'h', 1, 2, 3, 1, b'd']);
        assert_eq!(body(&admin)[..6], [6, b'C', b'R', b'S', b'T', 13]);
        // (From the release that added it on.)
        assert_eq!(body(&renew), [7, b'C', b'R', b'S', b'T', 16, 2, 8, 9]);
        assert_eq!(body(&refused), [1, 1, b'r', 13]);
    }

    mod erased {
        pub trait Encode {
            fn body(&self) -> Vec<u8>;
        }
        impl<T: serde::Serialize> Encode for T {
            fn body(&self) -> Vec<u8> {
                let mut out = Vec::new();
                super::encode_frame(self, &mut out).expect("encodes");
                out.split_off(super::FRAME_HEADER_BYTES)
            }
        }
    }

    #[test]
    fn client_names_are_bounded() {
        let hello = |name: String| Hello {
            magic: HELLO_MAGIC,
            version: PROTOCOL_VERSION,
            client_name: name,
            resume: None,
            dataset: String::new(),
        };
        assert!(check_hello(&hello("h".repeat(MAX_CLIENT_NAME_BYTES))).is_ok());
        assert!(check_hello(&hello(String::new())).is_ok());
        for len in [MAX_CLIENT_NAME_BYTES + 1, 4096, MAX_FRAME_BYTES - 64] {
            let refused = check_hello(&hello("h".repeat(len)));
            assert!(
                refused.as_ref().is_err_and(|r| r.len() < 200 && r.contains(&len.to_string())),
                "{len}: {refused:?}"
            );
        }
        // Counted in bytes, not characters.
        assert!(check_hello(&hello("é".repeat(MAX_CLIENT_NAME_BYTES / 2))).is_ok());
        assert!(check_hello(&hello("é".repeat(MAX_CLIENT_NAME_BYTES / 2 + 1))).is_err());
        // What a client sends is clipped to fit, at a character's edge.
        for name in ["a".repeat(1000), "é".repeat(1000), "日本".repeat(100), "short".into()] {
            let clipped = clip_client_name(&name);
            assert!(name.starts_with(&clipped) && check_hello(&hello(clipped.clone())).is_ok(), "{clipped}");
            assert!(clipped.len() + 3 > MAX_CLIENT_NAME_BYTES || clipped == name);
        }
    }

    /// A seed for a test's randomness, printed so that a failure can be replayed
    /// (`CREST_CODEC_SEED`).
    fn seed() -> u64 {
        let seed = std::env::var("CREST_CODEC_SEED").ok().and_then(|s| s.parse().ok()).unwrap_or_else(|| {
            std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(1, |d| d.as_nanos() as u64)
        });
        eprintln!("CREST_CODEC_SEED={seed}");
        seed
    }

    /// xorshift64*: enough to vary sizes and cuts.
    fn next(state: &mut u64) -> u64 {
        *state ^= *state >> 12;
        *state ^= *state << 25;
        *state ^= *state >> 27;
        state.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    #[test]
    fn a_million_tiny_frames_in_one_chunk_cost_linear_work() {
        // The smallest frame: `Goodbye` (one byte of body).
        let mut one = Vec::new();
        encode_frame(&ClientMessage::Goodbye, &mut one).expect("encode");
        let wire = one.repeat(1_000_000);
        let mut d = FrameDecoder::new();
        d.handle_bytes(&wire);
        let mut n = 0;
        while let Some(m) = d.poll_message::<ClientMessage>().expect("decode") {
            assert_eq!(m, ClientMessage::Goodbye);
            n += 1;
        }
        assert_eq!(n, 1_000_000);
        assert_eq!(d.buffered(), 0);
        // Work done beyond decoding: bytes shifted inside the buffer, at most once each.
        assert!(d.bytes_moved() <= wire.len() as u64, "{} bytes moved for {} fed", d.bytes_moved(), wire.len());
    }

    #[test]
    fn frames_of_random_sizes_in_random_chunks_cost_linear_work() {
        let mut rng = seed() | 1;
        for round in 0..8 {
            let mut wire = Vec::new();
            let mut sent = Vec::new();
            let frames = 1 + next(&mut rng) % 5_000;
            for i in 0..frames {
                // Mostly tiny frames, now and then a large write.
                let len = match next(&mut rng) % 100 {
                    0 => (next(&mut rng) % (256 << 10)) as usize,
                    1..=10 => (next(&mut rng) % 4096) as usize,
                    _ => (next(&mut rng) % 16) as usize,
                };
                let m = ClientMessage::Request(Request {
                    id: i,
                    ops: vec![Op::Write { ino: 2, offset: i, data: vec![i as u8; len] }],
                    time: None,
                    caller: Caller::default(),
                });
                encode_frame(&m, &mut wire).expect("encode");
                sent.push(m);
            }
            let mut d = FrameDecoder::new();
            let mut got = Vec::new();
            let mut rest = &wire[..];
            while !rest.is_empty() {
                let cut = match next(&mut rng) % 3 {
                    0 => 1 + next(&mut rng) % 8,
                    1 => 1 + next(&mut rng) % 4096,
                    _ => 1 + next(&mut rng) % (1 << 20),
                };
                let n = (cut as usize).min(rest.len());
                if next(&mut rng).is_multiple_of(2) {
                    d.handle_bytes(&rest[..n]);
                } else {
                    // Read into the decoder: a room of some size, filled with what came
                    // (often less, as a socket's read).
                    let room = d.spare(n + (next(&mut rng) % 3 * (1 << 16)) as usize);
                    room[..n].copy_from_slice(&rest[..n]);
                    room[n..].fill(0xA5);
                    d.filled(n);
                }
                rest = &rest[n..];
                while let Some(m) = d.poll_message::<ClientMessage>().expect("decode") {
                    got.push(m);
                }
            }
            assert!(got == sent, "round {round}: {} of {} frames came back", got.len(), sent.len());
            assert_eq!(d.buffered(), 0);
            let fed = wire.len() as u64;
            assert!(d.bytes_moved() <= fed, "round {round}: {} bytes moved for {fed} fed", d.bytes_moved());
        }
    }

    proptest::proptest! {
        #[test]
        fn random_bytes_never_panic(bytes in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..4096)) {
            let mut d = FrameDecoder::new();
            d.handle_bytes(&bytes);
            for _ in 0..8 {
                match d.poll_message::<ClientMessage>() {
                    Ok(Some(_)) => continue,
                    _ => break,
                }
            }
            let _ = decode_frame::<ServerMessage>(&bytes);
        }
    }
}
