//! The connection task and the blocking call API.
//!
//! Invariants:
//! - one connection carries every caller's requests; a request stays `pending` until its
//!   response arrives and is resent, with the same id, after a reconnect (a resumed
//!   session answers an already-applied one from its reply cache: exactly once);
//! - a change the server acknowledged but has not yet made durable stays in the
//!   `unstable` log, keyed by the server's apply order (`Response::seq`), until a
//!   response says it is durable. Each change has a place among the session's changes
//!   from when it first goes on the wire (`write_call`), and the server numbers changes
//!   as they arrive, so its place is its `seq`. If the server restarts, its welcome names
//!   the last durable `seq` and the places below it that had not run: unanswered changes
//!   placed at or below it otherwise were kept (not sent again); the lost acknowledged
//!   ones are replayed in the order they ran (their answers' order) before anything new,
//!   and the other unanswered ones follow as new work; so acknowledged work survives a
//!   server crash and none runs twice (`plan_restart`; tests/roundtrip.rs kills a server
//!   without a commit; server/tests/crash_sim.rs crashes it anywhere);
//! - the locks the session holds on the server are kept in a copy of the server's lock
//!   table for this session (`HeldLocks`), updated from each lock answer in wire order;
//!   after a restart they are taken again, behind the replays and before `Replayed`,
//!   while the server's grace period holds everyone else's requests (docs/protocol.md
//!   §4.5). A fenced session's locks are gone for good, and so is the copy.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{mpsc as std_mpsc, Arc, Condvar, Mutex, MutexGuard, OnceLock};
use std::time::Duration;

use crest_proto::{self as p, ClientMessage, FrameDecoder, ServerMessage};
use tokio::io::{AsyncReadExt, AsyncWriteExt, BufWriter};
use tokio::net::TcpStream;
use tokio::sync::mpsc;

mod merge;
mod replay;
#[cfg(test)]
mod tests;

use crest_client::held::HeldLocks;
pub use crest_client::replay::MAX_UNSTABLE_BYTES;
use crest_client::replay::{plan_restart, ReplayLog, Results, Unstable};
use merge::Merger;
use replay::{reply_lost, same_outcome, write_call};

/// Requests in flight at once (the server's reply cache holds more, so every retry is
/// still answered from it).
pub const MAX_IN_FLIGHT: usize = 1024;

/// How often the connection says it is alive when it has sent nothing else.
pub const HEARTBEAT: Duration = Duration::from_millis(p::timing::HEARTBEAT_MS);
pub use crest_client::lease::CLIENT_LEASE;
use crest_client::lease::{Lease, LEASE_CHECK};
/// Request id of heartbeats (empty requests; real ids start at 1).
const HEARTBEAT_ID: u64 = 0;

/// Bytes of writeback requests (`Client::submit`) in flight at once; a submitter waits
/// beyond this, which bounds what a client holds unacknowledged.
pub const MAX_ASYNC_BYTES: usize = 64 << 20;

/// Rights the server grants and recalls, told to the cache that relies on them. Called on
/// the connection thread **in the order the messages arrived**, before the response is
/// handed to its caller or the recall to `take_recalls`: so a grant and a later recall
/// of the same inode can never be applied the wrong way round. Must not block.
pub trait Rights: Send + Sync {
    /// A successful create (`Create`, `Symlink`, `CreateAt`, `SymlinkAt`) made `ino`, or
    /// an `Acquire` named it: the server counts this session as its exclusive holder — as
    /// of a moment after `sent` (the request was made then): a recall of `ino` told since
    /// `sent` may have ended it already.
    fn granted_exclusive(&self, ino: u64, sent: std::time::Instant);
    /// The server recalls whatever this session holds of `inodes`.
    fn recalled(&self, inodes: &[u64]);
    /// The server restarted (or forgot this session): it remembers no rights of it.
    fn reset(&self);
    /// The inodes this session holds rights on, with whether exclusively: after a server
    /// restart that restored the session they are re-asserted (`Op::Reassert`); one the
    /// server refuses is dropped through `recalled`.
    fn held(&self) -> Vec<(u64, bool)> {
        Vec::new()
    }
    /// The connection broke: stop answering from what is held under shared rights (a
    /// recall may be lost with it; a server that restarts meanwhile knows of no shared
    /// holder). Exclusive rights stay until the lease is over.
    fn disconnected(&self) {}
    /// A restarted server restored the session: keep only exclusive rights (shared copies
    /// may be stale — the server may have applied and kept changes whose recalls were
    /// unanswered when it died) and name them, to be re-asserted (`Op::Reassert`).
    fn restored(&self) -> Vec<(u64, bool)> {
        self.held()
    }
    /// A change the server applied and kept but never answered (it restarted first):
    /// whatever is held about what it touched is stale.
    fn reply_lost(&self, _ops: &[p::Op]) {}
}

/// The `Rights` hook of a client, installed once (`Client::set_rights`); until then
/// nothing is told.
type RightsHook = Arc<OnceLock<Arc<dyn Rights>>>;

/// How the client behaves.
#[derive(Clone, Debug)]
pub struct ClientOptions {
    /// Name the server logs for this client.
    pub client_name: String,
    /// How long a call waits (including reconnects) before failing with `Timeout`.
    pub op_timeout: Duration,
    /// How long the first connection may take.
    pub connect_timeout: Duration,
}

impl Default for ClientOptions {
    fn default() -> Self {
        ClientOptions {
            client_name: "crest-client".into(),
            op_timeout: Duration::from_secs(120),
            connect_timeout: Duration::from_secs(10),
        }
    }
}

