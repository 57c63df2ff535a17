//! The client's side of one session, sans-I/O, in the style of quinn-proto's
//! `Connection`: the driver hands it calls (`submit`), bytes (`handle_bytes`), breaks
//! (`connection_lost`) and the time (`handle_timeout`), and takes from it the bytes to
//! write (`poll_transmit`), when to wake it next (`poll_timeout`) and what to tell
//! callers (`poll_event`). It owns the pending table, the writeback batching, the replay
//! log and restart plan, the held locks, the lease and fencing; the rights it learns of
//! go to the `Rights` hook in the order the messages arrived.
//!
//! Invariants:
//! - one connection carries every caller's requests; a request stays `pending` until its
//!   response arrives and is resent, with the same id, after a reconnect (a resumed
//!   session answers an already-applied one from its reply cache: exactly once);
//! - a change the server acknowledged but has not yet made durable stays in the replay
//!   log, keyed by the server's apply order (`Response::seq`), until a response says it
//!   is durable. Each change has a place among the session's changes from when it first
//!   goes on the wire (`write_call`), and the server numbers changes as they arrive, so
//!   its place is its `seq`. After a server restart the welcome names the last durable
//!   `seq` and the places below it that had not run: unanswered changes placed at or
//!   below it otherwise were kept (not sent again); the lost acknowledged ones are
//!   replayed in the order they ran before anything new, and the other unanswered ones
//!   follow as new work (`welcome.rs`, `plan_restart`), so acknowledged work survives a
//!   server crash and none runs twice;
//! - the locks the session holds are kept in a copy of the server's lock table for this
//!   session (`HeldLocks`), updated from each lock answer in wire order; after a restart
//!   they are taken again, behind the replays and before `Replayed`, while the server's
//!   grace period holds everyone else's requests (docs/protocol.md §4.5). A fenced
//!   session's locks are gone for good, and so is the copy.

use std::collections::{BTreeMap, VecDeque};
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use crest_proto::{self as p, ClientMessage, FrameDecoder, ServerMessage};

use crate::held::HeldLocks;
use crate::lease::Lease;
use crate::replay::{ReplayLog, Results, Unstable};

mod error;
mod merge;
#[cfg(test)]
mod tests;
mod welcome;

pub use error::ClientError;
use merge::Merger;

/// How often the connection says it is alive when it has sent nothing else.
pub const HEARTBEAT: Duration = Duration::from_millis(p::timing::HEARTBEAT_MS);
/// Request id of heartbeats (empty requests; real ids start at 1).
const HEARTBEAT_ID: u64 = 0;
/// How long the first answer to a handshake may take, per read.
pub const HANDSHAKE_WAIT: Duration = Duration::from_secs(10);

/// Rights the server grants and recalls, told to the cache that relies on them **in the
/// order the messages arrived**, before the response is handed to its caller or the
/// recall to the recall thread: so a grant and a later recall of the same inode can never
/// be applied the wrong way round. Must not block.
pub trait Rights: Send + Sync {
    /// A successful create (`Create`, `Symlink`, `CreateAt`, `SymlinkAt`) made `ino`, or
    /// an `Acquire` named it: the server counts this session as its exclusive holder — as
    /// of a moment after `sent` (the request was made then): a recall of `ino` told since
    /// `sent` may have ended it already.
    fn granted_exclusive(&self, ino: u64, sent: Instant, now: Instant);
    /// The server recalls whatever this session holds of `inodes`.
    fn recalled(&self, inodes: &[u64], now: Instant);
    /// The server restarted (or forgot this session): it remembers no rights of it.
    fn reset(&self, now: Instant);
    /// The inodes this session holds rights on, with whether exclusively.
    fn held(&self, _now: Instant) -> Vec<(u64, bool)> {
        Vec::new()
    }
    /// The connection broke: stop answering from what is held under shared rights (a
    /// recall may be lost with it; a server that restarts meanwhile knows of no shared
    /// holder). Exclusive rights stay until the lease is over.
    fn disconnected(&self, _now: Instant) {}
    /// A restarted server restored the session: keep only exclusive rights (shared copies
    /// may be stale — the server may have applied and kept changes whose recalls were
    /// unanswered when it died) and name them, to be re-asserted (`Op::Reassert`); one the
    /// server refuses is dropped through `recalled`.
    fn restored(&self, now: Instant) -> Vec<(u64, bool)> {
        self.held(now)
    }
    /// A change the server applied and kept but never answered (it restarted first):
    /// whatever is held about what it touched is stale.
    fn reply_lost(&self, _ops: &[p::Op], _now: Instant) {}
}

