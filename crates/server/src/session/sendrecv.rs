//! `crest send` and `crest receive` as administrative calls (docs/protocol.md §5).
//!
//! A send is a series of `send` calls, each returning the stream's next part and a cursor
//! for the next call: the server keeps nothing between them (the store resumes from the
//! cursor). A receive is `receive.start` (a token), `receive.chunk` calls carrying the
//! stream in order, then `receive.finish`; any failure — a bad chunk, a chunk out of
//! order, `receive.abort`, or no chunk for `RECEIVE_IDLE_MS` (the sender died) — undoes
//! it (`crest_store::receive`), and the token is gone.

use super::admin::{err_of, invalid, text, Failed};
use super::*;
use crest_nvlist::{NvList, Value};
use s::receive::Receiving;

/// A receive with no chunk for this long is abandoned and undone.
pub const RECEIVE_IDLE_MS: u64 = 60_000;
/// Largest stream part one call carries either way (under the frame limit, 4 MiB: a send
/// answer is its budget and at most one more DATA record of 1 MiB).
pub const MAX_STREAM_CHUNK: usize = 3 << 20;
/// Receives at once.
const MAX_RECEIVES: usize = 16;

/// One receive: its state, the next chunk number it expects, when it last heard.
#[derive(Debug)]
pub(super) struct Receive {
    r: Receiving,
    next_seq: u64,
    last_ms: u64,
}

/// Receives under way, by token.
#[derive(Debug, Default)]
pub(super) struct Receives {
    by_token: HashMap<u64, Receive>,
    last_token: u64,
}

impl Server {
    /// Whether a receive is writing dataset `d` (it may not be mounted meanwhile).
    pub(super) fn receiving_into(&self, d: u64) -> bool {
        self.receives.by_token.values().any(|x| x.r.dataset() == Some(d))
    }

    /// Undoes the receives whose sender went quiet.
    pub(super) fn abort_idle_receives(&mut self, now_ms: u64) {
        let idle: Vec<u64> = self
            .receives
            .by_token
            .iter()
            .filter(|(_, x)| now_ms.saturating_sub(x.last_ms) > RECEIVE_IDLE_MS)
            .map(|(&t, _)| t)
            .collect();
        for t in idle {
            if let Some(x) = self.receives.by_token.remove(&t) {
                tracing::warn!(target = x.r.target(), "receive abandoned: nothing received for a minute; undoing it");
                self.undo(x);
            }
        }
    }

    fn undo(&mut self, x: Receive) {
        let target = x.r.target().to_string();
        if let Err(e) = self.store.receive_abort(x.r).and_then(|()| self.store.commit()) {
            tracing::error!(target = %target, "undoing a failed receive: {e}");
        }
    }

