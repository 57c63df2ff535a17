//! The server core under arbitrary sessions sending arbitrary requests: hellos (new and
//! resumed, with guessed tokens), requests of any ops (decoded from the input, so every
//! field takes hostile values), recall answers, replays, disconnects, goodbyes and ticks,
//! on a real store over an in-memory disk. The server must never panic, every request
//! must be answered in one frame or not at all, and the image must still pass fsck after
//! a commit: no op sequence from any client corrupts it.

#![no_main]

use arbitrary::{Arbitrary, Unstructured};
use crest_proto::{self as p, Op};
use crest_server::{Outgoing, Server};
use crest_store::{check, MemDisk, MkfsOptions, Store, Timespec};
use libfuzzer_sys::fuzz_target;

#[derive(Arbitrary, Debug)]
enum Action {
    Hello { resume: Option<(u8, u64)> },
    Request { session: u8, id: u16, time: Option<(i32, u32)>, caller: (u16, u16), ops: Vec<u8> },
    RecallDone { session: u8, recall_id: u8 },
    Replayed { session: u8 },
    Disconnected { session: u8 },
    Goodbye { session: u8 },
    Tick { ms: u16 },
}

fn ops_from(bytes: &[u8]) -> Vec<Op> {
    // Each op is a postcard encoding: whatever decodes, however odd, goes in.
    let mut out = Vec::new();
    let mut rest = bytes;
    while !rest.is_empty() && out.len() < 16 {
        match postcard::take_from_bytes::<Op>(rest) {
            Ok((op, r)) => {
                out.push(op);
                rest = r;
            }
            Err(_) => rest = &rest[1..],
        }
    }
    out
}

fuzz_target!(|data: &[u8]| {
    let mut u = Unstructured::new(data);
    let Ok(actions) = Vec::<Action>::arbitrary(&mut u) else { return };
    let disk = MemDisk::new(64 << 20);
    if Store::mkfs(Box::new(disk.clone()), &MkfsOptions { now: Timespec::new(1, 0), fsid: None, seed: Some(1), meta_copies: 2 }).is_err() {
        return;
    }
    let Ok(store) = Store::open(Box::new(disk.clone())) else { return };
    let mut srv = Server::new(store);
    srv.seed_randomness(7);
    let mut sessions = Vec::new();
    let mut now_ms: u64 = 1_000_000;
    let time = |ms: u64| p::Time { sec: (ms / 1000) as i64, nsec: ((ms % 1000) * 1_000_000) as u32 };
    for a in actions.into_iter().take(200) {
        now_ms += 7;
        match a {
            Action::Hello { resume } => {
                let resume = resume.map(|(i, secret)| p::SessionToken {
                    id: sessions.get(usize::from(i) % sessions.len().max(1)).copied().unwrap_or(u64::from(i)),
                    secret,
                });
                let hello = p::Hello { magic: p::HELLO_MAGIC, version: p::PROTOCOL_VERSION, client_name: "f".into(), resume, dataset: String::new() };
                if let (Some(sid), _) = srv.handle_hello(&hello) {
                    sessions.push(sid);
                }
            }
            Action::Request { session, id, time: t, caller, ops } => {
                let Some(&sid) = sessions.get(usize::from(session) % sessions.len().max(1)) else { continue };
                let ops = ops_from(&ops);
                let req = p::Request {
                    id: u64::from(id) + 1,
                    ops,
                    time: t.map(|(s, ns)| p::Time { sec: i64::from(s), nsec: ns % 1_000_000_000 }),
                    caller: p::Caller { uid: u32::from(caller.0), gid: u32::from(caller.1), groups: vec![] },
                };
                srv.handle(sid, req, time(now_ms));
            }
            Action::RecallDone { session, recall_id } => {
                if let Some(&sid) = sessions.get(usize::from(session) % sessions.len().max(1)) {
                    srv.recall_done(sid, u64::from(recall_id), time(now_ms));
                }
            }
            Action::Replayed { session } => {
                if let Some(&sid) = sessions.get(usize::from(session) % sessions.len().max(1)) {
                    srv.replayed(sid, time(now_ms));
                }
            }
            Action::Disconnected { session } => {
                if let Some(&sid) = sessions.get(usize::from(session) % sessions.len().max(1)) {
                    srv.disconnected(sid, now_ms);
                }
            }
            Action::Goodbye { session } => {
                if let Some(&sid) = sessions.get(usize::from(session) % sessions.len().max(1)) {
                    srv.end_session(sid);
                }
            }
            Action::Tick { ms } => {
                now_ms += u64::from(ms);
                let _ = srv.tick(now_ms);
            }
        }
        for o in srv.take_outgoing() {
            if let Outgoing::Response { response, .. } = o {
                let mut frame = Vec::new();
                p::encode_frame(&p::ServerMessage::Response(response), &mut frame).expect("every answer fits a frame");
            }
        }
    }
    let mut store = srv.into_store();
    if store.commit().is_err() {
        return;
    }
    drop(store);
    let report = check::fsck(Box::new(disk)).expect("the image opens");
    assert!(report.is_clean(), "fsck after arbitrary requests: {:?}", report.problems);
});