/// The `Rights` hook of a connection, installed once; until then nothing is told.
pub type RightsHook = Arc<OnceLock<Arc<dyn Rights>>>;

/// A recall from the server: drop what it names, then answer with `recall_done`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Recall {
    /// The id to answer (0: rights the server refused after a restart; not answered).
    pub recall_id: u64,
    /// Inodes whose cached state must go.
    pub inodes: Vec<u64>,
}

/// Who waits for a call's answer: a caller, or a writeback completion (whose caller was
/// answered before it was sent); merged writeback answers each part.
pub enum Answer<R> {
    /// A caller waiting.
    Wait(R),
    /// A writeback submission (may be merged with its neighbours).
    Writeback(R),
    /// Writeback submissions merged into one request.
    Batch(Vec<Part<R>>),
}

/// One submission inside a merged request: its results are `len` of them, after `skip`
/// results of the `Op::At` that set its clock.
pub struct Part<R> {
    answer: Answer<R>,
    skip: usize,
    len: usize,
}

impl<R> Answer<R> {
    /// Tells whoever waits (each part of a batch its own results).
    fn send(self, r: Result<Results, ClientError>, events: &mut VecDeque<Event<R>>) {
        match self {
            Answer::Wait(x) | Answer::Writeback(x) => events.push_back(Event::Answer(x, r)),
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
                    part.answer.send(mine, events);
                }
            }
        }
    }

    fn is_writeback(&self) -> bool {
        matches!(self, Answer::Writeback(..))
    }

    /// Writeback, alone or merged: its callers were answered before it was sent.
    fn answered_already(&self) -> bool {
        matches!(self, Answer::Writeback(..) | Answer::Batch(..))
    }
}

/// A request and who waits for it.
pub struct Call<R> {
    /// Its request id (unique in the session; heartbeats are 0).
    pub id: u64,
    /// What it asks.
    pub ops: Vec<p::Op>,
    /// The client's clock for a writeback submission (the time its caller was answered).
    pub time: Option<p::Time>,
    /// Who waits.
    pub reply: Answer<R>,
    /// When the call was made: no later than it was first sent. A recall that reached
    /// this client after it may have ended rights its reply grants (`Rights`).
    pub made: Instant,
    /// For a change: its place among the session's changes on the wire (see
    /// `write_call`), from when it was first written.
    pos: Option<u64>,
    /// On whose behalf (`with_caller`; root unless said).
    pub caller: p::Caller,
}

impl<R> Call<R> {
    /// A call whose caller waits for `reply`.
    pub fn wait(id: u64, ops: Vec<p::Op>, made: Instant, reply: R) -> Call<R> {
        Call { id, ops, time: None, reply: Answer::Wait(reply), made, pos: None, caller: p::Caller::ROOT }
    }

    /// A writeback submission applied at the client's `time`.
    pub fn writeback(id: u64, ops: Vec<p::Op>, time: p::Time, made: Instant, reply: R) -> Call<R> {
        Call { id, ops, time: Some(time), reply: Answer::Writeback(reply), made, pos: None, caller: p::Caller::ROOT }
    }

    /// The call carries the client's clock `time` (applied at it, also when replayed).
    pub fn with_time(mut self, time: p::Time) -> Call<R> {
        self.time = Some(time);
        self
    }

    /// The call runs with `caller`'s credentials (also when replayed).
    pub fn with_caller(mut self, caller: p::Caller) -> Call<R> {
        self.caller = caller;
        self
    }

    fn request(&self) -> p::Request {
        p::Request { id: self.id, ops: self.ops.clone(), time: self.time, caller: self.caller.clone() }
    }

    /// Answers the call with `r` without sending it (it never reached a connection):
    /// whoever waits, each with its share.
    pub fn answer(self, r: Result<Results, ClientError>) -> Vec<(R, Result<Results, ClientError>)> {
        let mut events = VecDeque::new();
        self.reply.send(r, &mut events);
        events
            .into_iter()
            .filter_map(|e| match e {
                Event::Answer(x, r) => Some((x, r)),
                _ => None,
            })
            .collect()
    }
}