/// Why a call failed as a whole (per-operation errors are in the results).
#[derive(Debug, thiserror::Error, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum ClientError {
    /// No response within the operation timeout (server away too long).
    #[error("no answer from {addr} within {secs} s")]
    Timeout {
        /// Server address.
        addr: String,
        /// Timeout.
        secs: u64,
    },
    /// The server refused the handshake.
    #[error("server {addr} refused the connection: {reason}")]
    Refused {
        /// Server address.
        addr: String,
        /// Its reason.
        reason: String,
    },
    /// Something answers at the address but it is not a crest server (its answer to the
    /// first handshake was no crest frame, or none came).
    #[error("{addr} is not a crest server: {detail}")]
    NotCrest {
        /// Server address.
        addr: String,
        /// What it did instead.
        detail: String,
    },
    /// Could not connect at all.
    #[error("cannot connect to {addr}: {detail}")]
    Connect {
        /// Server address.
        addr: String,
        /// The last error.
        detail: String,
    },
    /// The client was shut down.
    #[error("client is shut down")]
    Closed,
    /// The caller gave up waiting (its process has a signal to take: Ctrl-C, kill). The
    /// request may still run, as a call interrupted on an NFS `intr` mount may.
    #[error("interrupted while waiting for {addr}")]
    Interrupted {
        /// Server address.
        addr: String,
    },
    /// The server fenced this client's session (it was silent or away past its lease):
    /// the request was not applied, and will not be.
    #[error("{addr} fenced this client's session (its lease lapsed); the change was not applied")]
    Fenced {
        /// Server address.
        addr: String,
    },
    /// The server applied the change, made it durable and restarted before its answer
    /// went out: the change stands, its result is lost.
    #[error("{addr} restarted after applying the change, before answering; its result is lost")]
    ReplyLost {
        /// Server address.
        addr: String,
    },
}

impl ClientError {
    /// The errno a system call should see.
    pub fn errno(&self) -> i32 {
        match self {
            ClientError::Timeout { .. } => 110, // ETIMEDOUT
            ClientError::Refused { .. }
            | ClientError::NotCrest { .. }
            | ClientError::Connect { .. }
            | ClientError::Closed => 107, // ENOTCONN
            ClientError::Fenced { .. } | ClientError::ReplyLost { .. } => 5, // EIO
            ClientError::Interrupted { .. } => 4, // EINTR
        }
    }
}

/// A recall from the server (see `Client::take_recalls`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Recall {
    /// Answer with `Client::recall_done(recall_id)`.
    pub recall_id: u64,
    /// Inodes whose cached state must go.
    pub inodes: Vec<u64>,
}

/// What callers hand the connection task.
enum Outbound {
    Call(Call),
    RecallDone(u64),
    /// Say goodbye, then signal (the client is being dropped).
    Goodbye(std_mpsc::SyncSender<()>),
}

struct Call {
    id: u64,
    ops: Vec<p::Op>,
    time: Option<p::Time>,
    reply: Answer,
    /// When the call was made: no later than it was first sent. A recall that reached
    /// this client after it may have ended rights its reply grants (`Rights`).
    made: std::time::Instant,
    /// For a change: its place among the session's changes on the wire (see
    /// `write_call`), from when it was first written.
    pos: Option<u64>,
}

/// What a writeback submission runs when its response arrives (on the connection thread:
/// it must not block).
pub type Completion = Box<dyn FnOnce(Result<Results, ClientError>) + Send>;

/// Where a response goes: to a waiting caller, to a writeback completion, or — for
/// writeback submissions merged into one compound request — to each part's own answer.
enum Answer {
    Wait(std_mpsc::SyncSender<Result<Results, ClientError>>),
    Then(Completion, AsyncBudget, usize),
    Batch(Vec<Part>),
}

/// One submission inside a merged request: its results are `len` of them, after `skip`
/// results of the `Op::At` that set its clock.
struct Part {
    answer: Answer,
    skip: usize,
    len: usize,
}

impl Answer {
    fn send(self, r: Result<Results, ClientError>) {
        match self {
            Answer::Wait(tx) => {
                let _ = tx.try_send(r);
            }
            Answer::Then(done, budget, bytes) => {
                done(r);
                budget.release(bytes);
            }
            Answer::Batch(parts) => {
                let mut at = 0;
                for part in parts {
                    let mine = match &r {
                        Ok(results) => {
                            let from = (at + part.skip).min(results.len());
                            let to = (at + part.skip + part.len).min(results.len());
                            Ok(results[from..to].to_vec())
                        }
                        Err(e) => Err(e.clone()),
                    };
                    at += part.skip + part.len;
                    part.answer.send(mine);
                }
            }
        }
    }

    fn is_writeback(&self) -> bool {
        matches!(self, Answer::Then(..))
    }

    /// Writeback, alone or merged: its callers were answered before it was sent.
    fn answered_already(&self) -> bool {
        matches!(self, Answer::Then(..) | Answer::Batch(..))
    }
}

/// Most operations, and bytes of them, merged into one compound writeback request (well
/// inside `MAX_OPS_PER_REQUEST` and the frame limit).
const MAX_MERGED_OPS: usize = 512;
const MAX_MERGED_BYTES: usize = 2 << 20;

/// Writeback submissions held on the client before they go to the connection task: up
/// to this many, or this many bytes, or `HELD_FOR`, whichever comes first.
const HELD_MAX_CALLS: usize = 64;
const HELD_MAX_BYTES: usize = 1 << 20;
/// How long a writeback submission may wait on the client when nothing else is sent and
/// nobody waits for it (a recall answer, a sync call, `flush_writeback` ship it at once).
const HELD_FOR: Duration = Duration::from_millis(20);

/// Writeback submissions not yet handed to the connection task. Handing each over on its
/// own wakes that thread once per submission (an untar makes ~9 per file); held here,
/// they go over in one hand-off when something must go out — in order, ahead of it.
#[derive(Default)]
struct Held {
    calls: Vec<Outbound>,
    bytes: usize,
}

/// The client's side of the queue to its connection task: writeback submissions are
/// held, everything else goes at once behind them.
struct Outbox {
    tx: mpsc::UnboundedSender<Outbound>,
    held: Arc<Mutex<Held>>,
}

