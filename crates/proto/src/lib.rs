//! crest's wire protocol, the step between the client and the server on the data path
//! (FUSE → net → **proto** → serve → server → store). It defines the messages, the frame
//! codec and the handshake, and does no I/O: bytes come in, messages go out, and the
//! async shells (`crest-net` on the client, `crest-serve` on the server) move them over
//! sockets.
//!
//! One connection per client mount carries every process's requests. A frame is a
//! little-endian u32 length followed by that many bytes of a postcard-encoded message.
//! Requests carry ids so many can be in flight; a request is *compound* (several
//! operations applied in order); the server may send unsolicited `Notify` messages (lease
//! recalls later). Metadata replies carry neighbouring directory items so one round trip
//! primes the client's cache.

pub mod acl;
mod checked;
pub mod codec;
pub mod errno;
mod identity;
mod inos;
pub mod locks;
pub mod message;
pub mod owner;
pub mod timing;
mod welcome;

pub use codec::{
    decode_frame, encode_frame, encoded_len, FrameDecoder, ProtoError, FRAME_HEADER_BYTES, MAX_FRAME_BYTES,
};
pub use identity::{IdentityMap, MAX_ID_MAP_ENTRIES};
pub use message::*;
