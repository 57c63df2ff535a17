//! The client's async shell: everything on the client side that touches sockets and
//! timers (FUSE → cache → **net** → proto → serve → server → store). `client` is the
//! mount's one connection. It links no part of the server (the server's shell is
//! `crest-serve`).
//!
//! Client connection: One TCP connection per mount carries
//! every caller's requests, pipelined: each call gets a request id, goes out on the shared
//! connection and waits for its own response. When the connection drops the client
//! reconnects with backoff, resumes its session and resends every request still waiting —
//! with the same ids, so the server's reply cache applies each exactly once. Callers block
//! meanwhile, up to `ClientOptions::op_timeout`.
//!
//! Invariants:
//! - a request id is used once per session, and a request stays in the pending table until
//!   its response arrives (or its caller gave up), so nothing is lost across reconnects;
//! - at most `MAX_IN_FLIGHT` requests are pending; callers beyond that wait;
//! - the FUSE side never sees the socket: only `Client::call`.

pub mod client;

pub use client::{
    admin, join, renew, AsyncPermit, Client, ClientError, ClientOptions, Completion, Recall, Rights, MAX_ASYNC_BYTES,
    MAX_IN_FLIGHT,
};