/// Hands `held`'s submissions to the connection task, in order; one the task can no
/// longer take (it ended) fails with `Closed`.
fn release_held(held: &mut Held, tx: &mpsc::UnboundedSender<Outbound>) {
    held.bytes = 0;
    for o in held.calls.drain(..) {
        if let Err(e) = tx.send(o) {
            if let Outbound::Call(c) = e.0 {
                c.reply.send(Err(ClientError::Closed));
            }
        }
    }
}

impl Outbox {
    fn held(&self) -> MutexGuard<'_, Held> {
        self.held.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Sends `o` now, after every held submission; false when the connection is gone.
    fn send(&self, o: Outbound) -> bool {
        let mut h = self.held();
        release_held(&mut h, &self.tx);
        self.tx.send(o).is_ok()
    }

    /// Holds a writeback submission (sends the batch when it is big enough).
    fn hold(&self, c: Call, bytes: usize) {
        let mut h = self.held();
        h.calls.push(Outbound::Call(c));
        h.bytes += bytes;
        if h.calls.len() >= HELD_MAX_CALLS || h.bytes >= HELD_MAX_BYTES {
            release_held(&mut h, &self.tx);
        }
    }

    fn flush(&self) {
        release_held(&mut self.held(), &self.tx);
    }
}

/// Ships held submissions every `HELD_FOR` (so a lone one is not held for long); ends
/// with the client.
async fn release_held_periodically(held: Arc<Mutex<Held>>, tx: mpsc::WeakUnboundedSender<Outbound>) {
    let mut tick = tokio::time::interval(HELD_FOR);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        let Some(tx) = tx.upgrade() else { return };
        let mut h = held.lock().unwrap_or_else(|e| e.into_inner());
        if !h.calls.is_empty() {
            release_held(&mut h, &tx);
        }
    }
}

/// Bytes of writeback in flight, with a condition variable for submitters that wait.
#[derive(Clone, Default)]
struct AsyncBudget(Arc<(Mutex<usize>, Condvar)>);

impl AsyncBudget {
    fn take(&self, bytes: usize) {
        let (lock, cvar) = &*self.0;
        let mut n = lock.lock().unwrap_or_else(|e| e.into_inner());
        while *n > 0 && *n + bytes > MAX_ASYNC_BYTES {
            n = cvar.wait(n).unwrap_or_else(|e| e.into_inner());
        }
        *n += bytes;
    }

    fn release(&self, bytes: usize) {
        let (lock, cvar) = &*self.0;
        let mut n = lock.lock().unwrap_or_else(|e| e.into_inner());
        *n = n.saturating_sub(bytes);
        cvar.notify_all();
    }
}

/// Room for one writeback submission, taken before the submitter locks its cache (taking
/// it may wait); dropped unused, it gives the room back.
pub struct AsyncPermit<'a> {
    client: &'a Client,
    bytes: usize,
    used: bool,
}

impl AsyncPermit<'_> {
    /// Sends `ops` (applied at the client's `time`) without waiting; `done` runs with the
    /// results when they arrive. The request may be held on the client for up to
    /// `HELD_FOR` (with others, to save the connection thread a wake-up each): anything
    /// sent after it — a call, a recall answer — and `Client::flush_writeback` ship it
    /// first. Never blocks, so it may be called under the caller's
    /// cache lock — which is what orders it before any recall answer the recall thread
    /// sends after taking that lock.
    pub fn submit(mut self, ops: Vec<p::Op>, time: p::Time, done: Completion) -> Result<(), ClientError> {
        self.used = true;
        let id = self.client.next_id.fetch_add(1, Ordering::Relaxed);
        let budget = self.client.budget.clone();
        let reply = Answer::Then(done, budget, self.bytes);
        let call = Call { id, ops, time: Some(time), reply, made: std::time::Instant::now(), pos: None };
        if self.client.out.tx.is_closed() {
            call.reply.send(Err(ClientError::Closed));
            return Err(ClientError::Closed);
        }
        self.client.out.hold(call, self.bytes);
        Ok(())
    }
}

impl Drop for AsyncPermit<'_> {
    fn drop(&mut self) {
        if !self.used {
            self.client.budget.release(self.bytes);
        }
    }
}

/// A call waits at least this long before its caller's interrupt check is asked: most
/// answers come well before, and an interrupted change may still run.
const INTERRUPTIBLE_AFTER: Duration = Duration::from_secs(1);
/// How often a waiting call asks the interrupt check after that.
const INTERRUPT_POLL: Duration = Duration::from_millis(200);

/// Whether the caller of a waiting call gave up (see `Client::set_interrupt_check`).
pub type InterruptCheck = Box<dyn Fn() -> bool + Send + Sync>;

/// A connection to one server, shared by every thread of a mount.
pub struct Client {
    interrupted: std::sync::OnceLock<InterruptCheck>,
    out: Outbox,
    recalls: Mutex<Option<std_mpsc::Receiver<Recall>>>,
    recalls_taken: Arc<AtomicBool>,
    /// Request ids, shared with the connection thread (which makes requests of its own:
    /// the locks it takes again after a restart).
    next_id: Arc<AtomicU64>,
    in_flight: Arc<(Mutex<usize>, Condvar)>,
    budget: AsyncBudget,
    rights: RightsHook,
    opts: ClientOptions,
    addr: String,
    fsid: [u8; 16],
}

impl std::fmt::Debug for Client {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Client").field("addr", &self.addr).finish()
    }
}

