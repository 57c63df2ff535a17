//! The lease and timing constants both ends keep to (docs/protocol.md §4.4): the server
//! fences by them, the client heartbeats and drops its rights by them. Their order is the
//! protocol's safety argument, checked below: a client stops trusting what it cached
//! before the server can have given it to anyone else.

/// How long a change's reply waits for a holder that does not answer its recall. Its
/// caches expire on their own by then (the client-side TTL is shorter).
pub const RECALL_TIMEOUT_MS: u64 = 2_000;
/// How long the holder of exclusive rights has to answer their recall, from the recall or
/// from its latest request working on the recalled inodes (its write-back), before it is
/// fenced (never later than `LEASE_MS` after the recall). Longer than a client trusts its
/// rights without hearing the server: a holder cut off before the recall reached it has
/// stopped answering under them by then.
pub const EXCLUSIVE_RECALL_MS: u64 = 3_000;
/// How long after its connection dropped a session stops counting as a holder of shared
/// rights: longer than a client trusts its cache without the server (1 s by default).
pub const DISCONNECTED_HOLDER_MS: u64 = 1_500;
/// A session's lease: the server fences a session it has not heard from for this long
/// (clients send something at least every `HEARTBEAT_MS`).
pub const LEASE_MS: u64 = 10_000;
/// A session whose connection has been gone this long is fenced (its client died, or
/// was cut off longer than a blip): its locks and exclusive rights go.
pub const DISCONNECTED_FENCE_MS: u64 = 3_000;
/// After a restart, how long the server holds new work for restored sessions' clients to
/// come back and replay what they had acknowledged (docs/protocol.md §4.5).
pub const GRACE_MS: u64 = LEASE_MS;
/// How often an idle client says it is alive.
pub const HEARTBEAT_MS: u64 = 1_000;
/// A client that has heard nothing from the server for this long drops every right it
/// holds and everything it cached under them (checked every 250 ms): before the server
/// can have fenced it (`DISCONNECTED_FENCE_MS` after its connection went, `LEASE_MS`
/// after its last word).
pub const CLIENT_LEASE_MS: u64 = 2_500;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_client_gives_up_its_rights_before_the_server_can_fence_it() {
        const { assert!(HEARTBEAT_MS < CLIENT_LEASE_MS) };
        const { assert!(CLIENT_LEASE_MS < DISCONNECTED_FENCE_MS && CLIENT_LEASE_MS < LEASE_MS) };
        const { assert!(CLIENT_LEASE_MS < EXCLUSIVE_RECALL_MS && EXCLUSIVE_RECALL_MS <= LEASE_MS) };
        // A shared holder that went away counts until its cache has surely expired.
        const { assert!(DISCONNECTED_HOLDER_MS < RECALL_TIMEOUT_MS) };
        const { assert!(GRACE_MS >= LEASE_MS) };
    }
}
