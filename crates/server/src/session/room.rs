//! The room a request's answers have: its response must fit in one frame
//! (`MAX_FRAME_BYTES`), or it could not be sent at all, and a small request must not make
//! the server build a large answer (a thousand 4 MiB reads in a few kilobytes).
//!
//! Every operation of a request is promised `SMALL_RESULT_BYTES`: enough for any change's
//! reply (attributes, an entry, `Done`, an inode range) and for an error, shortened if
//! need be, so a change that ran is always told. A larger reply (file data, xattr names,
//! a listing, a leaf) takes what the operations before it left over the promises to those
//! after it; one that does not fit is refused with E2BIG (docs/protocol.md §2). A read is
//! refused before it reads.

use crest_proto::{self as p, Reply};

/// What any operation's result may take encoded, whatever the others took: the largest
/// reply a change gives (attributes: 138 bytes at most) or a shortened error.
pub(super) const SMALL_RESULT_BYTES: usize = 192;
/// Room for the response's own fields (the frame's message tag, id, seq, durable, time
/// and the results' count: 50 bytes at most).
const ENVELOPE_BYTES: usize = 64;
/// Bytes of an error message kept when the whole would not fit.
const SHORT_MESSAGE_BYTES: usize = 128;
/// Encoded bytes of a read's reply besides its data (tags, length and checksum).
const READ_OVERHEAD_BYTES: usize = 16;

// A lone read of the largest size fits, and so do the promises to a full request.
const _: () = assert!(MAX_RESULTS_BYTES >= p::MAX_IO_BYTES as usize + READ_OVERHEAD_BYTES);
const _: () = assert!(MAX_RESULTS_BYTES >= p::MAX_OPS_PER_REQUEST * SMALL_RESULT_BYTES);

/// What the results of one response may take encoded.
pub(super) const MAX_RESULTS_BYTES: usize = p::MAX_FRAME_BYTES - ENVELOPE_BYTES;

/// The room left for the results of one request.
#[derive(Debug)]
pub(super) struct Room {
    left: usize,
    /// Operations whose results are still to come (each promised `SMALL_RESULT_BYTES`).
    to_come: usize,
}

impl Room {
    /// The room for a request of `ops` operations (at most `MAX_OPS_PER_REQUEST`).
    pub(super) fn new(ops: usize) -> Room {
        Room { left: MAX_RESULTS_BYTES, to_come: ops }
    }

    /// What the next result may take: what is left but for the promises to those after it.
    fn share(&self) -> usize {
        let promised = self.to_come.saturating_sub(1).saturating_mul(SMALL_RESULT_BYTES);
        self.left.saturating_sub(promised)
    }

    /// The refusal of an operation whose reply would not fit.
    pub(super) fn too_large() -> p::OpError {
        p::OpError { errno: p::errno::E2BIG, message: "the reply would not fit in one frame".into() }
    }

    /// Whether `op` is refused before it runs: a read whose data could not fit.
    pub(super) fn refuses(&self, op: &p::Op) -> bool {
        match op {
            p::Op::Read { len, .. } => (*len).min(p::MAX_IO_BYTES) as usize + READ_OVERHEAD_BYTES > self.share(),
            _ => false,
        }
    }

    /// Takes the room for the next result: `result` itself if it fits, else its error
    /// shortened, or E2BIG in place of a reply.
    pub(super) fn place(&mut self, result: Result<Reply, p::OpError>) -> Result<Reply, p::OpError> {
        let share = self.share();
        let mut result = result;
        let mut len = encoded_len(&result);
        if len > share {
            result = match result {
                Err(mut e) => {
                    let mut end = e.message.len().min(SHORT_MESSAGE_BYTES);
                    while !e.message.is_char_boundary(end) {
                        end -= 1;
                    }
                    e.message.truncate(end);
                    Err(e)
                }
                Ok(_) => Err(Room::too_large()),
            };
            len = encoded_len(&result);
        }
        self.left = self.left.saturating_sub(len);
        self.to_come = self.to_come.saturating_sub(1);
        result
    }
}

/// What `result` takes encoded, at most. File data is counted by its length, not walked
/// (postcard encodes it byte by byte: counting it so cost a pass over every read).
fn encoded_len(result: &Result<Reply, p::OpError>) -> usize {
    match result {
        Ok(Reply::Data(d)) => d.len() + READ_OVERHEAD_BYTES,
        r => p::encoded_len(r),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn largest_attr() -> p::Attr {
        let t = p::Time { sec: i64::MIN, nsec: u32::MAX };
        p::Attr {
            ino: u64::MAX,
            generation: u64::MAX,
            kind: p::FileType::Socket,
            mode: u32::MAX,
            nlink: u32::MAX,
            uid: u32::MAX,
            gid: u32::MAX,
            size_bytes: u64::MAX,
            blocks_4k: u64::MAX,
            rdev: u64::MAX,
            atime: t,
            mtime: t,
            ctime: t,
            crtime: t,
            flags: u32::MAX,
        }
    }

    #[test]
    fn every_reply_a_change_gives_is_small() {
        let replies = [
            Reply::Attr(largest_attr()),
            Reply::Entry(largest_attr()),
            Reply::Done,
            Reply::Inodes { first: u64::MAX, count: u32::MAX },
            Reply::Lock(Some(p::LockInfo { kind: p::LockKind::Write, start: u64::MAX, end: u64::MAX, pid: u32::MAX })),
        ];
        for r in replies {
            let ok: Result<Reply, p::OpError> = Ok(r);
            assert!(p::encoded_len(&ok) <= SMALL_RESULT_BYTES, "{ok:?}: {}", p::encoded_len(&ok));
        }
        let long = p::OpError { errno: i32::MIN, message: "é".repeat(100_000) };
        let mut room = Room::new(p::MAX_OPS_PER_REQUEST);
        room.left = SMALL_RESULT_BYTES * p::MAX_OPS_PER_REQUEST;
        let placed = room.place(Err(long));
        assert!(p::encoded_len(&placed) <= SMALL_RESULT_BYTES, "a shortened error is small");
        assert!(placed.is_err_and(|e| e.errno == i32::MIN && e.message.starts_with('é')));
    }

    #[test]
    fn a_reads_reply_is_counted_by_its_length_no_less_than_it_takes() {
        for n in [0, 1, 127, 128, 16_383, 16_384, 131_072, p::MAX_IO_BYTES as usize] {
            let r: Result<Reply, p::OpError> = Ok(Reply::Data(vec![7; n]));
            let (counted, exact) = (encoded_len(&r), p::encoded_len(&r));
            assert!(exact <= counted && counted <= exact + READ_OVERHEAD_BYTES, "{n}: {exact} {counted}");
        }
    }

    #[test]
    fn the_envelope_fits_its_allowance() {
        let results = vec![Ok(Reply::Done); p::MAX_OPS_PER_REQUEST];
        let small = p::encoded_len(&p::ServerMessage::Response(p::Response {
            id: 0,
            results: results.clone(),
            seq: 0,
            durable: 0,
            time: None,
        }));
        let large = p::encoded_len(&p::ServerMessage::Response(p::Response {
            id: u64::MAX,
            results: results.clone(),
            seq: u64::MAX,
            durable: u64::MAX,
            time: Some(p::Time { sec: i64::MIN, nsec: u32::MAX }),
        }));
        let each: usize = results.iter().map(p::encoded_len).sum();
        assert!(large - each <= ENVELOPE_BYTES, "{}", large - each);
        assert!(small <= large);
    }
}
