//! The reply cache: each session's responses to the changes it sent, by request id, so
//! that a retried change is answered again instead of applied twice.
//!
//! It remembers the last `REPLY_CACHE_ENTRIES` changes of a session (clients never have
//! more requests than that in flight), the oldest forgotten first. Their responses are
//! kept whole up to `REPLY_CACHE_BYTES` (counted as encoded): past that, the oldest
//! responses are dropped but their ids stay, so that a retry of such a change is still
//! never applied again — it is answered EIO for each operation, as a change whose answer
//! a server restart lost is (docs/protocol.md §2). A peer that fills its cache with
//! large answers costs the server a bounded amount, and loses only its own answers.

use std::collections::{HashMap, VecDeque};

use crest_proto as p;

/// Changes each session remembers for retries.
pub const REPLY_CACHE_ENTRIES: usize = 4096;
/// Bytes of responses (as encoded) each session's cache keeps whole. crest's client never
/// comes near: of its 1,024 requests in flight, a change's answer is a few hundred bytes
/// (a batch of 512 writeback operations: 56 KiB).
pub const REPLY_CACHE_BYTES: usize = 32 << 20;

/// What is remembered of one change.
#[derive(Debug)]
enum Kept {
    /// Its response, and the bytes it takes encoded.
    Whole(p::Response, usize),
    /// Only that it ran: what a retry is answered with follows from these.
    Forgotten { seq: u64, time: Option<p::Time>, ops: usize },
}

/// One session's reply cache.
#[derive(Debug, Default)]
pub(super) struct Replies {
    by_id: HashMap<u64, Kept>,
    /// Request ids in the order their responses went in, oldest first.
    order: VecDeque<u64>,
    /// The ids whose responses are kept whole, oldest first (a subsequence of `order`).
    whole: VecDeque<u64>,
    /// Bytes of the responses kept whole.
    bytes: usize,
}

impl Replies {
    /// The response to request `id`, if it is remembered.
    pub(super) fn get(&self, id: u64) -> Option<p::Response> {
        match self.by_id.get(&id)? {
            Kept::Whole(r, _) => Some(r.clone()),
            Kept::Forgotten { seq, time, ops } => {
                let lost = p::OpError {
                    errno: p::errno::EIO,
                    message: format!("change {id} ran, but its answer is no longer kept"),
                };
                Some(p::Response { id, results: vec![Err(lost); *ops], seq: *seq, durable: 0, time: *time })
            }
        }
    }

    /// Whether request `id` has a remembered response.
    pub(super) fn contains(&self, id: u64) -> bool {
        self.by_id.contains_key(&id)
    }

    /// Remembers `response`, forgetting the oldest changes past `REPLY_CACHE_ENTRIES`
    /// and the oldest responses past `REPLY_CACHE_BYTES`.
    pub(super) fn insert(&mut self, response: p::Response) {
        let id = response.id;
        let size = p::encoded_len(&response);
        if let Some(old) = self.by_id.insert(id, Kept::Whole(response, size)) {
            // (A change answered twice: it keeps one place, the newest.)
            if let Kept::Whole(_, old) = old {
                self.bytes -= old;
            }
            self.order.retain(|&i| i != id);
            self.whole.retain(|&i| i != id);
        }
        self.order.push_back(id);
        self.whole.push_back(id);
        self.bytes += size;
        while self.order.len() > REPLY_CACHE_ENTRIES {
            let Some(old) = self.order.pop_front() else { break };
            if let Some(Kept::Whole(_, size)) = self.by_id.remove(&old) {
                // The oldest change of all, if whole, is the oldest whole one.
                self.bytes -= size;
                self.whole.pop_front();
            }
        }
        while self.bytes > REPLY_CACHE_BYTES {
            let Some(old) = self.whole.pop_front() else { break };
            if let Some(kept) = self.by_id.get_mut(&old) {
                if let Kept::Whole(r, size) = kept {
                    self.bytes -= *size;
                    *kept = Kept::Forgotten { seq: r.seq, time: r.time, ops: r.results.len() };
                }
            }
        }
    }