/// What the driver is to tell its callers, in order.
pub enum Event<R> {
    /// A call's answer.
    Answer(R, Result<Results, ClientError>),
    /// A recall: hand it to whoever drops cached state, or answer it at once
    /// (`recall_done`) if nobody caches.
    Recall(Recall),
    /// The first handshake's outcome: the server's file system id, or why not.
    Ready(Result<[u8; 16], ClientError>),
    /// Whom the server takes this session's callers for (`Welcome::identity`): at the
    /// first welcome, before `Ready`, and at every later one that says otherwise.
    Identity(p::IdentityMap),
}

/// Where the connection stands.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum State {
    /// No connection: the driver connects (after a backoff) and calls `connected`.
    Away,
    /// Hello sent, waiting for the welcome.
    Handshaking,
    /// Requests and answers flow.
    Open,
    /// Done for good (refused, not crest, goodbye said): the driver stops.
    Closed,
}

/// What a mount's connection is doing, for `crest status --mount` (`Connection::view`).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ConnView {
    /// "away", "handshaking", "open" or "closed".
    pub state: &'static str,
    /// The session's number once the server welcomed it.
    pub session: Option<u64>,
    /// The protocol version the last welcome was in.
    pub protocol: u32,
    /// The server's release that welcome named (empty from a server before protocol 14).
    pub server_release: String,
    /// Welcomes after the first (reconnects that resumed the session or began another).
    pub reconnects: u64,
    /// Calls waiting for their answers.
    pub waiting: usize,
    /// Changes answered but not yet durable (kept to replay after a server crash).
    pub unstable: usize,
    /// Bytes encoded and not yet written to the socket.
    pub queued_bytes: usize,
}

/// The client's side of a session.
pub struct Connection<R> {
    addr: String,
    client_name: String,
    /// The dataset the session mounts (empty: the server's default one).
    dataset: String,
    /// The dataset keeps no access times (`Welcome::noatime`).
    noatime: bool,
    /// What the last welcome said of whom the server takes this session's callers for.
    identity: Option<p::IdentityMap>,
    state: State,
    decoder: FrameDecoder,
    /// Bytes received during this handshake (for the message when it fails).
    received: usize,
    pending: BTreeMap<u64, Call<R>>,
    merger: Merger<R>,
    log: ReplayLog,
    held: HeldLocks,
    /// When the last fencing was learnt: writeback answered before it (still on its way
    /// here) belongs to the fenced session and is failed, not sent on the new one.
    fenced_at: Option<Instant>,
    /// How many changes of this session have gone on the wire (see `write_call`).
    positions: u64,
    /// After a restart that restored the session: the last place before its `Replayed`.
    /// Changes placed after it are new work, and go after `Replayed` on every reconnect:
    /// the server may still be in its grace period, running what comes before as replays.
    replayed_at: Option<u64>,
    /// After a restart that restored the session: above the ids of the calls pending at
    /// its `Replayed`. Calls below it answered here and without a place (opens and releases
    /// sent behind) went before `Replayed` then, as writeback does, and go there again on
    /// every reconnect: sent after it they could find their file reclaimed by the end of
    /// the grace period that `Replayed` brings.
    early_below: Option<u64>,
    session: Option<p::SessionToken>,
    fsid: Option<[u8; 16]>,
    /// The protocol version the next hello names: the newest this code speaks, or an older
    /// server's after it refused the newest (until a connection that was open is lost: the
    /// server may come back upgraded).
    hello_version: u32,
    /// What the last welcome said (`view`).
    welcomed: (u32, String),
    reconnects: u64,
    /// Request ids, shared with the callers that make calls; the core takes its own from
    /// it (the re-asserts after a restart).
    ids: Arc<AtomicU64>,
    rights: RightsHook,
    lease: Lease,
    last_sent: Instant,
    now: Instant,
    out: Vec<u8>,
    /// A written buffer given back (`recycle`), where the next bytes to send go: a big
    /// write's frame lands in memory already mapped, not in pages faulted in afresh for
    /// each request (a fault per 4 KiB sent cost the connection thread more than TLS).
    spare: Vec<u8>,
    events: VecDeque<Event<R>>,
}

