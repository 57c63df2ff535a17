//! Setuid and setgid a change of file data takes away (`authz::killed_by_write`), taken
//! by the server itself before the change runs: a mount clears them first, so for an
//! honest one this finds nothing to do.

use crest_proto::{self as p, Op};

use super::room::Room;
use super::{Server, SessionId, Who};
use crate::authz;

impl Server {
    /// Before `op` runs for `who`: its truncate clears the bits in the same `SetAttr`; a
    /// write, append, fallocate or object mapping has them cleared by a `SetAttr` of its
    /// own, run as any other (recalls, the reply cache's view, the journal).
    pub(super) fn kill_privs_before(
        &mut self,
        session: SessionId,
        who: &Who,
        op: &mut Op,
        now: p::Time,
        mutates: bool,
        involved: &mut Vec<u64>,
    ) {
        let Some((ino, mode)) = authz::killed_by_write(&mut self.store, &who.caller, op) else { return };
        if let Op::SetAttr { set, .. } = op {
            set.mode = Some(mode);
            return;
        }
        let set = p::SetAttr { mode: Some(mode), ..Default::default() };
        if let Err(e) = self.run_op(session, Op::SetAttr { ino, set }, now, mutates, involved, &mut Room::new(1)) {
            tracing::debug!(session, ino, "setuid/setgid not taken away before a write: {}", e.message);
        }
    }
}
