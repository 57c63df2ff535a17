//! What the server has done since it started, counted for `crest status`, `crest stats` and
//! the Prometheus page: bytes clients wrote (counted as each write succeeds) and read,
//! recalls sent, sessions fenced, and operations refused by errno (counted where every
//! response and notice passes, `Server::take_outgoing`). A recall sent again to a client
//! that reconnected counts once (its id was seen); an answer sent again from the reply
//! cache to a client that resent its request counts again. Memory is bounded by the
//! errnos there are.

use std::collections::BTreeMap;

use crest_nvlist::{NvList, Value};
use crest_proto as p;

use crate::caps::Outgoing;

#[derive(Debug, Default)]
pub(super) struct Activity {
    pub(super) bytes_written: u64,
    pub(super) bytes_read: u64,
    /// Reads planned for the shell to run beside the store's thread (`elsewhere.rs`), and
    /// those whose plan failed and were read again on it.
    pub(super) reads_elsewhere: u64,
    pub(super) reads_again: u64,
    /// Objects mapped into files, reads answered with object locations, objects the
    /// collector deleted (`objects.rs`).
    pub(super) objects_mapped: u64,
    pub(super) reads_located: u64,
    pub(super) objects_deleted: u64,
    pub(super) recalls: u64,
    pub(super) fences: u64,
    errors: BTreeMap<i32, u64>,
    /// The highest recall id counted (ids only grow: one not above it was sent before).
    last_recall: u64,
}

impl Activity {
    /// Something going out: data read, errors, recalls.
    pub(super) fn outgoing(&mut self, o: &Outgoing) {
        match o {
            Outgoing::Response { response, .. } => {
                for r in &response.results {
                    match r {
                        Ok(p::Reply::Data(d)) => self.bytes_read += d.len() as u64,
                        Err(e) => *self.errors.entry(e.errno).or_default() += 1,
                        Ok(_) => {}
                    }
                }
            }
            // (Counted as planned: a plan that fails is read again, to the same length or
            // an error that `read_again`'s caller does not count.)
            Outgoing::Read { read, .. } => self.bytes_read += read.len() as u64,
            // (A recall split in parts counts once: its final part.)
            Outgoing::Notify { notify: p::Notify::Recall { recall_id, .. }, .. } if *recall_id > self.last_recall => {
                self.last_recall = *recall_id;
                self.recalls += 1;
            }
            Outgoing::Notify { .. } => {}
        }
    }

    pub(super) fn add_to(&self, out: &mut NvList) {
        let _ = out.add("client_bytes_written", Value::U64(self.bytes_written));
        let _ = out.add("client_bytes_read", Value::U64(self.bytes_read));
        let _ = out.add("reads_elsewhere", Value::U64(self.reads_elsewhere));
        let _ = out.add("reads_again", Value::U64(self.reads_again));
        let _ = out.add("objects_mapped", Value::U64(self.objects_mapped));
        let _ = out.add("reads_located", Value::U64(self.reads_located));
        let _ = out.add("objects_deleted", Value::U64(self.objects_deleted));
        let _ = out.add("recalls", Value::U64(self.recalls));
        let _ = out.add("fences", Value::U64(self.fences));
        let mut errors = NvList::new();
        for (errno, n) in &self.errors {
            let _ = errors.add(errno_name(*errno), Value::U64(*n));
        }
        let _ = out.add("errors", Value::List(errors));
    }
}

/// "ENOENT" for 2, "E4242" for an errno `p::errno::name` does not know.
pub(super) fn errno_name(errno: i32) -> String {
    p::errno::name(errno).map_or_else(|| format!("E{errno}"), str::to_string)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn response(results: Vec<Result<p::Reply, p::OpError>>) -> Outgoing {
        Outgoing::Response { session: 1, response: p::Response { id: 1, results, seq: 0, durable: 0, time: None } }
    }

    #[test]
    fn data_errors_and_recalls_are_counted_once_each() {
        let mut a = Activity { bytes_written: 320, ..Activity::default() };
        let err = |errno| Err(p::OpError { errno, message: String::new() });
        a.outgoing(&response(vec![Ok(p::Reply::Data(vec![1; 77])), err(p::errno::ENOENT), Ok(p::Reply::Done)]));
        a.outgoing(&response(vec![err(p::errno::ENOENT), err(4242)]));
        let recall =
            |recall_id| Outgoing::Notify { session: 2, notify: p::Notify::Recall { recall_id, inodes: vec![5] } };
        a.outgoing(&recall(9));
        a.outgoing(&recall(9)); // sent again after a reconnect
        a.outgoing(&recall(3)); // an older one, again
        a.outgoing(&Outgoing::Notify { session: 2, notify: p::Notify::Fenced });
        let mut l = NvList::new();
        a.add_to(&mut l);
        assert_eq!(l.get_u64("client_bytes_written"), Some(320));
        assert_eq!(l.get_u64("client_bytes_read"), Some(77));
        assert_eq!(l.get_u64("recalls"), Some(1));
        let Some(Value::List(errors)) = l.get("errors") else { panic!("{l:?}") };
        assert_eq!((errors.get_u64("ENOENT"), errors.get_u64("E4242")), (Some(2), Some(1)));
    }
}