/// The largest buffer `recycle` keeps (a driver sends what it has once past ~8 MiB,
/// `crest_net`'s BURST_BYTES, plus one frame); the buffers go when the connection idles
/// for a heartbeat.
const SPARE_MAX_BYTES: usize = 24 << 20;

impl<R> Connection<R> {
    /// Whether the mounted dataset keeps no access times (as the last welcome said).
    pub fn noatime(&self) -> bool {
        self.noatime
    }

    /// Mounts dataset `name` (by default the server's default dataset).
    pub fn with_dataset(mut self, name: &str) -> Self {
        self.dataset = name.to_string();
        self
    }

    /// A connection not yet connected, at `now`.
    pub fn new(addr: &str, client_name: &str, ids: Arc<AtomicU64>, rights: RightsHook, now: Instant) -> Self {
        Connection {
            addr: addr.to_string(),
            // (A mount's name holds its path, which can be longer than a hello may carry.)
            client_name: p::clip_client_name(client_name),
            dataset: String::new(),
            noatime: false,
            identity: None,
            state: State::Away,
            decoder: FrameDecoder::new(),
            received: 0,
            pending: BTreeMap::new(),
            merger: Merger::new(),
            log: ReplayLog::default(),
            held: HeldLocks::default(),
            fenced_at: None,
            positions: 0,
            replayed_at: None,
            early_below: None,
            session: None,
            fsid: None,
            hello_version: p::PROTOCOL_VERSION,
            welcomed: (0, String::new()),
            reconnects: 0,
            ids,
            rights,
            lease: Lease::new(now),
            last_sent: now,
            now,
            out: Vec::new(),
            spare: Vec::new(),
            events: VecDeque::new(),
        }
    }

    /// Where the connection stands.
    pub fn state(&self) -> State {
        self.state
    }

    /// True once a handshake succeeded (the server's file system is known).
    pub fn has_connected(&self) -> bool {
        self.fsid.is_some()
    }

    /// Whether request `id` still waits for an answer (pending, or a replay in flight).
    pub fn awaits(&self, id: u64) -> bool {
        self.pending.contains_key(&id) || self.log.replaying.iter().any(|e| e.id == id)
    }

    /// The place among the session's changes request `id` went out in, if it is a change
    /// still waiting: the `seq` its answer must carry.
    pub fn place(&self, id: u64) -> Option<u64> {
        match self.pending.get(&id) {
            Some(c) => c.pos,
            None => self.log.replaying.iter().find(|e| e.id == id).map(|e| e.pos),
        }
    }

    /// Acknowledged changes not yet durable (kept to replay), and replays in flight.
    pub fn unstable(&self) -> usize {
        self.log.unstable.len() + self.log.replaying.len()
    }

    /// What the connection is doing now.
    pub fn view(&self) -> ConnView {
        ConnView {
            state: match self.state {
                State::Away => "away",
                State::Handshaking => "handshaking",
                State::Open => "open",
                State::Closed => "closed",
            },
            session: self.session.map(|t| t.id),
            protocol: self.welcomed.0,
            server_release: self.welcomed.1.clone(),
            reconnects: self.reconnects,
            waiting: self.waiting(),
            unstable: self.unstable(),
            queued_bytes: self.queued_bytes(),
        }
    }

    /// Requests still to be answered: pending calls and replays in flight.
    pub fn waiting(&self) -> usize {
        self.pending.len() + self.log.replaying.len()
    }

    fn rights(&self) -> Option<&Arc<dyn Rights>> {
        self.rights.get()
    }

    fn write(&mut self, msg: &ClientMessage) {
        if let Err(e) = p::encode_frame(msg, &mut self.out) {
            tracing::error!("cannot encode a request: {e}");
        }
    }

    /// Writes `c`'s request, giving a change its place among the session's changes when
    /// it first goes on the wire. The server numbers a session's changes as they arrive
    /// (parked or not), so the change in place n is the one it answers with `seq` n, and
    /// after a restart the welcome's `durable_seq` and `durable_holes` tell which
    /// unanswered changes it applied and kept (docs/protocol.md §4.5).
    fn write_call(&mut self, id: u64) {
        let Some(c) = self.pending.get_mut(&id) else { return };
        if c.pos.is_none() && c.ops.iter().any(p::Op::is_mutation) {
            self.positions += 1;
            c.pos = Some(self.positions);
        }
        let req = c.request();
        self.write(&ClientMessage::Request(req));
    }