    pub(super) fn send_receive(&mut self, cmd: &str, call: &NvList, now: p::Time) -> Result<NvList, Failed> {
        let mut out = NvList::new();
        let now_ms = millis(now);
        match cmd {
            "send" => {
                let snapshot = text(call, "snapshot")?;
                let base = call.get_str("base");
                let cursor = match call.get("cursor") {
                    Some(Value::Bytes(b)) => b.clone(),
                    None => Vec::new(),
                    Some(_) => return Err(invalid("cursor must be bytes")),
                };
                let budget = call.get_u64("budget").unwrap_or(1 << 20).clamp(4096, 2 << 20);
                let c = self.store.send_chunk(snapshot, base, &cursor, budget as usize).map_err(|e| err_of(&e))?;
                let _ = out.add("data", Value::Bytes(c.data));
                let _ = out.add("cursor", Value::Bytes(c.cursor));
                let _ = out.add("done", Value::Bool(c.done));
            }
            "receive.start" => {
                if self.receives.by_token.len() >= MAX_RECEIVES {
                    return Err((16, format!("{MAX_RECEIVES} receives under way already")));
                }
                let name = text(call, "name")?;
                if let Ok(d) = self.store.dataset_id(name) {
                    if self.dataset_in_use(d) {
                        return Err((16, format!("dataset {name} is mounted; unmount it to receive into it")));
                    }
                }
                if self.receives.by_token.values().any(|x| x.r.target() == name) {
                    return Err((16, format!("a receive into {name} is under way")));
                }
                let force = call.get_bool("force") == Some(true);
                let r = self.store.receive_start(name, force, time_in(now)).map_err(|e| err_of(&e))?;
                // Tokens are not secrets (only administrators make these calls); they
                // only tell receives apart.
                self.receives.last_token += 1;
                let token = self.receives.last_token;
                self.receives.by_token.insert(token, Receive { r, next_seq: 0, last_ms: now_ms });
                let _ = out.add("token", Value::U64(token));
            }
            "receive.chunk" => {
                let (token, mut x) = self.take_receive(call)?;
                let seq = call.get_u64("seq").unwrap_or(u64::MAX);
                let data = match call.get("data") {
                    Some(Value::Bytes(b)) if seq == x.next_seq && b.len() <= MAX_STREAM_CHUNK => b,
                    _ => {
                        let msg = format!("receive chunk {seq} out of order or malformed (expected {})", x.next_seq);
                        self.undo(x);
                        return Err(invalid(msg));
                    }
                };
                if let Err(e) = self.store.receive_feed(&mut x.r, data) {
                    tracing::warn!(target = x.r.target(), "receive refused: {e}");
                    self.undo(x);
                    return Err(err_of(&e));
                }
                x.next_seq += 1;
                x.last_ms = now_ms;
                self.receives.by_token.insert(token, x);
            }
            "receive.finish" => {
                let (_, mut x) = self.take_receive(call)?;
                match self.store.receive_finish(&mut x.r) {
                    Ok(name) => {
                        tracing::info!(snapshot = %name, bytes = x.r.bytes, "received");
                        let _ = out.add("snapshot", Value::Str(name));
                    }
                    Err(e) => {
                        tracing::warn!(target = x.r.target(), "receive refused: {e}");
                        self.undo(x);
                        return Err(err_of(&e));
                    }
                }
            }
            "receive.abort" => {
                let (_, x) = self.take_receive(call)?;
                self.undo(x);
            }
            other => return Err(invalid(format!("unknown command {other:?}"))),
        }
        Ok(out)
    }

