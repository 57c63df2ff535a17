//! The reply cache: each session's responses to the changes it sent, by request id, so
//! that a retried change is answered again instead of applied twice. It holds at most
//! `REPLY_CACHE_ENTRIES` responses, evicting the oldest first; clients never have more
//! requests than that in flight.

use std::collections::{HashMap, VecDeque};

use crest_proto as p;

/// Responses each session remembers for retries.
pub const REPLY_CACHE_ENTRIES: usize = 4096;

/// One session's reply cache.
#[derive(Debug, Default)]
pub(super) struct Replies {
    by_id: HashMap<u64, p::Response>,
    /// Request ids in the order their responses went in, oldest first.
    order: VecDeque<u64>,
}

impl Replies {
    /// The response to request `id`, if it is remembered.
    pub(super) fn get(&self, id: u64) -> Option<&p::Response> {
        self.by_id.get(&id)
    }

    /// Whether request `id` has a remembered response.
    pub(super) fn contains(&self, id: u64) -> bool {
        self.by_id.contains_key(&id)
    }

    /// Remembers `response`, forgetting the oldest past `REPLY_CACHE_ENTRIES`.
    pub(super) fn insert(&mut self, response: p::Response) {
        self.order.push_back(response.id);
        self.by_id.insert(response.id, response);
        while self.order.len() > REPLY_CACHE_ENTRIES {
            if let Some(old) = self.order.pop_front() {
                self.by_id.remove(&old);
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
    }
}