    fn send_call(&mut self, c: Call<R>) {
        let id = c.id;
        self.pending.insert(id, c);
        self.write_call(id);
    }

    /// A new attempt to connect begins: a session that had a connection has lost it.
    pub fn connecting(&mut self, now: Instant) {
        self.now = now;
        self.flush_merger();
        if self.session.is_some() {
            if let Some(r) = self.rights() {
                r.disconnected(self.now);
            }
        }
        self.state = State::Away;
        self.out.clear();
    }

    /// A connection is up: the hello goes first (resuming the session if there is one).
    pub fn connected(&mut self, now: Instant) {
        self.now = now;
        // (Not a word from the server: a connection that opens to a server that says
        // nothing must not renew the lease.)
        self.state = State::Handshaking;
        self.decoder = FrameDecoder::new();
        self.received = 0;
        self.out.clear();
        let hello = p::Hello {
            magic: p::HELLO_MAGIC,
            version: self.hello_version,
            client_name: self.client_name.clone(),
            resume: self.session,
            dataset: self.dataset.clone(),
        };
        self.write(&ClientMessage::Hello(hello));
    }

    /// Ends everything: every call waiting is answered with `err`, and so is the first
    /// handshake if it was still to come.
    pub fn fail(&mut self, err: ClientError) {
        tracing::error!("{err}");
        if self.fsid.is_none() {
            self.events.push_back(Event::Ready(Err(err.clone())));
        }
        self.flush_merger();
        for (_, c) in std::mem::take(&mut self.pending) {
            c.reply.send(Err(err.clone()), &mut self.events);
        }
        self.state = State::Closed;
        // Nothing wakes a closed connection again (its lease is never checked): what the
        // mount held under it goes now.
        if let Some(r) = self.rights() {
            r.reset(self.now);
        }
    }

    /// A call to send: written now if the connection is open (writeback may wait in the
    /// batch until `end_burst`), else kept until it is.
    pub fn submit(&mut self, c: Call<R>, now: Instant) {
        self.now = now;
        for op in &c.ops {
            if let p::Op::Release { ino, handle } = *op {
                self.held.releasing(ino, handle);
            }
        }
        if c.reply.is_writeback() && self.fenced_at.is_some_and(|f| c.made < f) {
            c.reply.send(Err(ClientError::Fenced { addr: self.addr.clone() }), &mut self.events);
            return;
        }
        if self.state == State::Closed {
            c.reply.send(Err(ClientError::Closed), &mut self.events);
            return;
        }
        if self.state != State::Open {
            self.pending.insert(c.id, c);
            return;
        }
        // Consecutive writeback submissions of one burst merge into compound requests.
        let Some(c) = self.merger.offer(c) else { return };
        self.flush_merger();
        if let Some(c) = self.merger.offer(c) {
            self.send_call(c);
        }
    }

    fn flush_merger(&mut self) {
        if let Some(m) = self.merger.flush() {
            if self.state == State::Open {
                self.send_call(m);
            } else {
                self.pending.insert(m.id, m);
            }
        }
    }

    /// The burst of submissions the driver had queued is over: the batch goes out.
    pub fn end_burst(&mut self) {
        self.flush_merger();
    }

    /// Recall `recall_id` is done (id 0 is never answered). Dropped when the connection
    /// is down: the next one's session does not wait for it.
    pub fn recall_done(&mut self, recall_id: u64) {
        if recall_id != 0 && self.state == State::Open {
            self.flush_merger();
            self.write(&ClientMessage::RecallDone { recall_id });
        }
    }

    /// Ends the session cleanly: the server releases its open files and rights at once.
    pub fn goodbye(&mut self) {
        self.flush_merger();
        if self.state == State::Open {
            self.write(&ClientMessage::Goodbye);
        }
        self.state = State::Closed;
    }

