//! The `Rights` hook that keeps a mount's `NameCache` in step with its session: what the
//! server granted and recalled, told by the session core (`conn::Connection`) in the
//! order the messages arrived, on its clock. The FUSE adapter installs it on its
//! connection and the simulator on each simulated client's, so both run these rules.

use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Instant;

use crest_proto as p;

use crate::conn::Rights;
use crate::names::NameCache;

/// Applies the session's rights to a shared `NameCache`.
#[derive(Debug, Clone)]
pub struct CacheRights {
    /// The cache (the mount's, shared with its kernel-call handlers).
    pub names: Arc<Mutex<NameCache>>,
}

impl CacheRights {
    fn cache(&self) -> MutexGuard<'_, NameCache> {
        self.names.lock().unwrap_or_else(|e| e.into_inner())
    }
}

impl Rights for CacheRights {
    fn granted_exclusive(&self, ino: u64, sent: Instant, now: Instant) {
        self.cache().grant_exclusive(ino, now, sent);
    }

    fn recalled(&self, inodes: &[u64], now: Instant) {
        let mut c = self.cache();
        for &ino in inodes {
            c.recall_rights(ino, now);
            c.recalled(ino);
        }
    }

    fn reset(&self, now: Instant) {
        self.cache().reset_rights(now);
    }

    fn held(&self, now: Instant) -> Vec<(u64, bool)> {
        self.cache().held_rights(now)
    }

    fn disconnected(&self, now: Instant) {
        self.cache().drop_shared(now);
    }

    fn restored(&self, now: Instant) -> Vec<(u64, bool)> {
        let mut c = self.cache();
        c.drop_shared(now);
        c.held_rights(now)
    }

    fn reply_lost(&self, ops: &[p::Op], now: Instant) {
        self.cache().reply_lost(ops, now);
    }
}