impl Client {
    /// Connects (waiting up to `connect_timeout` for the first handshake) and starts the
    /// connection thread.
    pub fn connect(addr: &str, opts: ClientOptions) -> Result<Client, ClientError> {
        let (tx, rx) = mpsc::unbounded_channel();
        let (ready_tx, ready_rx) = std_mpsc::sync_channel(1);
        let (recall_tx, recall_rx) = std_mpsc::channel();
        let recalls_taken = Arc::new(AtomicBool::new(false));
        let sink = RecallSink { tx: recall_tx, taken: recalls_taken.clone() };
        let task_addr = addr.to_string();
        let task_opts = opts.clone();
        let rights: RightsHook = Arc::default();
        let task_rights = rights.clone();
        let next_id = Arc::new(AtomicU64::new(1));
        let task_ids = next_id.clone();
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|e| ClientError::Connect { addr: addr.into(), detail: e.to_string() })?;
        let held = Arc::new(Mutex::new(Held::default()));
        let (task_held, weak_tx) = (held.clone(), tx.downgrade());
        std::thread::Builder::new()
            .name("crest-conn".into())
            .spawn(move || {
                rt.block_on(async move {
                    tokio::spawn(release_held_periodically(task_held, weak_tx));
                    run(task_addr, task_opts, rx, ready_tx, sink, task_rights, task_ids).await
                })
            })
            .map_err(|e| ClientError::Connect { addr: addr.into(), detail: e.to_string() })?;
        let fsid = match ready_rx.recv_timeout(opts.connect_timeout + Duration::from_secs(1)) {
            Ok(Ok(fsid)) => fsid,
            Ok(Err(e)) => return Err(e),
            Err(_) => return Err(ClientError::Connect { addr: addr.into(), detail: "timed out".into() }),
        };
        Ok(Client {
            interrupted: std::sync::OnceLock::new(),
            out: Outbox { tx, held },
            recalls: Mutex::new(Some(recall_rx)),
            recalls_taken,
            next_id,
            in_flight: Arc::new((Mutex::new(0), Condvar::new())),
            budget: AsyncBudget::default(),
            rights,
            opts,
            addr: addr.into(),
            fsid,
        })
    }

    /// Takes the stream of recalls (once). Whoever takes it must drop what each recall
    /// names from its caches and then call `recall_done`; until someone takes it the
    /// connection answers recalls itself at once (a client that caches nothing).
    pub fn take_recalls(&self) -> Option<std_mpsc::Receiver<Recall>> {
        let r = self.recalls.lock().unwrap_or_else(|e| e.into_inner()).take();
        if r.is_some() {
            self.recalls_taken.store(true, Ordering::SeqCst);
        }
        r
    }

    /// Ends the session cleanly: the server releases this client's open files and rights
    /// at once instead of waiting for them to time out. Waits up to a second.
    fn goodbye(&self) {
        let (done, rx) = std_mpsc::sync_channel(1);
        if self.out.send(Outbound::Goodbye(done)) {
            let _ = rx.recv_timeout(Duration::from_secs(1));
        }
    }

    /// Tells the server that recall `recall_id` is done. (Id 0 names rights the server
    /// refused to give back after a restart: dropped, but nobody waits for an answer.)
    pub fn recall_done(&self, recall_id: u64) {
        if recall_id != 0 {
            self.out.send(Outbound::RecallDone(recall_id));
        }
    }

    /// Ships every held writeback submission now (before waiting for one to complete).
    pub fn flush_writeback(&self) {
        self.out.flush();
    }

    /// The server's file system id.
    pub fn fsid(&self) -> [u8; 16] {
        self.fsid
    }

    /// The server address.
    pub fn addr(&self) -> &str {
        &self.addr
    }

    /// Installs the hook told about rights in wire order (once; false if one was set).
    pub fn set_rights(&self, rights: Arc<dyn Rights>) -> bool {
        self.rights.set(rights).is_ok()
    }

    /// Room for a writeback submission of about `bytes` (waits while `MAX_ASYNC_BYTES`
    /// are in flight).
    pub fn async_permit(&self, bytes: usize) -> AsyncPermit<'_> {
        let bytes = bytes + 128;
        self.budget.take(bytes);
        AsyncPermit { client: self, bytes, used: false }
    }

    /// Sends a compound request and waits for its results.
    pub fn call(&self, ops: Vec<p::Op>) -> Result<Results, ClientError> {
        let (lock, cvar) = &*self.in_flight;
        {
            let mut n = lock.lock().unwrap_or_else(|e| e.into_inner());
            while *n >= MAX_IN_FLIGHT {
                n = cvar.wait(n).unwrap_or_else(|e| e.into_inner());
            }
            *n += 1;
        }
        let result = self.call_inner(ops);
        let mut n = lock.lock().unwrap_or_else(|e| e.into_inner());
        *n -= 1;
        cvar.notify_one();
        result
    }

    fn call_inner(&self, ops: Vec<p::Op>) -> Result<Results, ClientError> {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let (reply, rx) = std_mpsc::sync_channel(1);
        let call = Call { id, ops, time: None, reply: Answer::Wait(reply), made: std::time::Instant::now(), pos: None };
        if !self.out.send(Outbound::Call(call)) {
            return Err(ClientError::Closed);
        }
        // A caller that waits long may be asked to stop: after `INTERRUPTIBLE_AFTER`, the
        // interrupt check (`set_interrupt_check`) is asked every `INTERRUPT_POLL`.
        let start = std::time::Instant::now();
        loop {
            let waited = start.elapsed();
            let Some(left) = self.opts.op_timeout.checked_sub(waited).filter(|d| !d.is_zero()) else {
                return Err(ClientError::Timeout { addr: self.addr.clone(), secs: self.opts.op_timeout.as_secs() });
            };
            let slice = if waited < INTERRUPTIBLE_AFTER { INTERRUPTIBLE_AFTER - waited } else { INTERRUPT_POLL };
            match rx.recv_timeout(left.min(slice)) {
                Ok(r) => return r,
                Err(std_mpsc::RecvTimeoutError::Timeout) => {
                    let check = self.interrupted.get();
                    if start.elapsed() >= INTERRUPTIBLE_AFTER && check.is_some_and(|f| f()) {
                        tracing::debug!(id, "caller interrupted after {:?}", start.elapsed());
                        return Err(ClientError::Interrupted { addr: self.addr.clone() });
                    }
                }
                Err(std_mpsc::RecvTimeoutError::Disconnected) => return Err(ClientError::Closed),
            }
        }
    }

    /// How a waiting call learns that its caller gave up (a signal to take): asked on the
    /// calling thread, once a call has waited `INTERRUPTIBLE_AFTER`. Set once.
    pub fn set_interrupt_check(&self, check: InterruptCheck) {
        let _ = self.interrupted.set(check);
    }

    /// One operation; errors flattened to an errno.
    pub fn call_one(&self, op: p::Op) -> Result<p::Reply, p::OpError> {
        match self.call(vec![op]) {
            Ok(mut r) => r.pop().unwrap_or_else(|| Err(p::OpError { errno: 5, message: "empty response".into() })),
            Err(e) => Err(p::OpError { errno: e.errno(), message: e.to_string() }),
        }
    }
}