    /// The time is `now`: the lease may have run out (every right goes), a heartbeat may
    /// be due.
    pub fn handle_timeout(&mut self, now: Instant) {
        self.now = now;
        if self.lease.check(now) {
            tracing::warn!("no word from the server for {:?}: dropping every cached right", crate::lease::CLIENT_LEASE);
            if let Some(r) = self.rights() {
                r.reset(self.now);
            }
        }
        if self.state == State::Open && now.saturating_duration_since(self.last_sent) >= HEARTBEAT {
            // An empty request: the server renews the lease and answers. It counts as sent
            // now, so the next one is due a heartbeat later even while the driver's write
            // is stuck (a server that stopped reading); one waiting is enough.
            if self.out.is_empty() {
                // Idle for a heartbeat: what a burst of big writes left to reuse goes back.
                self.spare = Vec::new();
                self.out = Vec::new();
                self.write(&ClientMessage::Request(p::Request {
                    id: HEARTBEAT_ID,
                    ops: Vec::new(),
                    time: None,
                    caller: p::Caller::ROOT,
                }));
            }
            self.last_sent = now;
        }
    }

    /// When `handle_timeout` is due next.
    pub fn poll_timeout(&self) -> Instant {
        let lease = self.lease.deadline().unwrap_or(self.now + HEARTBEAT);
        if self.state == State::Open {
            lease.min(self.last_sent + HEARTBEAT)
        } else {
            lease
        }
    }

    /// The bytes to write now (empty when there are none); what is taken counts as sent.
    pub fn poll_transmit(&mut self) -> Vec<u8> {
        if self.out.is_empty() {
            return Vec::new();
        }
        self.last_sent = self.now;
        std::mem::replace(&mut self.out, std::mem::take(&mut self.spare))
    }

    /// Bytes encoded and not yet taken by `poll_transmit`.
    pub fn queued_bytes(&self) -> usize {
        self.out.len()
    }

    /// Gives back a buffer `poll_transmit` returned, once written, for the bytes after it
    /// (up to `SPARE_MAX_BYTES`): two buffers take turns, one written while the other
    /// fills.
    pub fn recycle(&mut self, mut buf: Vec<u8>) {
        if buf.capacity() > SPARE_MAX_BYTES {
            return;
        }
        buf.clear();
        if self.out.is_empty() && buf.capacity() > self.out.capacity() {
            self.out = buf;
        } else if buf.capacity() > self.spare.capacity() {
            self.spare = buf;
        }
    }

    /// The next thing to tell a caller.
    pub fn poll_event(&mut self) -> Option<Event<R>> {
        self.events.pop_front()
    }

    /// Bytes arrived (none: the server closed the connection).
    pub fn handle_bytes(&mut self, now: Instant, bytes: &[u8]) {
        self.decoder.spare(bytes.len()).copy_from_slice(bytes);
        self.handle_read(now, bytes.len());
    }

    /// Room for the next bytes from the server (at most `max`, sized by the reads before:
    /// `FrameDecoder::read_room`), to read into: the driver reads straight into the frame
    /// decoder (a big read's data is not copied once more), then says how many came
    /// (`handle_read`).
    pub fn read_room(&mut self, max: usize) -> &mut [u8] {
        self.decoder.read_room(max)
    }

    /// `n` bytes came into `read_room`'s room (0: the server closed the connection); as
    /// `handle_bytes`.
    pub fn handle_read(&mut self, now: Instant, n: usize) {
        self.now = now;
        if n == 0 {
            if self.state == State::Handshaking {
                let why = format!("it closed the connection after {} bytes, without a crest welcome", self.received);
                return self.handshake_failed(why);
            }
            return self.connection_lost("the server closed it");
        }
        // Only a crest server's words renew the lease: the welcome (`welcome.rs`) and what
        // follows it, not a refusal or a stranger answering on the port.
        if self.state == State::Open {
            self.lease.heard(now);
        }
        self.received += n;
        self.decoder.filled(n);
        while matches!(self.state, State::Handshaking | State::Open) {
            match self.decoder.poll_message::<ServerMessage>() {
                Ok(Some(m)) if self.state == State::Handshaking => self.handshake(m),
                Ok(Some(m)) => self.handle_message(m),
                Ok(None) => break,
                Err(e) if self.state == State::Handshaking => {
                    tracing::warn!("bad handshake from {}: {e}", self.addr);
                    let why = format!("its answer to the handshake is not a crest frame ({e})");
                    self.handshake_failed(why);
                }
                Err(e) => {
                    tracing::error!("bad frame from {}: {e}", self.addr);
                    self.lost();
                }
            }
        }
    }

