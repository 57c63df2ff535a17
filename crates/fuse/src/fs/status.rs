//! A mount's own view, for `crest status --mount DIR`: read as the extended attribute
//! `crest.status` of the mount's root (as CephFS's `ceph.*` attributes are), a JSON object
//! with the connection (server, session, protocol, calls waiting, changes not yet durable,
//! reconnects) and the cache (names, attributes, inodes held exclusively, and the kernel's
//! look-ups it answered against those sent to the server). Answered here,
//! never sent to the server, and not listed by `listxattr`: no file's attributes change.

use serde_json::json;

use super::CrestFs;

/// The attribute's name.
pub const STATUS_XATTR: &[u8] = b"crest.status";

impl CrestFs {
    pub(super) fn status_json(&self) -> Vec<u8> {
        let view = self.client.view();
        let cache = super::lock(&self.names).stats();
        let open_dirs = super::lock(&self.dirs).len();
        let v = json!({
            "server": self.client.addr(),
            "connection": view.state,
            "session": view.session,
            "protocol": view.protocol,
            "server_release": view.server_release,
            "reconnects": view.reconnects,
            "calls_waiting": view.waiting,
            "changes_not_durable": view.unstable,
            "bytes_queued": view.queued_bytes,
            "cache": {
                "directories": cache.directories,
                "attributes": cache.attributes,
                "names": cache.names,
                "exclusive": cache.exclusive,
                "rights_resets": cache.resets,
            },
            "open_directories": open_dirs,
            "lookups": {
                "cached": self.lookups_cached.load(std::sync::atomic::Ordering::Relaxed),
                "sent": self.lookups_sent.load(std::sync::atomic::Ordering::Relaxed),
            },
        });
        let mut out = v.to_string().into_bytes();
        out.push(b'\n');
        out
    }
}
