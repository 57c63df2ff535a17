//! Two things the server layer needs from the store to give clients exactly-once replay
//! after a crash:
//!
//! - **units**: the operations of one client request are applied as a unit: no commit
//!   falls inside it (a commit the size policy or an fsync asks for waits for
//!   `end_unit`), so after a crash a request is either wholly durable or wholly absent;
//! - **session records**: small opaque records, kept in the root tree beside the
//!   dataset's root item and committed atomically with it. The server writes, in the
//!   same unit as a client's request, "this session has applied requests up to N"; after
//!   a crash the record says exactly which of the client's requests survived, and the
//!   client replays the rest.
//!
//! Tests: `tests/basic.rs` (records survive commit and reopen, vanish without a commit,
//! and a unit defers an fsync's commit to its end).

use crate::engine::key::Key;
use crate::error::{Error, Result};
use crate::fs::keys::kind;
use crate::store::Store;

/// Largest session record.
pub const MAX_SESSION_RECORD_BYTES: usize = 1024;

fn session_key(id: u64) -> Key {
    Key::new(id, kind::SESSION, 0)
}

impl Store {
    /// Opens a unit: until the matching `end_unit`, commits are deferred. Units nest.
    pub fn begin_unit(&mut self) {
        self.unit_depth += 1;
    }

    /// Closes a unit; the outermost one runs a commit asked for inside it (and returns
    /// its error, which the caller must report to whoever asked: an fsync).
    pub fn end_unit(&mut self) -> Result<()> {
        self.unit_depth = self.unit_depth.saturating_sub(1);
        if self.unit_depth == 0 && std::mem::take(&mut self.commit_wanted) {
            return self.commit();
        }
        Ok(())
    }

    /// True when the last `end_unit` committed (or a commit is pending in a unit).
    pub fn commit_pending(&self) -> bool {
        self.commit_wanted
    }

    /// Stores (replaces) the record of session `id`; durable with the next commit.
    pub fn put_session_record(&mut self, id: u64, record: &[u8]) -> Result<()> {
        if record.len() > MAX_SESSION_RECORD_BYTES {
            return Err(Error::TooBig(format!(
                "session record of {} bytes (max {MAX_SESSION_RECORD_BYTES})",
                record.len()
            )));
        }
        self.pager.check_writable()?;
        self.root_tree.insert(&mut self.pager, session_key(id), record.to_vec())?;
        Ok(())
    }

    /// Removes the record of session `id` (a clean goodbye, an expired session).
    pub fn delete_session_record(&mut self, id: u64) -> Result<()> {
        self.pager.check_writable()?;
        self.root_tree.delete(&mut self.pager, &session_key(id))?;
        Ok(())
    }

    /// Every session record, by session id.
    pub fn session_records(&mut self) -> Result<Vec<(u64, Vec<u8>)>> {
        let mut out = Vec::new();
        self.root_tree.range(&mut self.pager, &Key::MIN, &Key::MAX, &mut |k, v| {
            if k.kind == kind::SESSION {
                out.push((k.objectid, v.to_vec()));
            }
            Ok(true)
        })?;
        Ok(out)
    }
}
