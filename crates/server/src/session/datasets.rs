//! Sessions in datasets: which dataset a hello may mount, and the one rewrite that
//! confines a session to it.
//!
//! A session mounts one dataset (`Session::dataset`). On the wire it sees that dataset's
//! root directory as inode 1, the FUSE root; inside the server every inode number is the
//! store's, whose high bits name the dataset (`crest_store::datasets`). So every request
//! is rewritten as it arrives (`inbound`: 1 → the dataset's root; a number of another
//! dataset → the dataset's inode 0, which never exists, so the operation fails ENOENT
//! and touches nothing outside) and everything sent back as it leaves (`outbound`: the
//! root → 1). Rights, recalls, pins and locks, all kept by store number, then never mix
//! datasets, and a client cannot reach outside its dataset whatever numbers it sends.

use super::*;
use s::datasets::{dataset_of, root_of, INO_BITS};

/// The store's number for `ino` as sent by a session of dataset `d`.
fn to_store(d: u64, ino: u64) -> u64 {
    if ino == s::ROOT_INO {
        root_of(d)
    } else if dataset_of(ino) == d {
        ino
    } else {
        d << INO_BITS
    }
}

/// The number a session of dataset `d` knows the store's `ino` by.
fn to_wire(d: u64, ino: u64) -> u64 {
    if ino == root_of(d) {
        s::ROOT_INO
    } else {
        ino
    }
}

impl Server {
    /// The dataset `hello` asks for (by name; empty: the default one), if `policy` lets
    /// its host mount it; the refusal's reason otherwise.
    pub(super) fn dataset_for(&self, hello: &p::Hello, policy: &Policy) -> Result<u64, String> {
        let name = if hello.dataset.is_empty() { s::datasets::DEFAULT_NAME } else { hello.dataset.as_str() };
        let d = self.store.dataset_id(name).map_err(|_| format!("no dataset named {name:?} on this server"))?;
        if self.receiving_into(d) {
            return Err(format!("dataset {name:?} is being received (crest receive); try again when it is done"));
        }
        // A snapshot is exported with its dataset.
        if !policy.may_mount(name.split('@').next().unwrap_or(name)) {
            return Err(format!("dataset {name:?} is not exported to this client"));
        }
        Ok(d)
    }

    /// Rewrites a request of `session` into store numbers (module doc).
    pub(super) fn inbound(&self, session: SessionId, req: &mut p::Request) {
        // (A snapshot is read through its dataset's numbers, `Store::set_view`.)
        let d = self.store.origin_of(self.sessions.get(&session).map_or(0, |s| s.dataset));
        for op in &mut req.ops {
            op.map_inos(&mut |ino| to_store(d, ino));
        }
    }

    /// Rewrites what goes to a session of a dataset other than the default one into the
    /// numbers it knows (module doc).
    pub(super) fn outbound(&self, o: &mut Outgoing) {
        let session = match o {
            Outgoing::Response { session, .. } | Outgoing::Read { session, .. } | Outgoing::Notify { session, .. } => {
                *session
            }
        };
        let d = self.store.origin_of(self.sessions.get(&session).map_or(0, |s| s.dataset));
        if d == 0 {
            return;
        }
        let f = &mut |ino| to_wire(d, ino);
        match o {
            Outgoing::Response { response, .. } | Outgoing::Read { response, .. } => {
                for r in response.results.iter_mut().flatten() {
                    r.map_inos(f);
                }
            }
            Outgoing::Notify { notify, .. } => notify.map_inos(f),
        }
    }

    /// The root of `session`'s dataset (where its inode numbers are reserved).
    pub(super) fn root_of_session(&self, session: SessionId) -> u64 {
        root_of(self.store.origin_of(self.sessions.get(&session).map_or(0, |s| s.dataset)))
    }

    /// Whether `session`'s dataset is read-only: a snapshot, or a dataset whose `readonly`
    /// property (which may change while it is mounted) is on.
    pub(super) fn dataset_read_only(&self, session: SessionId) -> bool {
        let d = self.sessions.get(&session).map_or(0, |s| s.dataset);
        self.store.is_snapshot(d) || self.store.dataset_props(d).is_some_and(|p| p.get_bool("readonly") == Some(true))
    }

    /// The snapshot `session` mounts, if it mounts one.
    pub(super) fn snapshot_of(&self, session: SessionId) -> Option<u64> {
        self.sessions.get(&session).map(|s| s.dataset).filter(|&d| self.store.is_snapshot(d))
    }

    /// Whether `session`'s dataset keeps no access times (its `atime` property is off).
    pub(super) fn dataset_noatime(&self, session: SessionId) -> bool {
        let d = self.sessions.get(&session).map_or(0, |s| s.dataset);
        self.store.dataset_props(d).is_some_and(|p| p.get_bool("atime") == Some(false))
    }

    /// Whether any session, connected or restored and awaited, mounts dataset `d`.
    pub fn dataset_in_use(&self, d: u64) -> bool {
        self.sessions.values().any(|s| s.dataset == d)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_session_sees_its_root_as_one_and_reaches_nothing_outside() {
        let d = 3;
        assert_eq!(to_store(d, 1), root_of(d));
        assert_eq!(to_wire(d, root_of(d)), 1);
        let inside = root_of(d) + 5;
        assert_eq!(to_store(d, inside), inside);
        assert_eq!(to_wire(d, inside), inside);
        for outside in [2, 1 << INO_BITS, root_of(d + 1), root_of(d - 1) + 7, u64::MAX, 0] {
            assert_eq!(to_store(d, outside), d << INO_BITS, "{outside}");
        }
        // The default dataset: numbers as they are, but only its own.
        assert_eq!(to_store(0, 1), 1);
        assert_eq!(to_store(0, 77), 77);
        assert_eq!(to_store(0, root_of(2)), 0);
        assert_eq!(to_wire(0, 77), 77);
    }
}