    /// Whether nothing is remembered.
    #[cfg(test)]
    pub(super) fn is_empty(&self) -> bool {
        self.by_id.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn response(id: u64) -> p::Response {
        p::Response { id, results: Vec::new(), seq: id, durable: 0, time: None }
    }

    /// A response of about `bytes` bytes encoded, of `ops` results.
    fn large(id: u64, bytes: usize, ops: usize) -> p::Response {
        let mut results = vec![Ok(p::Reply::Done); ops.saturating_sub(1)];
        results.push(Ok(p::Reply::Data(vec![id as u8; bytes])));
        p::Response { id, results, seq: id, durable: 0, time: Some(p::Time { sec: id as i64, nsec: 0 }) }
    }

    fn seed() -> u64 {
        let s =
            std::env::var("CREST_REPLIES_SEED").ok().and_then(|s| s.parse().ok()).unwrap_or_else(crest_rng::next_u64);
        eprintln!("CREST_REPLIES_SEED={s}");
        s | 1
    }

    fn next(state: &mut u64) -> u64 {
        *state ^= *state >> 12;
        *state ^= *state << 25;
        *state ^= *state >> 27;
        state.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    #[test]
    fn the_oldest_go_past_the_bound() {
        let mut r = Replies::default();
        for id in 1..=REPLY_CACHE_ENTRIES as u64 + 2 {
            r.insert(response(id));
        }
        assert!(!r.contains(1) && !r.contains(2), "the two oldest are forgotten");
        assert!(r.contains(3));
        assert_eq!(r.get(REPLY_CACHE_ENTRIES as u64 + 2).map(|x| x.seq), Some(REPLY_CACHE_ENTRIES as u64 + 2));
        assert_eq!(r.by_id.len(), REPLY_CACHE_ENTRIES);
        assert_eq!((r.order.len(), r.whole.len()), (REPLY_CACHE_ENTRIES, REPLY_CACHE_ENTRIES));
    }

    #[test]
    fn large_answers_are_bounded_in_bytes_and_their_changes_still_known() {
        let mut rng = seed();
        let mut r = Replies::default();
        let mut sent = Vec::new();
        let total = 2 * REPLY_CACHE_ENTRIES + (next(&mut rng) % 3000) as usize;
        for id in 1..=total as u64 {
            let bytes = match next(&mut rng) % 10 {
                0 if next(&mut rng).is_multiple_of(2) => (next(&mut rng) % (1 << 20)) as usize,
                0..=3 => (next(&mut rng) % 65_536) as usize,
                _ => (next(&mut rng) % 300) as usize,
            };
            let ops = 1 + (next(&mut rng) % 4) as usize;
            sent.push((id, bytes, ops));
            r.insert(large(id, bytes, ops));
            assert!(r.bytes <= REPLY_CACHE_BYTES, "after {id}: {} bytes of responses kept", r.bytes);
            if id.is_multiple_of(97) || id == total as u64 {
                let held: usize = r.by_id.values().map(|k| if let Kept::Whole(_, b) = k { *b } else { 0 }).sum();
                assert_eq!(held, r.bytes, "after {id}");
            }
            assert!(r.whole.len() <= r.order.len() && r.order.len() <= REPLY_CACHE_ENTRIES);
        }
        // The last REPLY_CACHE_ENTRIES changes are known: whole, the newest, or forgotten,
        // the oldest (answered EIO, never run again); the older ones are gone.
        let window: Vec<p::Response> =
            sent[total - REPLY_CACHE_ENTRIES..].iter().map(|&(id, b, o)| large(id, b, o)).collect();
        let first_whole = window.iter().position(|s| r.get(s.id).as_ref() == Some(s)).expect("the newest is whole");
        for (i, s) in window.iter().enumerate() {
            let got = r.get(s.id).unwrap_or_else(|| panic!("change {} forgotten", s.id));
            if i >= first_whole {
                assert_eq!(&got, s, "newer than the oldest whole one: whole");
            } else {
                assert_eq!((got.id, got.seq, got.time, got.results.len()), (s.id, s.seq, s.time, s.results.len()));
                assert!(got.results.iter().all(|x| x.as_ref().is_err_and(|e| e.errno == p::errno::EIO)));
            }
        }
        assert!(sent[..total - REPLY_CACHE_ENTRIES].iter().all(|&(id, _, _)| !r.contains(id)));
        assert!(first_whole > 0, "some answers were dropped for their bytes");
    }
}