    /// No answer to the handshake within `HANDSHAKE_WAIT`.
    pub fn handshake_timeout(&mut self) {
        if self.state == State::Handshaking {
            let why = format!("no crest welcome within {HANDSHAKE_WAIT:?} ({} bytes received)", self.received);
            self.handshake_failed(why);
        }
    }

    /// The connection failed (a read or write error, or the peer closed it).
    pub fn connection_lost(&mut self, why: &str) {
        match self.state {
            State::Handshaking => self.handshake_failed(format!("the connection failed during the handshake: {why}")),
            State::Open => {
                tracing::warn!("connection to {} lost ({why}); {} requests pending", self.addr, self.pending.len());
                self.lost();
            }
            State::Away | State::Closed => {}
        }
    }

    /// The open connection is gone: what is held under shared rights stops being
    /// answered from at once (a recall may be lost with it), not at the next attempt.
    ///
    /// So do exclusive rights re-asserted after a restart whose answer has not come: it
    /// may have refused them (another session holds the inode), and the server, its
    /// grace period over, lets others change what they cover. They are dropped as a
    /// refused re-assert is, and not asked again (a server that gave them back recalls
    /// them, answered at once).
    fn lost(&mut self) {
        self.state = State::Away;
        self.hello_version = p::PROTOCOL_VERSION;
        let unsure = self.held.unconfirmed_rights();
        if let Some(r) = self.rights() {
            r.disconnected(self.now);
            if !unsure.is_empty() {
                r.recalled(&unsure, self.now);
            }
        }
        if !unsure.is_empty() {
            tracing::warn!(inodes = ?unsure, "re-asserted rights unanswered when the connection went: dropped");
            self.events.push_back(Event::Recall(Recall { recall_id: 0, inodes: unsure }));
        }
    }

    /// The very first handshake failing means whatever answers at the address does not
    /// speak crest (an sshd, a web server): said at once rather than retried until the
    /// connect timeout. Once connected, a failed handshake is a server restarting.
    fn handshake_failed(&mut self, why: String) {
        if self.fsid.is_none() {
            self.fail(ClientError::NotCrest { addr: self.addr.clone(), detail: why });
        } else {
            self.state = State::Away;
        }
    }

    /// One message on an open connection.
    fn handle_message(&mut self, m: ServerMessage) {
        match m {
            ServerMessage::Response(resp) => self.handle_response(resp),
            ServerMessage::Notify(p::Notify::Recall { recall_id, inodes }) => {
                if let Some(r) = self.rights() {
                    r.recalled(&inodes, self.now);
                }
                self.events.push_back(Event::Recall(Recall { recall_id, inodes }));
            }
            ServerMessage::Notify(p::Notify::RecallPart { inodes, .. }) => {
                // Dropped now; answered with the final part (id 0: no answer).
                if let Some(r) = self.rights() {
                    r.recalled(&inodes, self.now);
                }
                self.events.push_back(Event::Recall(Recall { recall_id: 0, inodes }));
            }
            ServerMessage::Notify(p::Notify::Fenced) => {
                self.fenced();
                // A new session, not a resume of the fenced one.
                self.session = None;
                self.state = State::Away;
            }
            ServerMessage::Notify(n) => tracing::info!("server notice: {n:?}"),
            other => {
                tracing::warn!("unexpected message from {}: {other:?}", self.addr);
                self.lost();
            }
        }
    }