    fn take_receive(&mut self, call: &NvList) -> Result<(u64, Receive), Failed> {
        let token = call.get_u64("token").ok_or_else(|| invalid("argument \"token\" missing"))?;
        let x = self
            .receives
            .by_token
            .remove(&token)
            .ok_or_else(|| (2, format!("no receive {token} under way (it failed, finished or was abandoned)")))?;
        Ok((token, x))
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use crest_store::{MemDisk, MkfsOptions};

    const T0: p::Time = p::Time { sec: 5, nsec: 0 };

    fn server() -> Server {
        let disk = MemDisk::new(16 << 20);
        let opts = MkfsOptions { now: s::Timespec::new(1, 0), fsid: None, seed: None, meta_copies: 2 };
        Store::mkfs(Box::new(disk.clone()), &opts).unwrap();
        Server::new(Store::open(Box::new(disk)).unwrap())
    }

    fn call(srv: &mut Server, cmd: &str, args: &[(&str, Value)], now: p::Time) -> NvList {
        let mut l = NvList::new();
        l.add("cmd", Value::Str(cmd.into())).unwrap();
        for (k, v) in args {
            l.add(*k, v.clone()).unwrap();
        }
        NvList::decode(&srv.admin(&l.encode(), now)).unwrap()
    }

    /// The send stream of `ds@one` with one file in it, from a server of its own.
    fn stream() -> Vec<u8> {
        let mut a = server();
        let t = s::Timespec::new(2, 0);
        let d = a.store.create_dataset("ds", NvList::new(), (0, 0, 0o755), t).unwrap();
        let f = a.store.create(s::datasets::root_of(d), b"f", s::FileKind::Regular, 0o644, 0, 0, 0, t).unwrap();
        a.store.write(f.ino, 0, &vec![5u8; 300_000], t).unwrap();
        a.store.create_snapshots(&["ds@one".into()]).unwrap();
        let (mut out, mut cursor) = (Vec::new(), Vec::new());
        loop {
            let args = [("snapshot", Value::Str("ds@one".into())), ("cursor", Value::Bytes(cursor))];
            let answer = call(&mut a, "send", &args, T0);
            let Some(Value::Bytes(data)) = answer.get("data") else { panic!("{answer:?}") };
            out.extend_from_slice(data);
            let Some(Value::Bytes(c)) = answer.get("cursor") else { panic!("{answer:?}") };
            cursor = c.clone();
            if answer.get_bool("done") == Some(true) {
                return out;
            }
        }
    }

    fn start(b: &mut Server, now: p::Time) -> u64 {
        call(b, "receive.start", &[("name", Value::Str("copy".into()))], now).get_u64("token").unwrap()
    }

    fn chunk(b: &mut Server, token: u64, seq: u64, data: &[u8], now: p::Time) -> NvList {
        let args = [("token", Value::U64(token)), ("seq", Value::U64(seq)), ("data", Value::Bytes(data.to_vec()))];
        call(b, "receive.chunk", &args, now)
    }

    #[test]
    fn a_receive_is_undone_when_its_sender_errs_or_goes_quiet_and_blocks_mounts_meanwhile() {
        let stream = stream();
        let half = stream.len() / 2;
        let mut b = server();
        let hello = |name: &str| p::Hello {
            magic: p::HELLO_MAGIC,
            version: p::PROTOCOL_VERSION,
            client_name: "t".into(),
            resume: None,
            dataset: name.into(),
        };

        // A chunk out of order undoes it, and the token is gone.
        let token = start(&mut b, T0);
        assert!(chunk(&mut b, token, 0, &stream[..half], T0).get("error").is_none());
        assert!(b.store.dataset("copy").is_ok(), "made at BEGIN");
        let (sid, _) = b.handle_hello(&hello("copy"));
        assert!(sid.is_none(), "a dataset being received is not mounted");
        assert!(chunk(&mut b, token, 5, &stream[half..], T0).get_str("error").is_some());
        assert!(b.store.dataset("copy").is_err(), "undone");
        assert!(chunk(&mut b, token, 1, &stream[half..], T0).get_str("error").is_some(), "token gone");

        // A sender that goes quiet: undone a minute later.
        let token = start(&mut b, T0);
        chunk(&mut b, token, 0, &stream[..half], T0);
        b.tick(millis(T0) + RECEIVE_IDLE_MS / 2).unwrap();
        assert!(b.store.dataset("copy").is_ok(), "not yet");
        b.tick(millis(T0) + RECEIVE_IDLE_MS + 1).unwrap();
        assert!(b.store.dataset("copy").is_err(), "undone after a minute of silence");

        // Cut short: finish refuses and undoes.
        let token = start(&mut b, T0);
        chunk(&mut b, token, 0, &stream[..half], T0);
        let answer = call(&mut b, "receive.finish", &[("token", Value::U64(token))], T0);
        assert!(answer.get_str("error").is_some_and(|e| e.contains("cut short")), "{answer:?}");
        assert!(b.store.dataset("copy").is_err());

        // The whole stream, in pieces: the snapshot, and the dataset mounts.
        let token = start(&mut b, T0);
        for (i, part) in stream.chunks(100_000).enumerate() {
            let answer = chunk(&mut b, token, i as u64, part, T0);
            assert!(answer.get("error").is_none(), "{answer:?}");
        }
        let answer = call(&mut b, "receive.finish", &[("token", Value::U64(token))], T0);
        assert_eq!(answer.get_str("snapshot"), Some("copy@one"), "{answer:?}");
        let (sid, _) = b.handle_hello(&hello("copy"));
        assert!(sid.is_some(), "mountable once received");
        // A mounted dataset takes no receive.
        let answer = call(&mut b, "receive.start", &[("name", Value::Str("copy".into()))], T0);
        assert!(answer.get_str("error").is_some_and(|e| e.contains("mounted")), "{answer:?}");
    }
}