impl Call {
    fn request(&self) -> p::Request {
        p::Request { id: self.id, ops: self.ops.clone(), time: self.time }
    }
}

/// Where recalls go: to whoever took them, else answered at once by the connection.
struct RecallSink {
    tx: std_mpsc::Sender<Recall>,
    taken: Arc<AtomicBool>,
}

impl RecallSink {
    /// False when nobody takes recalls (the caller answers it).
    fn deliver(&self, r: Recall) -> bool {
        self.taken.load(Ordering::SeqCst) && self.tx.send(r).is_ok()
    }
}

impl Drop for Client {
    fn drop(&mut self) {
        self.goodbye();
    }
}

async fn watch_lease(lease: Arc<Mutex<Lease>>, rights: RightsHook) {
    let mut tick = tokio::time::interval(LEASE_CHECK);
    loop {
        tick.tick().await;
        let lapsed = lease.lock().unwrap_or_else(|e| e.into_inner()).check(std::time::Instant::now());
        if lapsed {
            tracing::warn!("no word from the server for {CLIENT_LEASE:?}: dropping every cached right");
            if let Some(r) = rights.get() {
                r.reset();
            }
        }
    }
}

/// The session was fenced: nothing pending or unacknowledged-durable will be applied.
/// Changes and writeback completions are told (EIO), the replay log goes, and so does
/// every right and every lock (the server dropped them when it fenced the session).
/// Calls that change nothing stay pending, to go in the new session: the server answers
/// nothing of a fenced session, so such a call was merely early (a process that woke
/// the client from a stop sends one before the client hears of the fencing).
fn fenced(
    addr: &str,
    pending: &mut BTreeMap<u64, Call>,
    log: &mut ReplayLog,
    rights: &RightsHook,
    held: &mut HeldLocks,
) {
    let (keep, lost): (BTreeMap<u64, Call>, BTreeMap<u64, Call>) =
        std::mem::take(pending).into_iter().partition(|(_, c)| survives_fencing(c));
    *pending = keep;
    let lost_count = lost.len() + log.unstable.len() + log.replaying.len();
    tracing::error!("{addr} fenced this client's session: {lost_count} change(s) it had not made durable are lost");
    for (_, c) in lost {
        c.reply.send(Err(ClientError::Fenced { addr: addr.to_string() }));
    }
    *log = ReplayLog::default();
    let locks = held.table.len();
    if locks > 0 {
        tracing::error!("{addr} fenced this client's session: its {locks} lock(s) are lost");
    }
    held.clear();
    if let Some(r) = rights.get() {
        r.reset();
    }
}

/// Whether a call still pending when the session is fenced goes again in the next one:
/// one that changes nothing (reads, and the opens and releases a mount sends behind its
/// answers, which the server applies once per handle) is sent again, whoever waits for it;
/// a change is lost with the session, and so is a re-assert of its rights.
fn survives_fencing(c: &Call) -> bool {
    c.ops.iter().all(|o| !o.is_mutation() && !matches!(o, p::Op::Reassert { .. }))
}

/// Tells the rights hook what a response granted: exclusive rights on what it created,
/// and on a directory it acquired and everything in it.
fn grant_rights(rights: &RightsHook, ops: &[p::Op], results: &Results, sent: std::time::Instant) {
    let Some(r) = rights.get() else { return };
    for (op, res) in ops.iter().zip(results) {
        match (op, res) {
            (op, Ok(p::Reply::Entry(a))) if op.creates() => r.granted_exclusive(a.ino, sent),
            (p::Op::Acquire { ino }, Ok(p::Reply::Lookup { leaf, .. })) => {
                r.granted_exclusive(*ino, sent);
                for item in &leaf.items {
                    r.granted_exclusive(item.attr.ino, sent);
                }
            }
            _ => {}
        }
    }
}

fn write_frame(buf: &mut Vec<u8>, msg: &ClientMessage) {
    if let Err(e) = p::encode_frame(msg, buf) {
        tracing::error!("cannot encode a request: {e}");
    }
}

