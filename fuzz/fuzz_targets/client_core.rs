//! The client core under a hostile server: after its hello, arbitrary bytes arrive on its
//! connection, cut into arbitrary reads, between calls it submits and timers that fire.
//! It must never panic, and never hold more than it was sent (a bad frame ends the
//! connection, as a real driver then reconnects).

#![no_main]

use std::sync::atomic::AtomicU64;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crest_client::conn::{Call, Connection, RightsHook};
use crest_proto::{self as p, Op};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let t0 = Instant::now();
    let mut c: Connection<u64> = Connection::new("fuzz", "f", Arc::new(AtomicU64::new(1)), RightsHook::default(), t0);
    c.connecting(t0);
    c.connected(t0);
    let _ = c.poll_transmit();
    let mut now = t0;
    let mut next_id = 1;
    for chunk in data.chunks(97) {
        let (&ctl, body) = chunk.split_first().unwrap_or((&0, &[]));
        now += Duration::from_millis(u64::from(ctl % 64));
        match ctl % 5 {
            0 => {
                next_id += 1;
                let ops = vec![Op::GetAttr { ino: 1 }, Op::Write { ino: 2, offset: 0, data: body.to_vec() }];
                c.submit(Call::wait(next_id, ops, now, next_id), now);
            }
            1 => c.handle_timeout(now),
            2 => {
                // A well-formed message from the server, whatever it says.
                if let Ok(m) = postcard::from_bytes::<p::ServerMessage>(body) {
                    let mut frame = Vec::new();
                    if p::encode_frame(&m, &mut frame).is_ok() {
                        c.handle_bytes(now, &frame);
                    }
                }
            }
            _ => c.handle_bytes(now, body),
        }
        let _ = c.poll_transmit();
        while c.poll_event().is_some() {}
    }
});
