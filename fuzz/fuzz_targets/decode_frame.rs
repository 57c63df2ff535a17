//! The wire decoder on arbitrary byte streams, cut into arbitrary reads: `FrameDecoder`
//! must never panic nor buffer more than one frame's worth, and every message it accepts
//! (client or server side) must survive a round trip: encoding it again gives a frame that
//! decodes to the same message. Decoding stays linear: the decoder shifts no more bytes
//! inside its buffer than it was fed.

#![no_main]

use crest_proto::{decode_frame, encode_frame, ClientMessage, FrameDecoder, ServerMessage, FRAME_HEADER_BYTES, MAX_FRAME_BYTES};
use libfuzzer_sys::fuzz_target;
use serde::{de::DeserializeOwned, Serialize};

fn stream<T: DeserializeOwned + Serialize + PartialEq + std::fmt::Debug>(cuts: &[u8], bytes: &[u8]) {
    let mut dec = FrameDecoder::new();
    let mut rest = bytes;
    let mut cut = cuts.iter().cycle();
    let mut fed = 0u64;
    while !rest.is_empty() {
        let n = (usize::from(*cut.next().unwrap_or(&255)) + 1).min(rest.len());
        dec.handle_bytes(&rest[..n]);
        rest = &rest[n..];
        fed += n as u64;
        loop {
            match dec.poll_message::<T>() {
                Ok(Some(msg)) => {
                    let mut frame = Vec::new();
                    encode_frame(&msg, &mut frame).expect("a decoded message encodes");
                    let again: T = decode_frame(&frame[FRAME_HEADER_BYTES..]).expect("and decodes again");
                    assert_eq!(again, msg);
                }
                Ok(None) => break,
                // The connection would close here.
                Err(_) => return,
            }
        }
        assert!(dec.buffered() <= FRAME_HEADER_BYTES + MAX_FRAME_BYTES + 256 + 1);
        assert!(dec.bytes_moved() <= fed, "{} bytes moved for {fed} fed", dec.bytes_moved());
    }
}

fuzz_target!(|data: &[u8]| {
    let split = usize::from(data.first().copied().unwrap_or(0) % 8).min(data.len());
    let (cuts, bytes) = data.split_at(split);
    let cuts = if cuts.is_empty() { &[255u8][..] } else { cuts };
    stream::<ClientMessage>(cuts, bytes);
    stream::<ServerMessage>(cuts, bytes);
});
