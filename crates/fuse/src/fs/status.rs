//! A mount's own view, for `crest status --mount DIR`: read as the extended attribute
//! `crest.status` of the mount's root (as CephFS's `ceph.*` attributes are), a JSON object
//! with the connection (server, session, protocol, calls waiting, changes not yet durable,
//! reconnects) and the cache (names, attributes, inodes held exclusively, and the kernel's
//! look-ups it answered against those sent to the server), and what the process serving
//! the mount adds (`StatusExtra`: its client certificate). Answered here, never sent to the
//! server, and not listed by `listxattr`: no file's attributes change.

use std::sync::{Arc, Mutex};

use serde_json::json;

use super::CrestFs;

/// The attribute's name.
pub const STATUS_XATTR: &[u8] = b"crest.status";

/// Fields the process that serves a mount keeps current, shown in its status beside the
/// mount's own (`crest mount` puts its client certificate's life there).
#[derive(Clone, Debug, Default)]
pub struct StatusExtra(Arc<Mutex<serde_json::Map<String, serde_json::Value>>>);

impl StatusExtra {
    /// Sets the field `key` (replacing what it held).
    pub fn set(&self, key: &str, value: serde_json::Value) {
        self.0.lock().unwrap_or_else(|e| e.into_inner()).insert(key.to_string(), value);
    }

    fn fields(&self) -> serde_json::Map<String, serde_json::Value> {
        self.0.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }
}

/// Two are equal when they are the same fields (options compare equal when they name it).
impl PartialEq for StatusExtra {
    fn eq(&self, other: &StatusExtra) -> bool {
        Arc::ptr_eq(&self.0, &other.0)
    }
}

impl Eq for StatusExtra {}

impl CrestFs {
    pub(super) fn status_json(&self) -> Vec<u8> {
        let view = self.client.view();
        let cache = super::lock(&self.names).stats();
        let open_dirs = super::lock(&self.dirs).len();
        let mut v = json!({
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
        if let Some(fields) = v.as_object_mut() {
            fields.extend(self.status_extra.fields());
        }
        let mut out = v.to_string().into_bytes();
        out.push(b'\n');
        out
    }
}