    fn handle_response(&mut self, resp: p::Response) {
        if let Some(c) = self.pending.remove(&resp.id) {
            self.grant_rights(&c.ops, &resp.results, c.made);
            self.held.follow(&c.ops, &resp.results, c.id);
            if c.pos.is_some_and(|p| resp.seq != 0 && resp.seq != p) {
                tracing::error!(id = c.id, pos = ?c.pos, seq = resp.seq, "a change came back with another place than it was sent in");
            }
            let entry = Unstable {
                id: c.id,
                ops: c.ops,
                // (Replayed at the time it first ran: it comes out the same.)
                time: resp.time.or(c.time),
                caller: c.caller,
                results: resp.results.clone(),
                pos: resp.seq,
                answered: 0,
            };
            self.log.acknowledged(resp.seq, entry);
            c.reply.send(Ok(resp.results), &mut self.events);
        } else if let Some(e) = self.log.replayed(resp.id) {
            if !welcome::same_outcome(&e.results, &resp.results) {
                tracing::error!(
                    id = resp.id,
                    "a replayed change came out differently: first {:?}, now {:?}",
                    e.results,
                    resp.results
                );
            }
            self.log.acknowledged_replay(resp.seq, Unstable { results: resp.results, pos: resp.seq, ..e });
        } else {
            let refused = self.held.answered(resp.id, &resp.results);
            if !refused.is_empty() {
                // As a recall nobody waits on: dropped here and in the kernel (recall id
                // 0 is never answered).
                if let Some(r) = self.rights() {
                    r.recalled(&refused, self.now);
                }
                self.events.push_back(Event::Recall(Recall { recall_id: 0, inodes: refused }));
            }
        }
        let kept = self.log.unstable.len();
        self.log.durable(resp.durable);
        // (Only when changes became durable: the oldest change is a walk over the log,
        // too long to take at every answer. Writeback not yet answered goes again too.)
        if self.log.unstable.len() != kept && !self.held.released.is_empty() {
            let writeback = self.pending.values().filter(|c| c.reply.answered_already()).map(|c| c.id);
            let oldest = self.log.oldest_id().into_iter().chain(writeback).min();
            self.held.forget_released(oldest);
        }
    }

    /// Tells the rights hook what a response granted: exclusive rights on what it
    /// created, and on a directory it acquired and everything in it.
    fn grant_rights(&self, ops: &[p::Op], results: &Results, sent: Instant) {
        let Some(r) = self.rights() else { return };
        for (op, res) in ops.iter().zip(results) {
            match (op, res) {
                (op, Ok(p::Reply::Entry(a))) if op.creates() => r.granted_exclusive(a.ino, sent, self.now),
                (p::Op::Acquire { ino }, Ok(p::Reply::Lookup { leaf, .. })) => {
                    r.granted_exclusive(*ino, sent, self.now);
                    for item in &leaf.items {
                        r.granted_exclusive(item.attr.ino, sent, self.now);
                    }
                }
                _ => {}
            }
        }
    }

    /// The session was fenced: nothing pending or unacknowledged-durable will be applied.
    /// Changes and writeback completions are told (EIO), the replay log goes, and so does
    /// every right and every lock (the server dropped them when it fenced the session).
    /// Calls that change nothing stay pending, to go in the new session: the server
    /// answers nothing of a fenced session, so such a call was merely early (a process
    /// that woke the client from a stop sends one before the client hears of it).
    fn fenced(&mut self) {
        self.fenced_at = Some(self.now);
        self.flush_merger();
        let (keep, lost): (BTreeMap<u64, Call<R>>, BTreeMap<u64, Call<R>>) =
            std::mem::take(&mut self.pending).into_iter().partition(|(_, c)| survives_fencing(c));
        self.pending = keep;
        let lost_count = lost.len() + self.log.unstable.len() + self.log.replaying.len();
        tracing::error!(
            "{} fenced this client's session: {lost_count} change(s) it had not made durable are lost",
            self.addr
        );
        for (_, c) in lost {
            c.reply.send(Err(ClientError::Fenced { addr: self.addr.clone() }), &mut self.events);
        }
        self.log = ReplayLog::default();
        let locks = self.held.table.len();
        if locks > 0 {
            tracing::error!("{} fenced this client's session: its {locks} lock(s) are lost", self.addr);
        }
        self.held.clear();
        if let Some(r) = self.rights() {
            r.reset(self.now);
        }
    }
}

/// Whether a call still pending when the session is fenced goes again in the next one:
/// one that changes nothing (reads, and the opens and releases a mount sends behind its
/// answers, which the server applies once per handle) is sent again, whoever waits for
/// it; a change is lost with the session, and so is a re-assert of its rights.
fn survives_fencing<R>(c: &Call<R>) -> bool {
    c.ops.iter().all(|o| !o.is_mutation() && !matches!(o, p::Op::Reassert { .. }))
}
