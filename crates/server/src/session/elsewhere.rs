//! Work the shell does off the store's thread, and the core's side of it.
//!
//! **Reads.** With `Server::set_reads_elsewhere` on, a request that is one `Read` of at
//! least that many bytes from the disk is planned (`Store::plan_read`) rather than read:
//! its response leaves as `Outgoing::Read`, an empty `Reply::Data` with the plan, and the
//! shell runs the plan on a thread of its own and puts the bytes in before sending it, in
//! its place among the session's messages (a recall that follows must not overtake the
//! data it invalidates). A plan that finds a bad block answers `None`; the shell then asks
//! `Server::read_again`, which reads on the store's thread, repairing from a second copy
//! or reporting as any read does. Only a request of one op is planned, so the response's
//! size was checked as for any read (`Room`), and nothing else in it waits for the plan.
//! Not while space is short: a plan keeps the blocks it reads from reuse, and a write
//! that needs every free block must not find some held.
//!
//! **Sums of written blocks.** `Server::handle_with_sums` takes, with a request, the
//! CRC-32C of the blocks each of its writes carries, computed where the request was
//! decoded (`crest_store::checksum::block_sums`); the store records them as given for a
//! write of whole blocks (`Store::write_summed`). They count for that request alone: one
//! that runs later (parked) has the store sum its blocks.

use std::sync::Arc;

use crest_proto::{self as p, Op, Reply};
use crest_store::{Planned, ReadPlan};

use super::{Server, SessionId};

/// A read to run elsewhere, with what names it for `read_again`.
#[derive(Clone, Debug)]
pub struct PlannedRead {
    plan: Arc<ReadPlan>,
    /// The store's inode number (after a dataset's numbers were mapped).
    ino: u64,
    offset: u64,
    len: u64,
}

impl PartialEq for PlannedRead {
    fn eq(&self, other: &PlannedRead) -> bool {
        Arc::ptr_eq(&self.plan, &other.plan)
    }
}

impl Eq for PlannedRead {}

impl PlannedRead {
    /// The bytes, read and verified here; `None` if a block failed (then `read_again`).
    pub fn run(&self) -> Option<Vec<u8>> {
        self.plan.run()
    }

    /// Bytes the read returns.
    pub fn len(&self) -> usize {
        self.plan.len()
    }

    /// True for a read of nothing.
    pub fn is_empty(&self) -> bool {
        self.plan.is_empty()
    }

    /// `response` (a planned read's, its one result a placeholder) with `result` in it.
    pub fn answer(mut response: p::Response, result: Result<Reply, p::OpError>) -> p::Response {
        if let Some(first) = response.results.first_mut() {
            *first = result;
        }
        response
    }
}

/// For each op of a request: the CRC-32C of each block it writes, if the shell summed them.
pub type WriteSums = Vec<Option<Vec<u32>>>;

/// The core's side of work done elsewhere.
#[derive(Debug, Default)]
pub(super) struct Elsewhere {
    /// The sums the shell gave with a request: its session, its id, one list per op.
    given_sums: Option<(SessionId, u64, WriteSums)>,
    /// Those of the op running.
    pub(super) op_sums: Option<Vec<u32>>,
    /// Reads of at least this many bytes from the disk are planned (`None`: none are).
    from_bytes: Option<u64>,
    /// The request being handled may be planned.
    may_plan: bool,
    /// Its plan, once made.
    planned: Option<PlannedRead>,
}

impl Server {
    /// Plans reads of at least `from_bytes` bytes from the disk for the shell to run on
    /// another thread (`Outgoing::Read`); `None` reads everything on the store's thread.
    pub fn set_reads_elsewhere(&mut self, from_bytes: Option<u64>) {
        self.elsewhere.from_bytes = from_bytes;
    }

    /// Whether request `req` may be answered by a plan: one `Read`, and `may` (no
    /// response of it is kept to answer again).
    pub(super) fn begin_plannable(&mut self, req: &p::Request, may: bool) {
        self.elsewhere.may_plan =
            may && self.elsewhere.from_bytes.is_some() && matches!(req.ops.as_slice(), [Op::Read { .. }]);
        self.elsewhere.planned = None;
    }

