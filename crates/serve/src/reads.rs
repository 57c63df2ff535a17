//! Work done beside the store's thread: the sums of the blocks a write carries, computed
//! where its request is decoded (`write_sums`; the store records them for a write of
//! whole blocks), and big reads.
//!
//! Reads run beside the store's thread (`crest_server`'s `session/elsewhere.rs`): the core
//! hands out `Outgoing::Read`, a response whose data a `PlannedRead` still has to read;
//! here it is run on tokio's blocking pool (the page-cache copy and the checksums of a
//! read of up to 4 MiB), and the connection's writer waits for it in its place in the
//! session's queue, so nothing queued after it (a recall of the same file) overtakes it.
//! A plan that fails goes back to the store task (`Ctrl::ReadAgain`), which reads on its
//! own thread (repairing from a second copy, or answering the error).

use crest_proto::{self as p, Reply, ServerMessage};
use crest_server::{PlannedRead, SessionId};
use tokio::sync::{mpsc, oneshot};

use crate::{Ctrl, Outbox};
use crest_store::limits::BLOCK_SIZE;

/// Reads planned from this many bytes of the disk up (`Options::reads_elsewhere_from`).
/// Below, the hand-off to another thread and back adds more to a read's round trip than
/// the store's thread saves (with connection threads, +36 % at 256 KiB, +1-3 % at 512 KiB:
/// docs/performance.md, "Reads beside the store's thread").
pub const READS_ELSEWHERE_FROM: u64 = 512 * 1024;

/// Writes of at least this many bytes have their blocks summed where they are decoded
/// (below, the store's thread sums them as fast as it would look the list up).
pub const SUM_WRITES_FROM: usize = 64 * 1024;

/// For each op of `req`: the CRC-32C of each 4 KiB block of what it writes, if it is a
/// write of whole blocks of at least `SUM_WRITES_FROM` bytes (the only ones the store
/// takes sums for).
pub(crate) fn write_sums(req: &p::Request) -> crest_server::WriteSums {
    let mut any = false;
    let sums = req
        .ops
        .iter()
        .map(|op| match op {
            p::Op::Write { offset, data, .. } | p::Op::WriteBack { offset, data, .. }
                if data.len() >= SUM_WRITES_FROM
                    && offset.is_multiple_of(BLOCK_SIZE as u64)
                    && data.len().is_multiple_of(BLOCK_SIZE) =>
            {
                any = true;
                Some(crest_store::checksum::block_sums(data))
            }
            _ => None,
        })
        .collect();
    if any {
        sums
    } else {
        Vec::new()
    }
}

/// A message for a connection's writer: ready, or a read's response still being read.
pub(crate) enum Queued {
    Now(ServerMessage),
    Reading(oneshot::Receiver<ServerMessage>),
}

impl Queued {
    /// The message, once ready; `None` if its read was lost (the runtime is stopping).
    pub(crate) async fn ready(self) -> Option<ServerMessage> {
        match self {
            Queued::Now(m) => Some(m),
            Queued::Reading(rx) => rx.await.ok(),
        }
    }
}

impl Outbox {
    /// Queues `response`, whose data `read` reads on another thread.
    pub(crate) fn send_read(&self, session: SessionId, response: p::Response, read: PlannedRead) {
        // (Counted as it will be: the placeholder's frame plus the data and its length.)
        let bytes = p::encoded_len(&ServerMessage::Response(response.clone())) + read.len() + 8;
        self.backlog.answered(response.id);
        self.backlog.add(bytes);
        let (done, reading) = oneshot::channel();
        let ctrl = self.ctrl.clone();
        tokio::task::spawn_blocking(move || {
            let result = match read.run() {
                Some(bytes) => Ok(Reply::Data(bytes)),
                None => read_again(&ctrl, session, read),
            };
            let _ = done.send(ServerMessage::Response(PlannedRead::answer(response, result)));
        });
        if self.tx.send((bytes, Queued::Reading(reading))).is_err() {
            self.backlog.sent(bytes);
        }
    }
}

/// Asks the store task to read `read` on its thread (it failed here), and waits.
fn read_again(
    ctrl: &mpsc::WeakUnboundedSender<Ctrl>,
    session: SessionId,
    read: PlannedRead,
) -> Result<Reply, p::OpError> {
    let stopping = || p::OpError { errno: 5, message: "the server is stopping".into() };
    let ctrl = ctrl.upgrade().ok_or_else(stopping)?;
    let (reply, answer) = oneshot::channel();
    ctrl.send(Ctrl::ReadAgain { session, read, reply }).map_err(|_| stopping())?;
    drop(ctrl);
    answer.blocking_recv().unwrap_or_else(|_| Err(stopping()))
}

/// The bytes of file data `req` holds while it waits in the core (its writes') and that
/// its answer may carry (its reads', up to a frame): counted against its connection's
/// bound while it is unanswered, so that requests parked behind another session's rights
/// cannot hold, or release at once, more than that bound of data.
pub(crate) fn weight(req: &p::Request) -> usize {
    let mut asked = 0usize;
    let mut holds = 0usize;
    for op in &req.ops {
        match op {
            p::Op::Read { len, .. } => asked = asked.saturating_add(*len as usize),
            p::Op::Write { data, .. } | p::Op::Append { data, .. } | p::Op::WriteBack { data, .. } => {
                holds = holds.saturating_add(data.len())
            }
            _ => {}
        }
    }
    asked.min(p::MAX_FRAME_BYTES).saturating_add(holds)
}