/// The connection loop: connect, handshake, resend what is pending, then move requests
/// and responses until the connection breaks; repeat.
async fn run(
    addr: String,
    opts: ClientOptions,
    mut calls: mpsc::UnboundedReceiver<Outbound>,
    ready: std_mpsc::SyncSender<Result<[u8; 16], ClientError>>,
    recalls: RecallSink,
    rights: RightsHook,
    next_id: Arc<AtomicU64>,
) {
    let mut pending: BTreeMap<u64, Call> = BTreeMap::new();
    let mut log = ReplayLog::default();
    let mut held = HeldLocks::default();
    // When the last fencing was learnt: writeback answered before it (still on its way
    // here: held on the client or queued) belongs to the fenced session and is failed, not
    // sent on the new one.
    let mut fenced_at: Option<std::time::Instant> = None;
    // How many changes of this session have gone on the wire (see `write_call`).
    let mut positions: u64 = 0;
    let mut session: Option<p::SessionToken> = None;
    let mut fsid: Option<[u8; 16]> = None;
    let mut backoff = Duration::from_millis(20);
    let started = tokio::time::Instant::now();
    // The lease is watched by a task of its own, so that it lapses on time whatever this
    // loop is waiting for (a connect, a handshake, a backoff, a full socket).
    let lease = Arc::new(Mutex::new(Lease::new(started.into_std())));
    tokio::spawn(watch_lease(lease.clone(), rights.clone()));
    let heard = || lease.lock().unwrap_or_else(|e| e.into_inner()).heard(std::time::Instant::now());
    loop {
        if session.is_some() {
            if let Some(r) = rights.get() {
                r.disconnected();
            }
        }
        let stream = match TcpStream::connect(&addr).await {
            Ok(s) => s,
            Err(e) => {
                if fsid.is_none() && started.elapsed() > opts.connect_timeout {
                    let _ = ready.try_send(Err(ClientError::Connect { addr: addr.clone(), detail: e.to_string() }));
                    return;
                }
                tracing::debug!("connect to {addr}: {e}; retrying in {backoff:?}");
                // Keep accepting calls while away so callers queue instead of failing.
                let sleep = tokio::time::sleep(backoff);
                tokio::pin!(sleep);
                loop {
                    tokio::select! {
                        _ = &mut sleep => break,
                        c = calls.recv() => match c {
                            Some(Outbound::Call(c)) => { pending.insert(c.id, c); }
                            // The new connection's session will not wait for it.
                            Some(Outbound::RecallDone(_)) => {}
                            Some(Outbound::Goodbye(_)) | None => return,
                        },
                    }
                }
                backoff = (backoff * 2).min(Duration::from_secs(1));
                continue;
            }
        };
        let _ = stream.set_nodelay(true);
        let (mut rd, wr) = stream.into_split();
        let mut wr = BufWriter::with_capacity(256 * 1024, wr);
        let mut out = Vec::new();
        let hello = p::Hello {
            magic: p::HELLO_MAGIC,
            version: p::PROTOCOL_VERSION,
            client_name: opts.client_name.clone(),
            resume: session,
        };
        write_frame(&mut out, &ClientMessage::Hello(hello));
        if wr.write_all(&out).await.is_err() || wr.flush().await.is_err() {
            continue;
        }
        out.clear();
        let mut decoder = FrameDecoder::new();
        let mut buf = vec![0u8; 256 * 1024];
        // Handshake. `why` says what went wrong, for a first connection that fails it.
        let mut why = String::new();
        let mut received = 0usize;
        let welcome = loop {
            match decoder.poll_message::<ServerMessage>() {
                Ok(Some(m)) => break Some(m),
                Ok(None) => {}
                Err(e) => {
                    tracing::warn!("bad handshake from {addr}: {e}");
                    why = format!("its answer to the handshake is not a crest frame ({e})");
                    break None;
                }
            }
            match tokio::time::timeout(Duration::from_secs(10), rd.read(&mut buf)).await {
                Ok(Ok(n)) if n > 0 => {
                    received += n;
                    decoder.handle_bytes(&buf[..n]);
                }
                Ok(Ok(_)) => {
                    why = format!("it closed the connection after {received} bytes, without a crest welcome");
                    break None;
                }
                Ok(Err(e)) => {
                    why = format!("reading its answer to the handshake: {e}");
                    break None;
                }
                Err(_) => {
                    why = format!("no crest welcome within 10 s ({received} bytes received)");
                    break None;
                }
            }
        };
        // Calls written again in their places during the handshake (not resent below).
        let mut rewritten = std::collections::HashSet::new();
        match welcome {
            Some(ServerMessage::Welcome(w)) => {
                heard();
                if w.fenced {
                    fenced(&addr, &mut pending, &mut log, &rights, &mut held);
                    fenced_at = Some(std::time::Instant::now());
                }
                if fsid.is_some_and(|f| f != w.fsid) {
                    tracing::error!("{addr} now serves another file system; failing pending calls");
                    held.clear();
                    for (_, c) in std::mem::take(&mut pending) {
                        c.reply.send(Err(ClientError::Refused {
                            addr: addr.clone(),
                            reason: "the server's file system changed".into(),
                        }));
                    }
                }
                if session.is_some() {
                    tracing::info!(resumed = w.resumed, pending = pending.len(), "reconnected to {addr}");
                    // After a restart, replay what did not survive it, oldest first. A
                    // server that forgot the session entirely knows nothing durable of it.
                    let through = match (w.resumed, w.durable_seq, w.fenced) {
                        (_, _, true) => None, // nothing of the old session may land now
                        (true, None, _) => None,
                        (true, Some(d), _) => Some(d),
                        (false, _, _) => Some(0),
                    };
                    // A restart that restored the session: the rights held are taken
                    // again while it replays, before anyone's new work runs (§4.5).
                    // A server that forgot the session gives nothing back.
                    let restored = w.resumed && w.durable_seq.is_some() && !w.fenced;
                    let mut rights_held = Vec::new();
                    // After a restart: unanswered changes that may never have run, in order.
                    let mut late: Vec<u64> = Vec::new();
                    if let Some(through) = through {
                        if let Some(r) = rights.get() {
                            if restored {
                                rights_held = r.restored();
                            } else {
                                r.reset();
                            }
                        }
                        // Every acknowledged change the server lost goes again, in the order
                        // they ran (their answers' order), before anything new. An unanswered
                        // one whose place the server kept was applied and is durable: not
                        // sent again (it would run twice). Any other unanswered one ran, if at
                        // all, after them: it goes as new work, after `Replayed` (run earlier,
                        // it could take what another client's replay needs).
                        let lost = log.take_lost(through, &w.durable_holes);
                        let placed: Vec<(u64, u64)> =
                            pending.values().filter_map(|c| c.pos.map(|p| (c.id, p))).collect();
                        let plan = plan_restart(through, &w.durable_holes, &placed);
                        for id in plan.kept {
                            if let Some(c) = pending.remove(&id) {
                                tracing::warn!(id, "{addr} restarted after applying a change, before answering it");
                                if let Some(r) = rights.get() {
                                    r.reply_lost(&c.ops);
                                }
                                reply_lost(c, &addr);
                            }
                        }
                        for &id in &plan.late {
                            if let Some(c) = pending.get_mut(&id) {
                                c.pos = None;
                            }
                        }
                        late = plan.late;
                        if !lost.is_empty() {
                            tracing::warn!("{addr} restarted: sending again {} change(s) it lost", lost.len());
                        }
                        positions = through;
                        for mut e in lost {
                            positions += 1;
                            e.pos = positions;
                            write_frame(&mut out, &ClientMessage::Request(e.request()));
                            log.replaying.push(e);
                        }
                    } else if !w.fenced {
                        // The same session: what may not have arrived goes again, changes
                        // in their places (a repeat is answered from the reply cache).
                        let mut again: Vec<(u64, p::Request)> =
                            log.replaying.iter().map(|e| (e.pos, e.request())).collect();
                        for c in pending.values() {
                            if let Some(p) = c.pos {
                                again.push((p, c.request()));
                                rewritten.insert(c.id);
                            }
                        }
                        again.sort_by_key(|(p, _)| *p);
                        for (_, req) in again {
                            write_frame(&mut out, &ClientMessage::Request(req));
                        }
                    }
                    // After a restart the server holds everyone's new work until every
                    // restored session has said its replays are all sent. The locks it
                    // held go with the replays: nobody else can take them meanwhile.
                    if through.is_some() {
                        for r in held.reassert(&rights_held, &next_id) {
                            write_frame(&mut out, &ClientMessage::Request(r));
                        }
                    } else if !w.fenced {
                        for r in held.resend() {
                            write_frame(&mut out, &ClientMessage::Request(r));
                        }
                    }
                    if restored {
                        // Writeback was answered already, under exclusive rights: like a
                        // replay it goes before `Replayed`, so that it runs ahead of the
                        // new work other clients have waiting — also when those rights
                        // were dropped meanwhile (a lease that ran out while away), and
                        // the server could not recall them first. Nobody else can have
                        // built on what it touches (they were held), and an unanswered
                        // call it overtakes had not returned.
                        let unwritten = pending.values().filter(|c| c.pos.is_none() && !late.contains(&c.id));
                        let mut early: Vec<u64> = late
                            .iter()
                            .copied()
                            .filter(|id| pending.get(id).is_some_and(|c| c.reply.answered_already()))
                            .collect();
                        early.extend(unwritten.filter(|c| c.reply.answered_already()).map(|c| c.id));
                        for id in early {
                            if let Some(c) = pending.get_mut(&id) {
                                write_call(c, &mut positions, &mut out);
                                rewritten.insert(id);
                            }
                        }
                        late.retain(|id| !rewritten.contains(id));
                    }
                    // Said again after every reconnect of a resumed session: the first
                    // `Replayed` may have been lost with the connection even when its
                    // replays and re-asserts were answered, and new work sent before it
                    // would be taken for replays and run inside the grace period. The
                    // server ignores it from a session not replaying.
                    if w.resumed && !w.fenced {
                        write_frame(&mut out, &ClientMessage::Replayed);
                    }
                    for id in late {
                        if let Some(c) = pending.get_mut(&id) {
                            write_call(c, &mut positions, &mut out);
                            rewritten.insert(id);
                        }
                    }
                }
                if w.fenced || session.is_none() {
                    positions = 0;
                }
                session = Some(w.session);
                if fsid.is_none() {
                    fsid = Some(w.fsid);
                    let _ = ready.try_send(Ok(w.fsid));
                }
                backoff = Duration::from_millis(20);
            }
            Some(ServerMessage::Refused { reason, .. }) => {
                let err = ClientError::Refused { addr: addr.clone(), reason };
                tracing::error!("{err}");
                let _ = ready.try_send(Err(err.clone()));
                for (_, c) in std::mem::take(&mut pending) {
                    c.reply.send(Err(err.clone()));
                }
                return;
            }
            other => {
                // The very first handshake failing means whatever answers at `addr` does
                // not speak crest (an sshd, a web server): say so at once rather than
                // retrying until the connect timeout. Once connected, a failed handshake
                // is a server restarting, and is retried.
                if fsid.is_none() {
                    if other.is_some() {
                        why = "its first message is not a welcome".into();
                    }
                    let err = ClientError::NotCrest { addr: addr.clone(), detail: why };
                    tracing::error!("{err}");
                    let _ = ready.try_send(Err(err.clone()));
                    for (_, c) in std::mem::take(&mut pending) {
                        c.reply.send(Err(err.clone()));
                    }
                    return;
                }
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(Duration::from_secs(1));
                continue;
            }
        }
        // Then everything else still waiting, in id order, with the same ids.
        for c in pending.values_mut() {
            if !rewritten.contains(&c.id) {
                write_call(c, &mut positions, &mut out);
            }
        }
        if wr.write_all(&out).await.is_err() || wr.flush().await.is_err() {
            continue;
        }
        out.clear();
        let mut beat = tokio::time::interval(HEARTBEAT);
        beat.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut last_sent = tokio::time::Instant::now();
        loop {
            tokio::select! {
                _ = beat.tick() => {
                    if last_sent.elapsed() >= HEARTBEAT {
                        // An empty request: the server renews the lease and answers.
                        write_frame(&mut out, &ClientMessage::Request(p::Request { id: HEARTBEAT_ID, ops: Vec::new(), time: None }));
                        let ok = wr.write_all(&out).await.is_ok() && wr.flush().await.is_ok();
                        out.clear();
                        last_sent = tokio::time::Instant::now();
                        if !ok {
                            break;
                        }
                    }
                }
                c = calls.recv() => {
                    last_sent = tokio::time::Instant::now();
                    let Some(c) = c else {
                        write_frame(&mut out, &ClientMessage::Goodbye);
                        let _ = wr.write_all(&out).await;
                        let _ = wr.flush().await;
                        return;
                    };
                    // Take whatever else is queued so one flush carries the burst, merging
                    // consecutive writeback submissions into compound requests.
                    let mut next = Some(c);
                    let mut merger = Merger::new();
                    let send = |mut c: Call, out: &mut Vec<u8>, pending: &mut BTreeMap<u64, Call>, positions: &mut u64| {
                        write_call(&mut c, positions, out);
                        pending.insert(c.id, c);
                    };
                    while let Some(c) = next.take().or_else(|| calls.try_recv().ok()) {
                        let c = match c {
                            Outbound::Call(c) if c.reply.is_writeback() && fenced_at.is_some_and(|f| c.made < f) => {
                                c.reply.send(Err(ClientError::Fenced { addr: addr.clone() }));
                                continue;
                            }
                            Outbound::Call(c) => match merger.offer(c) {
                                None => continue,
                                Some(c) => {
                                    if let Some(m) = merger.flush() {
                                        send(m, &mut out, &mut pending, &mut positions);
                                    }
                                    match merger.offer(c) {
                                        None => continue,
                                        Some(c) => Outbound::Call(c),
                                    }
                                }
                            },
                            other => {
                                if let Some(m) = merger.flush() {
                                    send(m, &mut out, &mut pending, &mut positions);
                                }
                                other
                            }
                        };
                        match c {
                            Outbound::Call(c) => send(c, &mut out, &mut pending, &mut positions),
                            Outbound::RecallDone(recall_id) => {
                                write_frame(&mut out, &ClientMessage::RecallDone { recall_id });
                            }
                            Outbound::Goodbye(done) => {
                                write_frame(&mut out, &ClientMessage::Goodbye);
                                let _ = wr.write_all(&out).await;
                                let _ = wr.flush().await;
                                let _ = done.try_send(());
                                return;
                            }
                        }
                    }
                    if let Some(m) = merger.flush() {
                        send(m, &mut out, &mut pending, &mut positions);
                    }
                    let ok = wr.write_all(&out).await.is_ok() && wr.flush().await.is_ok();
                    out.clear();
                    if !ok {
                        break;
                    }
                }
                r = rd.read(&mut buf) => {
                    match r {
                        Ok(n) if n > 0 => {
                            decoder.handle_bytes(&buf[..n]);
                            heard();
                        }
                        _ => {
                            tracing::warn!("connection to {addr} lost; {} requests pending", pending.len());
                            break;
                        }
                    }
                    let mut broken = false;
                    loop {
                        match decoder.poll_message::<ServerMessage>() {
                            Ok(Some(ServerMessage::Response(resp))) => {
                                if let Some(c) = pending.remove(&resp.id) {
                                    grant_rights(&rights, &c.ops, &resp.results, c.made);
                                    held.follow(&c.ops, &resp.results);
                                    if c.pos.is_some_and(|p| resp.seq != 0 && resp.seq != p) {
                                        tracing::error!(id = c.id, pos = ?c.pos, seq = resp.seq, "a change came back with another place than it was sent in");
                                    }
                                    let entry = Unstable {
                                        id: c.id,
                                        ops: c.ops,
                                        time: c.time,
                                        results: resp.results.clone(),
                                        pos: resp.seq,
                                        answered: 0,
                                    };
                                    log.acknowledged(resp.seq, entry);
                                    c.reply.send(Ok(resp.results));
                                } else if let Some(e) = log.replayed(resp.id) {
                                    if !same_outcome(&e.results, &resp.results) {
                                        tracing::error!(
                                            id = resp.id,
                                            "a replayed change came out differently: first {:?}, now {:?}",
                                            e.results,
                                            resp.results
                                        );
                                    }
                                    log.acknowledged(resp.seq, Unstable { results: resp.results, pos: resp.seq, ..e });
                                } else {
                                    let refused = held.answered(resp.id, &resp.results);
                                    if !refused.is_empty() {
                                        // As a recall nobody waits on: dropped here and in
                                        // the kernel (recall id 0 is never answered).
                                        if let Some(r) = rights.get() {
                                            r.recalled(&refused);
                                        }
                                        recalls.deliver(Recall { recall_id: 0, inodes: refused });
                                    }
                                }
                                log.durable(resp.durable);
                            }
                            Ok(Some(ServerMessage::Notify(p::Notify::Recall { recall_id, inodes }))) => {
                                if let Some(r) = rights.get() {
                                    r.recalled(&inodes);
                                }
                                if !recalls.deliver(Recall { recall_id, inodes }) {
                                    write_frame(&mut out, &ClientMessage::RecallDone { recall_id });
                                }
                            }
                            Ok(Some(ServerMessage::Notify(p::Notify::Fenced))) => {
                                fenced(&addr, &mut pending, &mut log, &rights, &mut held);
                    fenced_at = Some(std::time::Instant::now());
                                // A new session, not a resume of the fenced one.
                                session = None;
                                broken = true;
                                break;
                            }
                            Ok(Some(ServerMessage::Notify(n))) => tracing::info!("server notice: {n:?}"),
                            Ok(Some(other)) => {
                                tracing::warn!("unexpected message from {addr}: {other:?}");
                                broken = true;
                                break;
                            }
                            Ok(None) => break,
                            Err(e) => {
                                tracing::error!("bad frame from {addr}: {e}");
                                broken = true;
                                break;
                            }
                        }
                    }
                    if broken {
                        break;
                    }
                    // Recalls answered here go out at once.
                    if !out.is_empty() {
                        let ok = wr.write_all(&out).await.is_ok() && wr.flush().await.is_ok();
                        out.clear();
                        if !ok {
                            break;
                        }
                    }
                }
            }
        }
    }
}