    /// The plan the request just handled made, if any.
    pub(super) fn end_plannable(&mut self) -> Option<PlannedRead> {
        self.elsewhere.may_plan = false;
        self.elsewhere.planned.take()
    }

    /// `Op::Read`: read here, or planned when the request allows it; a read of data in
    /// objects is located (the client fetches it), or, for a client of a protocol before
    /// objects, read here from the data store.
    pub(super) fn read_or_plan(
        &mut self,
        session: SessionId,
        ino: u64,
        offset: u64,
        len: u64,
        now: p::Time,
    ) -> crest_store::Result<Reply> {
        let from = match self.elsewhere.from_bytes {
            Some(from) if self.elsewhere.may_plan && !self.space.low() => Some(from),
            _ => None,
        };
        let locates = self.locates_objects(session);
        if from.is_none() && !locates {
            return self.store.read(ino, offset, len).map(Reply::Data);
        }
        match self.store.plan_read(ino, offset, len, from.unwrap_or(u64::MAX))? {
            Planned::Read(bytes) => Ok(Reply::Data(bytes)),
            Planned::Located(l) if locates => Ok(self.located_reply(l, now)),
            Planned::Located(_) => self.store.read(ino, offset, len).map(Reply::Data),
            Planned::Elsewhere(plan) => {
                self.activity.reads_elsewhere += 1;
                self.elsewhere.planned = Some(PlannedRead { plan: Arc::new(plan), ino, offset, len });
                Ok(Reply::Data(Vec::new()))
            }
        }
    }

    /// A planned read's response that would wait for recalls (its request changed
    /// something: `changed`) is held whole, and goes out later as it is: its bytes are read
    /// here and now, and no plan goes on.
    pub(super) fn read_now_if_held(
        &mut self,
        session: SessionId,
        response: p::Response,
        planned: Option<PlannedRead>,
        changed: &[u64],
    ) -> (p::Response, Option<PlannedRead>) {
        match planned {
            Some(read) if !changed.is_empty() => (self.finish_read(session, response, &read), None),
            planned => (response, planned),
        }
    }

    /// `response` with the bytes of `read` in it, read on this thread (a shell that runs
    /// plans elsewhere does the same in two steps: `PlannedRead::run` there, then
    /// `read_again` here if that failed).
    pub fn finish_read(&mut self, session: SessionId, response: p::Response, read: &PlannedRead) -> p::Response {
        let result = match read.run() {
            Some(bytes) => Ok(Reply::Data(bytes)),
            None => self.read_again(session, read),
        };
        PlannedRead::answer(response, result)
    }

    /// `handle`, with the sums of the blocks each op of `req` writes (`sums[i]` for op `i`:
    /// `block_sums` of its data, or `None`), computed off the store's thread.
    pub fn handle_with_sums(&mut self, session: SessionId, req: p::Request, sums: WriteSums, now: p::Time) {
        self.elsewhere.given_sums = Some((session, req.id, sums));
        self.handle(session, req, now);
        self.elsewhere.given_sums = None;
    }

    /// The sums given with request `id` of `session`, if it is the one `handle_with_sums`
    /// is running (not a parked one that runs meanwhile).
    pub(super) fn take_request_sums(&mut self, session: SessionId, id: u64) -> WriteSums {
        match self.elsewhere.given_sums.take() {
            Some((s, i, sums)) if s == session && i == id => sums,
            other => {
                self.elsewhere.given_sums = other;
                Vec::new()
            }
        }
    }

    /// The answer to a planned read whose plan failed, read on the store's thread as
    /// `session` sees the file (a snapshot's view for a session mounting one).
    pub fn read_again(&mut self, session: SessionId, read: &PlannedRead) -> Result<Reply, p::OpError> {
        self.activity.reads_again += 1;
        let before = self.store.view();
        self.store.set_view(self.snapshot_of(session));
        let r = self.store.read(read.ino, read.offset, read.len);
        self.store.set_view(before);
        r.map(Reply::Data).map_err(|e| super::dispatch::store_error_out(&e))
    }
}
