//! Sessions, the reply cache and the dispatch of operations to the store.

use std::collections::{BTreeMap, HashMap, HashSet, VecDeque};

use crest_proto::{self as p, Op, Reply};
use crest_store::{self as s, Store};

use crate::acl;
use crate::caps::{Caps, Outgoing};
use crate::convert::{attr_out, error_out, kind_in, time_in};
use crate::locks::{self, LockTable};
use crate::space::SpaceWatch;

/// Responses each session remembers for retries.
pub const REPLY_CACHE_ENTRIES: usize = 4096;
/// Most distinct name hashes (about: entries) around the looked-up name a lookup reply
/// carries from its directory leaf.
pub const LOOKUP_NEIGHBOURS: usize = 64;
/// Most items one readdir reply carries.
pub const READDIR_MAX_ITEMS: u32 = 1024;

/// Bytes of file data written since the last commit that make the server commit: bounds
/// both what a crash can lose and what clients keep for replay.
pub const COMMIT_AFTER_WRITTEN_BYTES: u64 = 64 << 20;
/// How long a session restored from its record after a restart waits for its client to
/// come back before its record is dropped.
pub const RESTORED_SESSION_GRACE_MS: u64 = 15 * 60 * 1000;
/// Stands for the inode-number counter among inodes changed (no inode has number 0):
/// creates and `AllocInodes` change it.
const ALLOCATOR: u64 = 0;

/// A session number.
pub type SessionId = u64;

/// No session (ids start at 1): recalls the server makes on its own behalf.
const NO_SESSION: SessionId = 0;

#[derive(Debug, Default)]
struct Session {
    secret: u64,
    client_name: String,
    replies: HashMap<u64, p::Response>,
    order: VecDeque<u64>,
    /// Handles this session holds open, by inode (released when the session ends).
    open: HashMap<u64, HashSet<u64>>,
    /// Changing requests numbered so far (the last one's `seq`): a change takes its `seq`
    /// when it arrives, so that `seq` is its place in the order the client sent them,
    /// even when it is parked and runs after later ones (docs/protocol.md §4.5).
    applied: u64,
    /// The highest `seq` of a change that has run.
    top: u64,
    /// Changes that arrived and wait (parked) with the `seq` each took, by request id.
    reserved: BTreeMap<u64, u64>,
    /// Changes run through `Server::handle`, counted.
    ran: u64,
    /// Changes run whose responses have not gone out: request id → when it ran.
    run_order: HashMap<u64, u64>,
    /// Their responses that are ready, by when they ran (waiting for earlier ones).
    unreleased: BTreeMap<u64, p::Response>,
    /// The last `top` known to be committed (changes up to it have run and are durable,
    /// but for `holes`).
    durable: u64,
    /// After a restart: places at or below `durable` whose changes never ran (they waited
    /// when the last commit was made), from the record.
    holes: Vec<u64>,
    /// Restored from its record after a restart and not yet resumed by its client;
    /// dropped at this time (set on the first tick) if the client never comes back.
    awaiting_resume: Option<Option<u64>>,
    /// Resumed after a restart, and nothing heard from it since its hello: its welcome
    /// (with `durable_seq` and `holes`) may have been lost with the connection, so a
    /// second resume is told the same again — else its client would send again, as if
    /// the server still had them in its reply cache, changes that ran and were kept.
    restart_unconfirmed: bool,
    /// Its durable record has been written (by a change, or by its first lock): after a
    /// restart it is restored, and the grace period waits for its client, which replays
    /// its changes and takes its locks again (docs/protocol.md §4.5).
    recorded: bool,
}

impl Session {
    /// The `seq` of change `id`, running now: the place it took when it arrived (a
    /// request run without going through `Server::handle` takes the next one).
    fn take_place(&mut self, id: u64) -> u64 {
        let seq = self.reserved.remove(&id).unwrap_or_else(|| {
            self.applied += 1;
            self.applied
        });
        self.top = self.top.max(seq);
        seq
    }

    /// Places below `top` whose changes have not run (they wait, parked).
    fn holes_below_top(&self) -> Vec<u64> {
        let mut holes: Vec<u64> = self.reserved.values().copied().filter(|&p| p < self.top).collect();
        holes.sort_unstable();
        if holes.len() > MAX_RECORD_HOLES {
            tracing::error!(holes = holes.len(), "more waiting changes than a session record can name");
        }
        holes
    }
}

/// The most places a session record lists as holes (changes that waited while later ones
/// ran). Only changes parked behind another session's exclusive rights leave one: a
/// client's synchronous calls, a handful at a time.
const MAX_RECORD_HOLES: usize = 64;

/// A session's durable record: the token, how far its changes have run and are durable
/// (the highest `seq` that ran, and the places below it whose changes had not), and its
/// name. Layout: version 2 (u8), secret (u64 LE), seq (u64 LE), hole count (u8), holes
/// (u64 LE each), name length (u8), name. (Version 1 had no holes.)
fn encode_record(secret: u64, seq: u64, holes: &[u64], name: &str) -> Vec<u8> {
    let name = &name.as_bytes()[..name.len().min(200)];
    let holes = &holes[..holes.len().min(MAX_RECORD_HOLES)];
    let mut out = Vec::with_capacity(19 + 8 * holes.len() + name.len());
    out.push(2);
    out.extend_from_slice(&secret.to_le_bytes());
    out.extend_from_slice(&seq.to_le_bytes());
    out.push(holes.len() as u8);
    for h in holes {
        out.extend_from_slice(&h.to_le_bytes());
    }
    out.push(name.len() as u8);
    out.extend_from_slice(name);
    out
}

/// The first byte of the record a fenced session leaves in place of its own (then its
/// secret, u64 LE): so that a restarted server still tells its client, when it comes back,
/// that the session was fenced — else the client, its session merely unknown, would send
/// its unanswered work again in a new one (docs/protocol.md §4.4).
const FENCED_MARKER: u8 = 0xfe;

fn encode_fenced_marker(secret: u64) -> Vec<u8> {
    let mut out = vec![FENCED_MARKER];
    out.extend_from_slice(&secret.to_le_bytes());
    out
}

fn is_fenced_marker(b: &[u8]) -> bool {
    b.len() == 9 && b[0] == FENCED_MARKER
}

/// A decoded session record.
#[derive(Debug, PartialEq, Eq)]
struct Record {
    secret: u64,
    seq: u64,
    holes: Vec<u64>,
    name: String,
}

/// Decodes a session record; `None` for anything malformed (such a record is dropped).
fn decode_record(b: &[u8]) -> Option<Record> {
    let (&version, rest) = b.split_first()?;
    if !(version == 1 || version == 2) || rest.len() < 17 {
        return None;
    }
    let secret = u64::from_le_bytes(rest[0..8].try_into().ok()?);
    let seq = u64::from_le_bytes(rest[8..16].try_into().ok()?);
    let mut rest = &rest[16..];
    let mut holes = Vec::new();
    if version == 2 {
        let (&n, after) = rest.split_first()?;
        if usize::from(n) > MAX_RECORD_HOLES || after.len() < 8 * usize::from(n) {
            return None;
        }
        for i in 0..usize::from(n) {
            holes.push(u64::from_le_bytes(after[8 * i..8 * i + 8].try_into().ok()?));
        }
        rest = &after[8 * usize::from(n)..];
    }
    let (&len, name) = rest.split_first()?;
    if name.len() != usize::from(len) || holes.iter().any(|&h| h == 0 || h >= seq) {
        return None;
    }
    Some(Record { secret, seq, holes, name: String::from_utf8_lossy(name).into_owned() })
}

/// The server core.
pub struct Server {
    store: Store,
    sessions: HashMap<SessionId, Session>,
    next_session: SessionId,
    /// Store generation when sessions' `durable` was last brought up to date.
    seen_generation: u64,
    /// File data bytes written since that generation.
    written_since_commit: u64,
    /// Inodes changed since the last commit, by the one session that changed them (the
    /// inode-number counter as `ALLOCATOR`). A change by another session that involves one
    /// is committed before it is answered, so no session's change ever builds on another's
    /// that a crash could still take back: each inode's lost changes after a crash belong
    /// to one session's replay, and replays of different sessions commute
    /// (docs/protocol.md §4.5). (Reads may see such a change: it is back once its client
    /// has replayed, before anyone's new work runs.)
    unsettled: HashMap<u64, SessionId>,
    /// Commits made for that, since start (logged at shutdown).
    settling_commits: u64,
    /// Who may cache what; responses waiting for recalls.
    caps: Caps,
    /// Inodes the last request changed (recall targets).
    changed: Vec<u64>,
    /// What to send, drained by `take_outgoing`.
    outbox: Vec<Outgoing>,
    /// Sessions whose connection is gone, since when (ms).
    disconnected: HashMap<SessionId, u64>,
    /// Inodes whose state the last request's replies carried.
    carried: Vec<u64>,
    /// Requests waiting for other sessions to give up exclusive rights, oldest first.
    parked: VecDeque<Parked>,
    /// Inodes a change removed the last name of while other sessions cached them, held
    /// open (a store handle each) until the change's recall is answered, by recall id.
    pins: BTreeMap<u64, Vec<u64>>,
    /// Unlinked files the last request opened (their openers need a record).
    opened_orphans: Vec<u64>,
    /// Requests parked for a flush recall (`park_for_flush`), by session and id: run
    /// when it is answered, whoever holds the file open by then.
    flushed: HashSet<(SessionId, u64)>,
    /// When each session (that spoke since this server started) was last heard from, ms.
    last_heard: HashMap<SessionId, u64>,
    /// Sessions fenced for silence: their requests are refused, a resume starts afresh.
    fenced: HashSet<SessionId>,
    /// Fenced sessions whose durable marker (`FENCED_MARKER`) is still in the store: dropped
    /// once the client has been told, or `RESTORED_SESSION_GRACE_MS` after the first tick.
    fenced_markers: HashMap<SessionId, Option<u64>>,
    /// After a restart: sessions restored from their records whose clients have not yet
    /// replayed; while any remain (and the grace period lasts), other work waits.
    replaying: HashSet<SessionId>,
    /// End of the grace period (set by the first tick after a restart).
    grace_until: Option<u64>,
    /// Requests held for the grace period, oldest first.
    grace_parked: VecDeque<(SessionId, p::Request)>,
    /// fcntl and flock locks, by inode.
    locks: LockTable,
    /// Requests run or answered, in order, while `record_applied` is on (for simulators).
    applied: Option<Vec<Applied>>,
    /// Operations run since start, by kind (logged at shutdown: what a workload cost).
    served: BTreeMap<&'static str, u64>,
    /// Whether the image is short of space (then no session holds exclusive rights).
    space: SpaceWatch,
}

/// A request the server ran, or answered from its reply cache, in the order the effects
/// took place (`Server::record_applied`). A simulator replays these on a model of the file
/// system: which requests ran, and in which order, is otherwise hidden inside the core
/// (parked requests run inside `recall_done` and `tick`; held responses come out later).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Applied {
    /// Whose request.
    pub session: SessionId,
    /// Its id.
    pub id: u64,
    /// Answered from the reply cache: nothing ran.
    pub from_cache: bool,
}

/// A request that involves inodes another session holds exclusively: it runs once that
/// session has flushed its writeback and answered the recalls in `waiting`.
#[derive(Debug)]
struct Parked {
    session: SessionId,
    req: p::Request,
    waiting: HashSet<u64>,
}

fn millis(t: p::Time) -> u64 {
    (t.sec.max(0) as u64) * 1000 + u64::from(t.nsec) / 1_000_000
}

fn time_of_millis(ms: u64) -> p::Time {
    p::Time { sec: (ms / 1000) as i64, nsec: ((ms % 1000) * 1_000_000) as u32 }
}

impl std::fmt::Debug for Server {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Server").field("sessions", &self.sessions.len()).finish()
    }
}

pub(crate) fn errno(errno: i32, message: impl Into<String>) -> p::OpError {
    p::OpError { errno, message: message.into() }
}

impl Server {
    /// A server over an opened store. Sessions whose records the store holds (a restart)
    /// are restored, waiting for their clients to resume them and replay what was lost.
    pub fn new(mut store: Store) -> Server {
        let mut sessions = HashMap::new();
        let mut next_session = 1;
        let records = store.session_records().unwrap_or_else(|e| {
            tracing::error!("cannot read session records: {e}");
            Vec::new()
        });
        let mut fenced = HashSet::new();
        for (id, bytes) in records {
            next_session = next_session.max(id.saturating_add(1));
            if is_fenced_marker(&bytes) {
                tracing::info!(session = id, "fenced before the restart: its client will be told");
                fenced.insert(id);
                continue;
            }
            let Some(Record { secret, seq, holes, name: client_name }) = decode_record(&bytes) else {
                tracing::warn!(session = id, "malformed session record of {} bytes dropped", bytes.len());
                if let Err(e) = store.delete_session_record(id) {
                    tracing::error!(session = id, "cannot drop a session record: {e}");
                }
                continue;
            };
            tracing::info!(session = id, client = %client_name, durable_seq = seq, ?holes, "session restored");
            let s = Session {
                secret,
                client_name,
                applied: seq,
                top: seq,
                durable: seq,
                holes,
                awaiting_resume: Some(None),
                recorded: true,
                ..Default::default()
            };
            sessions.insert(id, s);
        }
        let seen_generation = store.generation();
        let replaying: HashSet<SessionId> = sessions.keys().copied().collect();
        if !replaying.is_empty() {
            tracing::info!(sessions = replaying.len(), "restarted: new work waits for their clients to replay (grace)");
        } else {
            reclaim_orphans(&mut store);
        }
        Server {
            store,
            sessions,
            next_session,
            seen_generation,
            written_since_commit: 0,
            unsettled: HashMap::new(),
            settling_commits: 0,
            caps: Caps::default(),
            changed: Vec::new(),
            outbox: Vec::new(),
            disconnected: HashMap::new(),
            carried: Vec::new(),
            parked: VecDeque::new(),
            pins: BTreeMap::new(),
            opened_orphans: Vec::new(),
            flushed: HashSet::new(),
            last_heard: HashMap::new(),
            fenced_markers: fenced.iter().map(|&id| (id, None)).collect(),
            fenced,
            replaying,
            grace_until: None,
            grace_parked: VecDeque::new(),
            locks: LockTable::default(),
            applied: None,
            served: BTreeMap::new(),
            space: SpaceWatch::default(),
        }
    }

    /// From now on, remember every request run or answered from the reply cache, for
    /// `take_applied`. Off by default: only simulators need it.
    pub fn record_applied(&mut self) {
        self.applied.get_or_insert_with(Vec::new);
    }

    /// Numbers new sessions from `first` on (at least). A restarted server knows the
    /// numbers of the sessions it restored, not of those an earlier life handed out and
    /// kept no record of; a simulator that checks every session's history tells it where
    /// to start so that no number means two sessions.
    pub fn number_sessions_from(&mut self, first: SessionId) {
        self.next_session = self.next_session.max(first);
    }

    /// What ran since the last call, oldest first (empty unless `record_applied`).
    pub fn take_applied(&mut self) -> Vec<Applied> {
        self.applied.as_mut().map(std::mem::take).unwrap_or_default()
    }

    /// The store (for shutdown and status).
    pub fn store_mut(&mut self) -> &mut Store {
        &mut self.store
    }

    /// Hands the store back.
    pub fn into_store(self) -> Store {
        if !self.served.is_empty() {
            let total: u64 = self.served.values().sum();
            let kinds: Vec<String> = self.served.iter().map(|(k, n)| format!("{k} {n}")).collect();
            tracing::info!(settling_commits = self.settling_commits, "served {total} operations: {}", kinds.join(", "));
        }
        self.store
    }

    /// Answers a client's hello: a new session, or the resumed one when the token matches.
    pub fn handle_hello(&mut self, hello: &p::Hello) -> (Option<SessionId>, p::ServerMessage) {
        if let Err(reason) = p::check_hello(hello) {
            return (None, p::ServerMessage::Refused { reason, version: p::PROTOCOL_VERSION });
        }
        let mut fenced = false;
        if let Some(t) = hello.resume {
            fenced = self.fenced.contains(&t.id);
            if fenced && self.fenced_markers.remove(&t.id).is_some() {
                // (Durable with the next commit; told again after a crash before it, the
                // client, on its new session by then, does not ask.)
                if let Err(e) = self.store.delete_session_record(t.id) {
                    tracing::warn!(session = t.id, "cannot drop a fenced session's marker: {e}");
                }
            }
            if let Some(s) = self.sessions.get_mut(&t.id).filter(|s| s.secret == t.secret) {
                self.disconnected.remove(&t.id);
                let restarted = s.awaiting_resume.take().is_some() || s.restart_unconfirmed;
                s.restart_unconfirmed = restarted;
                let durable_seq = restarted.then_some(s.durable);
                let holes = if restarted { s.holes.clone() } else { Vec::new() };
                tracing::info!(session = t.id, client = %hello.client_name, ?durable_seq, ?holes, "session resumed");
                // Recalls it may have missed while away (sent after the welcome).
                let again = self.caps.resumed(t.id);
                self.outbox.extend(again);
                return (Some(t.id), self.welcome(t.id, true, durable_seq, holes, false));
            }
        }
        let id = self.next_session;
        self.next_session += 1;
        let secret = crest_rng::next_u64();
        self.sessions.insert(id, Session { secret, client_name: hello.client_name.clone(), ..Default::default() });
        tracing::info!(session = id, client = %hello.client_name, fenced_before = fenced, "session started");
        (Some(id), self.welcome(id, false, None, Vec::new(), fenced))
    }

    fn welcome(
        &self,
        id: SessionId,
        resumed: bool,
        durable_seq: Option<u64>,
        durable_holes: Vec<u64>,
        fenced: bool,
    ) -> p::ServerMessage {
        let secret = self.sessions.get(&id).map_or(0, |s| s.secret);
        p::ServerMessage::Welcome(p::Welcome {
            version: p::PROTOCOL_VERSION,
            session: p::SessionToken { id, secret },
            resumed,
            durable_seq,
            durable_holes,
            fsid: self.store.fsid(),
            fenced,
        })
    }

    /// Applies a request and queues what to send: its response, or recalls to other
    /// sessions holding what it changed (the response follows when they answer).
    ///
    /// A request that involves an inode another session holds exclusively waits: that
    /// session is asked to flush and give the inode up, and the request runs when it has
    /// (or its time ran out). A read-only request is checked again after it ran, against
    /// everything its reply would let the client cache, and run again later if needed.
    pub fn handle(&mut self, session: SessionId, req: p::Request, now: p::Time) {
        let now_ms = millis(now);
        if !self.sessions.contains_key(&session) {
            // Fenced (or never known): nothing of it is applied any more, and no request
            // is answered, so the client knows each of its pending ones was not applied
            // here (what ran before the fencing was answered before): it may send its
            // reads again in its new session.
            tracing::debug!(session, id = req.id, "refused: the session was fenced");
            self.outbox.push(Outgoing::Notify { session, notify: p::Notify::Fenced });
            return;
        }
        self.heard(session, now_ms);
        self.confirm_resume(session);
        self.watch_space(now_ms);
        let mut req = req;
        let write_backs = take_write_backs(&mut req);
        if !self.replaying.is_empty() && !self.replaying.contains(&session) {
            // Grace after a restart: a restored session's replays come first (they are
            // changes other clients may already have seen acknowledged).
            self.grace_parked.push_back((session, req));
            return;
        }
        // A change takes its place (`seq`) in its session's order as it arrives, parked or
        // not: its client counts them as it sends them (§4.5).
        if req.ops.iter().any(Op::is_mutation) {
            if let Some(s) = self.sessions.get_mut(&session) {
                if !s.replies.contains_key(&req.id) && !s.reserved.contains_key(&req.id) {
                    s.applied += 1;
                    s.reserved.insert(req.id, s.applied);
                }
            }
        }
        let involved = self.involved(&req);
        if !involved.is_empty() {
            // An open takes effect as it arrives, even when its answer must wait for
            // another session's exclusive rights: its client may have answered the open
            // itself and sent it before answering a recall, and the holder's unlink that
            // runs first must find the file open (only the attributes in the answer need
            // the holder's writeback).
            for op in &req.ops {
                if let Op::Open { ino, handle } = *op {
                    if self.caps.exclusive_elsewhere(session, ino).is_some() {
                        // A failure is reported when the open runs.
                        let _ = self.open_handle(session, ino, handle);
                    }
                }
            }
        }
        if self.park_if_exclusive(session, &req, &involved, now_ms)
            || self.park_for_flush(session, &req, &write_backs, now_ms)
        {
            return;
        }
        let read_only = !req.ops.iter().any(Op::is_mutation);
        let retry = read_only.then(|| req.clone());
        let (id, from_cache) = (req.id, self.sessions.get(&session).is_some_and(|s| s.replies.contains_key(&req.id)));
        if from_cache && self.caps.holds_response(session, id) {
            // A resend (its connection broke) of a change whose reply still waits for
            // other holders to drop what they cached: answering it from the reply cache
            // now would let the call return before they have. The held reply goes to
            // the session's current connection when they answer.
            tracing::debug!(session, id, "resent while its reply waits on recalls");
            return;
        }
        let victims = if from_cache { Vec::new() } else { self.victims(&req) };
        let mut pins = self.pin(session, &victims);
        let response = self.handle_request(session, req, now);
        if !victims.is_empty() {
            // Only what the change did remove stays pinned (it may have failed).
            let orphans: Vec<u64> =
                victims.into_iter().filter(|&i| self.store.getattr(i).is_ok_and(|a| a.nlink == 0)).collect();
            let (removed, kept) = pins.into_iter().partition(|i| orphans.contains(i));
            self.unpin(kept);
            pins = removed;
            self.record_openers(&orphans);
        }
        let opened = std::mem::take(&mut self.opened_orphans);
        self.record_openers(&opened);
        if response.seq != 0 && !from_cache {
            if let Some(s) = self.sessions.get_mut(&session) {
                s.ran += 1;
                s.run_order.insert(id, s.ran);
            }
        }
        let carried = std::mem::take(&mut self.carried);
        if let Some(req) = retry {
            if self.park_if_exclusive(session, &req, &carried, now_ms) {
                return;
            }
        }
        if let Some(log) = &mut self.applied {
            log.push(Applied { session, id, from_cache });
        }
        let changed = std::mem::take(&mut self.changed);
        let out = self.caps.changed(session, &changed, response, now_ms);
        if !pins.is_empty() {
            let recall = out.iter().find_map(|o| match o {
                Outgoing::Notify { notify: p::Notify::Recall { recall_id, .. }, .. } => Some(*recall_id),
                _ => None,
            });
            match recall {
                Some(id) => self.pins.entry(id).or_default().extend(pins),
                None => self.unpin(pins),
            }
        }
        self.outbox.extend(out);
    }

    /// Opens `handle` of `ino` for `session` unless it is open already (a retry, or an
    /// open that took effect when it arrived).
    fn open_handle(&mut self, session: SessionId, ino: u64, handle: u64) -> Result<s::Inode, s::Error> {
        let fresh = self.sessions.get_mut(&session).is_some_and(|s| s.open.entry(ino).or_default().insert(handle));
        if !fresh {
            return self.store.getattr(ino);
        }
        let r = self.store.open_handle(ino);
        if r.is_err() {
            if let Some(s) = self.sessions.get_mut(&session) {
                s.open.entry(ino).or_default().remove(&handle);
            }
        }
        r
    }

    /// The files whose last name `req` may remove (unlinks and renames over them).
    fn victims(&mut self, req: &p::Request) -> Vec<u64> {
        let mut out = Vec::new();
        for op in &req.ops {
            // Files only: a directory's opens (opendir) are sent behind too, but an empty
            // directory kept for another mount's open descriptor shows nothing but its
            // attributes, and a removed directory must stay gone for lookups in it.
            let (parent, name) = match op {
                Op::Unlink { parent, name } => (*parent, name),
                Op::Rename { new_parent, new_name, flags, .. } if flags & p::RENAME_EXCHANGE == 0 => {
                    (*new_parent, new_name)
                }
                _ => continue,
            };
            match self.store.lookup(parent, name) {
                Ok(i) if i.kind != s::FileKind::Directory && i.nlink == 1 => out.push(i.ino),
                _ => {}
            }
        }
        out
    }

    /// The server itself stood still for `gap_ms` until `now_ms` (one long operation: a
    /// fallocate of gigabytes writes its zeros on the store's thread). What clients sent
    /// meanwhile waits unread, so the stall must not count against their leases or recall
    /// deadlines: every such clock moves on by it. The driver, which sees the wall clock,
    /// says so before the next `tick`.
    pub fn forgive_stall(&mut self, now_ms: u64, gap_ms: u64) {
        tracing::warn!(stall_ms = gap_ms, "the server stood still; leases and recall deadlines move on by as much");
        for at in self.last_heard.values_mut().chain(self.disconnected.values_mut()) {
            *at = at.saturating_add(gap_ms).min(now_ms);
        }
        if let Some(until) = &mut self.grace_until {
            *until = until.saturating_add(gap_ms);
        }
        self.caps.postpone_deadlines(gap_ms);
    }

    /// Holds open each of `victims` that a session other than `session` may cache. Such a
    /// session may have opened it without asking (a client answers an open of what it
    /// caches itself and sends the `Open` behind): the `Open` reaches the server before
    /// that session's answer to the change's recall, so the file must outlive the recall,
    /// not the change, for that descriptor to keep working (`release_pins`).
    fn pin(&mut self, session: SessionId, victims: &[u64]) -> Vec<u64> {
        let mut pins = Vec::new();
        for &ino in victims {
            if self.caps.held_elsewhere(session, ino) && self.store.open_handle(ino).is_ok() {
                pins.push(ino);
            }
        }
        pins
    }

    /// Sessions holding one of `orphans` (files unlinked while open) open get a durable
    /// record: a restarted server then waits for their clients to open them again before
    /// it reclaims what nobody holds.
    fn record_openers(&mut self, orphans: &[u64]) {
        if orphans.is_empty() {
            return;
        }
        let mut openers: Vec<SessionId> = self
            .sessions
            .iter()
            .filter(|(_, s)| !s.recorded && orphans.iter().any(|i| s.open.contains_key(i)))
            .map(|(id, _)| *id)
            .collect();
        openers.sort_unstable();
        for id in openers {
            self.record_session(id, "a holder of an unlinked open file");
        }
    }

    /// Lets go of the inodes held open for changes whose recalls are all answered (or
    /// given up on).
    fn release_pins(&mut self) {
        let done: Vec<u64> = self.pins.keys().copied().filter(|&id| !self.caps.wait_pending(id)).collect();
        for id in done {
            if let Some(inodes) = self.pins.remove(&id) {
                self.unpin(inodes);
            }
        }
    }

    /// True for an inode kept only by pins: gone for everything but an open that was
    /// already on its way (the one reason it is kept).
    fn only_pinned(&self, ino: u64) -> bool {
        self.pins.values().any(|v| v.contains(&ino)) && !self.sessions.values().any(|s| s.open.contains_key(&ino))
    }

    fn unpin(&mut self, inodes: Vec<u64>) {
        for ino in inodes {
            if let Err(e) = self.store.release_handle(ino) {
                tracing::warn!(ino, "cannot release a removed inode: {e}");
            }
        }
    }

    /// Parks `req` if other sessions hold any of `inodes` exclusively (recalling them).
    fn park_if_exclusive(&mut self, session: SessionId, req: &p::Request, inodes: &[u64], now_ms: u64) -> bool {
        // An acquire grants X again on what it names: if this session's own X on one is
        // being recalled, it waits for the answer, else that answer (sent before the
        // client saw the grant) would end here the rights the client then holds.
        let acquires = req.ops.iter().any(|op| matches!(op, Op::Acquire { .. }));
        let own = if acquires { self.caps.own_exclusive_recalls(session, inodes) } else { HashSet::new() };
        if own.is_empty() && inodes.iter().all(|&i| self.caps.exclusive_elsewhere(session, i).is_none()) {
            return false;
        }
        let mut out = Vec::new();
        let mut waiting = self.caps.recall_exclusive(session, inodes, now_ms, &mut out);
        waiting.extend(own);
        self.outbox.extend(out);
        if waiting.is_empty() {
            return false;
        }
        tracing::debug!(session, id = req.id, "request waits for exclusive rights to be recalled");
        self.parked.push_back(Parked { session, req: req.clone(), waiting });
        true
    }

    /// Parks a change of file data until every other session that holds the file open has
    /// answered a flush recall (`caps::FlushRecall`: pages it mapped shared and dirtied
    /// are written back before the change, not over it). The writeback of a file the
    /// session holds exclusively runs at once, and so does its kernel's write-back
    /// (`Op::WriteBack`) of a file it is asked to give up (part of its answer). A request
    /// waits so once (`flushed`).
    fn park_for_flush(&mut self, session: SessionId, req: &p::Request, write_backs: &[u64], now_ms: u64) -> bool {
        if self.flushed.remove(&(session, req.id)) {
            return false;
        }
        let mut targets: BTreeMap<SessionId, Vec<u64>> = BTreeMap::new();
        for op in &req.ops {
            let ino = match op {
                Op::Write { ino, .. } | Op::Append { ino, .. } | Op::Fallocate { ino, .. } => *ino,
                Op::SetAttr { ino, set } if set.size_bytes.is_some() => *ino,
                _ => continue,
            };
            // Never kept waiting: the writeback of what the session holds exclusively (no
            // other session can have dirtied the file's pages since it got the rights: its
            // read would have recalled them; and held back, that writeback could fall
            // behind the session's later changes, or its answer to a recall), and its
            // kernel's write-back of cached pages while it is being recalled (part of its
            // answer).
            if self.caps.holds_exclusive(session, ino)
                || (write_backs.contains(&ino) && self.caps.being_recalled(session, ino))
            {
                continue;
            }
            let openers = self.sessions.iter().filter(|(_, s)| s.open.contains_key(&ino)).map(|(id, _)| *id);
            for id in openers {
                if id != session {
                    let v = targets.entry(id).or_default();
                    if !v.contains(&ino) {
                        v.push(ino);
                    }
                }
            }
        }
        if targets.is_empty() {
            return false;
        }
        let mut out = Vec::new();
        let waiting = self.caps.recall_for_flush(targets, now_ms, &mut out);
        self.outbox.extend(out);
        tracing::debug!(session, id = req.id, "change of file data waits for other openers to write back");
        self.flushed.insert((session, req.id));
        self.parked.push_back(Parked { session, req: req.clone(), waiting });
        true
    }

    /// Runs parked requests whose recalls are all answered, oldest first.
    fn run_parked(&mut self, now: p::Time) {
        let mut ready = Vec::new();
        let mut still = VecDeque::with_capacity(self.parked.len());
        for p in std::mem::take(&mut self.parked) {
            if p.waiting.iter().any(|&id| self.caps.recall_pending(id)) {
                still.push_back(p);
            } else {
                ready.push(p);
            }
        }
        self.parked = still;
        for p in ready {
            if self.sessions.contains_key(&p.session) {
                self.handle(p.session, p.req, now);
            }
        }
    }

    /// Every inode a request names (and the victims of its unlinks and renames): what
    /// must not be held exclusively by another session while it runs.
    fn involved(&mut self, req: &p::Request) -> Vec<u64> {
        let mut v = Vec::new();
        for op in &req.ops {
            v.extend(op_inodes(op));
            if matches!(op, Op::Unlink { .. } | Op::Rmdir { .. } | Op::Rename { .. } | Op::Acquire { .. }) {
                v.extend(self.touches(op));
            }
        }
        v
    }

    /// `session`'s connection is gone (it may come back and resume). After
    /// `DISCONNECTED_HOLDER_MS` it no longer holds anything: changes stop waiting for it.
    pub fn disconnected(&mut self, session: SessionId, now_ms: u64) {
        // A fenced or ended session's connection closing leaves nothing to track.
        if !self.sessions.contains_key(&session) {
            return;
        }
        self.disconnected.insert(session, now_ms);
    }

    /// `session` dropped what recall `recall_id` named (and, for exclusive rights, sent
    /// everything it had answered itself first).
    pub fn recall_done(&mut self, session: SessionId, recall_id: u64, now: p::Time) {
        if self.sessions.contains_key(&session) {
            self.heard(session, millis(now));
            self.confirm_resume(session);
        }
        let out = self.caps.recall_done(session, recall_id);
        self.outbox.extend(out);
        self.release_pins();
        self.run_parked(now);
    }

    /// `session`'s client has sent every request it replays after the restart.
    pub fn replayed(&mut self, session: SessionId, now: p::Time) {
        self.confirm_resume(session);
        if self.replaying.remove(&session) && self.replaying.is_empty() {
            tracing::info!("every restored session has replayed: grace over");
            self.end_grace(now);
        }
    }

    /// `Op::Reassert`: rights a restored session's client held before the restart, given
    /// back while it replays — when nobody's new work runs yet (docs/protocol.md §4.5).
    fn reassert(&mut self, session: SessionId, ino: u64, exclusive: bool) -> Result<Reply, p::OpError> {
        if !self.replaying.contains(&session) {
            return Err(errno(22, format!("session {session} re-asserts rights on inode {ino} outside a replay")));
        }
        match self.caps.reassert(session, ino, exclusive) {
            Ok(()) => Ok(Reply::Done),
            Err(other) => Err(errno(16, format!("inode {ino} is held by session {other}; rights not given back"))),
        }
    }

    /// A message from `session` after its hello: its client has the welcome.
    fn confirm_resume(&mut self, session: SessionId) {
        if let Some(s) = self.sessions.get_mut(&session) {
            if s.restart_unconfirmed {
                s.restart_unconfirmed = false;
                s.holes.clear();
            }
        }
    }

    fn end_grace(&mut self, now: p::Time) {
        self.replaying.clear();
        // Every client that could still hold an unlinked file open has opened it again
        // (`Op::Open` before `Replayed`) or was fenced: what nobody holds goes now.
        reclaim_orphans(&mut self.store);
        for (session, req) in std::mem::take(&mut self.grace_parked) {
            self.handle(session, req, now);
        }
    }

    /// Was `session` fenced? (For simulators: the moment its unapplied writebacks are
    /// lost is otherwise hidden inside `tick`.)
    pub fn is_fenced(&self, session: SessionId) -> bool {
        self.fenced.contains(&session)
    }

    /// `session` said something at `now_ms`: its lease runs from here.
    pub fn heard(&mut self, session: SessionId, now_ms: u64) {
        self.last_heard.insert(session, now_ms);
    }

    /// Takes everything back from a session that went silent past its lease (or whose
    /// connection stayed gone): rights, locks, open files, waiting requests. Its later
    /// requests are refused, so nothing it answered itself can land after others moved on.
    fn fence(&mut self, id: SessionId, why: &str) {
        tracing::warn!(session = id, "session fenced: {why}");
        let secret = self.sessions.get(&id).map(|s| s.secret);
        self.end_session(id);
        self.fenced.insert(id);
        if let Some(secret) = secret {
            match self.store.put_session_record(id, &encode_fenced_marker(secret)) {
                Ok(()) => {
                    self.fenced_markers.insert(id, None);
                }
                Err(e) => tracing::error!(session = id, "cannot record the fencing: {e}"),
            }
        }
        // The record's replacement by the marker is made durable at once: after a restart
        // within the commit interval the fenced session would otherwise be restored, and
        // its client would take back locks and replay changes that others have moved past.
        if let Err(e) = self.store.commit() {
            tracing::error!(session = id, "cannot commit the end of a fenced session: {e}");
        }
        self.note_commits();
    }

    /// Everything queued to send, in order.
    ///
    /// A session's change responses come out in the order the changes ran: one held for
    /// recalls holds back the later ones. So what a client has had answered is always
    /// everything its session ran up to some point, and after a restart it can replay its
    /// lost acknowledged changes in that order, and send the unanswered ones after them
    /// (docs/protocol.md §4.5).
    pub fn take_outgoing(&mut self) -> Vec<Outgoing> {
        let out = std::mem::take(&mut self.outbox);
        let mut ready = Vec::with_capacity(out.len());
        for o in out {
            match o {
                Outgoing::Response { session, response } => self.release_in_order(session, response, &mut ready),
                other => ready.push(other),
            }
        }
        ready
    }

    /// Lets `response` go once every change `session` ran before it has been answered.
    fn release_in_order(&mut self, session: SessionId, response: p::Response, ready: &mut Vec<Outgoing>) {
        let Some(s) = self.sessions.get_mut(&session) else {
            return ready.push(Outgoing::Response { session, response });
        };
        let Some(&order) = s.run_order.get(&response.id) else {
            // A read, or a repeat answered from the reply cache.
            return ready.push(Outgoing::Response { session, response });
        };
        s.unreleased.insert(order, response);
        while let Some(entry) = s.unreleased.first_entry() {
            if s.run_order.values().any(|&o| o < *entry.key()) {
                break;
            }
            let response = entry.remove();
            s.run_order.remove(&response.id);
            ready.push(Outgoing::Response { session, response });
        }
    }

    /// Ends a session cleanly: its open files and its locks are released.
    pub fn end_session(&mut self, id: SessionId) {
        self.disconnected.remove(&id);
        self.last_heard.remove(&id);
        self.grace_parked.retain(|(s, _)| *s != id);
        // (If it was the last one to replay, the next tick ends the grace period.)
        self.replaying.remove(&id);
        self.release_locks(id, "session ended");
        let out = self.caps.forget_session(id);
        self.outbox.extend(out);
        self.parked.retain(|p| p.session != id);
        self.flushed.retain(|(s, _)| *s != id);
        if let Some(s) = self.sessions.remove(&id) {
            tracing::info!(session = id, client = %s.client_name, "session ended");
            if let Err(e) = self.store.delete_session_record(id) {
                tracing::warn!(session = id, "cannot drop the session record: {e}");
            }
            for (ino, handles) in s.open {
                for _ in handles {
                    if let Err(e) = self.store.release_handle(ino) {
                        tracing::warn!(ino, "release at session end: {e}");
                    }
                }
            }
        }
    }

    /// Applies a request for `session` at time `now` (or answers it from the reply cache),
    /// records the rights its replies grant and leaves the inodes it changed in
    /// `self.changed`. `handle` is the whole step; this is its core (and the unit tests').
    pub(crate) fn handle_request(&mut self, session: SessionId, req: p::Request, now: p::Time) -> p::Response {
        self.confirm_resume(session);
        self.changed.clear();
        self.carried.clear();
        // Writeback: the client already answered with its clock; apply at that time.
        let mut now = req.time.unwrap_or(now);
        if let Some(s) = self.sessions.get(&session) {
            if let Some(r) = s.replies.get(&req.id) {
                tracing::debug!(session, id = req.id, "answered from the reply cache");
                return p::Response { durable: s.durable, ..r.clone() };
            }
        }
        let mutates = req.ops.iter().any(Op::is_mutation);
        let mut involved: Vec<u64> = req.ops.iter().flat_map(op_inodes).collect();
        if req.ops.iter().any(|op| matches!(op, Op::Create { .. } | Op::Symlink { .. } | Op::AllocInodes { .. })) {
            involved.push(ALLOCATOR);
        }
        let mut seq = 0;
        let results = if req.ops.len() > p::MAX_OPS_PER_REQUEST {
            // Refused whole, but still the session's next change in order: its client
            // counted it (places, §4.5), and it changed nothing a replay could redo.
            if mutates {
                if let Some(s) = self.sessions.get_mut(&session) {
                    seq = s.take_place(req.id);
                }
            }
            vec![Err(errno(7, format!("{} operations in one request (max {})", req.ops.len(), p::MAX_OPS_PER_REQUEST)))]
        } else {
            // A changing request is one unit with its session record: after a crash it is
            // wholly durable (and the record says so) or wholly gone.
            let fsyncs: Vec<bool> = req.ops.iter().map(|op| matches!(op, Op::Fsync { .. })).collect();
            if req.ops.iter().any(|op| matches!(op, Op::Acquire { .. })) {
                // An acquire grants exclusive rights, under which the client answers changes
                // itself: after a restart its session must be restored (and waited for), or
                // that writeback would arrive as a stranger's new work.
                self.record_session(session, "an exclusive holder");
            }
            if mutates {
                // A session's first change: its record goes to disk first, alone, so a
                // restart restores the session and the grace period waits for its client
                // to replay this change (were the record lost with it, nobody would wait).
                self.record_session(session, "a changing session");
                self.store.begin_unit();
                if let Some(s) = self.sessions.get_mut(&session) {
                    seq = s.take_place(req.id);
                    s.recorded = true;
                    let record = encode_record(s.secret, s.top, &s.holes_below_top(), &s.client_name);
                    if let Err(e) = self.store.put_session_record(session, &record) {
                        tracing::error!(session, "cannot record the session: {e}");
                    }
                }
            }
            let mut results = Vec::with_capacity(req.ops.len());
            for op in req.ops {
                if let Op::At { time } = op {
                    now = time;
                    results.push(Ok(Reply::Done));
                    continue;
                }
                *self.served.entry(op.name()).or_default() += 1;
                if let Op::Reassert { ino, exclusive } = op {
                    results.push(self.reassert(session, ino, exclusive));
                    continue;
                }
                let acquires = if let Op::Acquire { ino } = op { Some(ino) } else { None };
                // (An acquire touches what its reply carries: the directory and every
                // entry — taken from the reply rather than listed again.)
                let touched = if acquires.is_some() { Vec::new() } else { self.touches(&op) };
                // (What it would change decides its answer even when it fails: an rmdir's
                // ENOTEMPTY depends on the victim's entries.)
                involved.extend(&touched);
                let inode_of_op = op_inode(&op);
                let (creates, rmdir) = (op.creates(), matches!(op, Op::Rmdir { .. }));
                let mut r = self.apply(session, op, now);
                if let Ok(reply) = &mut r {
                    if mutates {
                        // This reply is not checked after the fact (it cannot be rerun):
                        // it lends no stretch of a directory holding another session's
                        // exclusive inodes, whose attributes may be ahead on that client.
                        if let Reply::Lookup { leaf, .. } = reply {
                            if leaf.items.iter().any(|i| self.caps.exclusive_elsewhere(session, i.attr.ino).is_some()) {
                                *leaf = p::DirLeaf { hash_lo: 1, hash_hi: 0, items: Vec::new() };
                            }
                        }
                    }
                    if creates {
                        if let Reply::Entry(a) = reply {
                            // Its client takes these rights with the reply; short of
                            // space, they are recalled as soon as given (space.rs).
                            self.caps.grant_exclusive(session, a.ino);
                            if self.space.low() {
                                let mut out = Vec::new();
                                self.caps.recall_exclusive(NO_SESSION, &[a.ino], millis(now), &mut out);
                                self.outbox.extend(out);
                            }
                        }
                    }
                    if let (Some(dir), Reply::Lookup { leaf, .. }) = (acquires, &*reply) {
                        self.caps.grant_exclusive(session, dir);
                        for i in &leaf.items {
                            self.caps.grant_exclusive(session, i.attr.ino);
                        }
                    }
                    if rmdir {
                        if let Some(&victim) = touched.get(1) {
                            self.caps.drop_exclusive(victim);
                        }
                    }
                    let c = carried(inode_of_op, reply);
                    self.carried.extend(&c);
                    self.changed.extend(touched);
                    if acquires.is_some() {
                        self.changed.extend(&c);
                    }
                    self.caps.grant(session, c);
                }
                results.push(r);
            }
            if mutates {
                // A change that waited (parked) while later ones ran and were committed:
                // its place is below what this session's answers call durable, so it is
                // made durable before it is answered too.
                let late = self.sessions.get(&session).is_some_and(|s| seq != 0 && seq <= s.durable);
                if let Err(e) = self.store.end_unit() {
                    // The commit an fsync asked for failed: the fsync fails.
                    tracing::error!(session, "commit failed: {e}");
                    for (r, _) in results.iter_mut().zip(&fsyncs).filter(|(_, f)| **f) {
                        *r = Err(error_out(&e));
                    }
                }
                if late || self.written_since_commit >= COMMIT_AFTER_WRITTEN_BYTES {
                    if let Err(e) = self.store.commit() {
                        tracing::error!(session, late, written = self.written_since_commit, "commit failed: {e}");
                    }
                }
            }
            results
        };
        involved.extend(&self.changed);
        involved.extend(&self.carried);
        self.settle(session, mutates, &involved);
        let durable = self.sessions.get(&session).map_or(0, |s| s.durable);
        let resp = p::Response { id: req.id, results, seq, durable };
        if mutates {
            if let Some(s) = self.sessions.get_mut(&session) {
                s.replies.insert(resp.id, resp.clone());
                s.order.push_back(resp.id);
                while s.order.len() > REPLY_CACHE_ENTRIES {
                    if let Some(old) = s.order.pop_front() {
                        s.replies.remove(&old);
                    }
                }
            }
        }
        resp
    }

    /// Inodes `op` will change if it succeeds (looked up before it runs: an unlink's victim
    /// is gone afterwards).
    fn touches(&mut self, op: &Op) -> Vec<u64> {
        let mut look = |parent: u64, name: &[u8]| self.store.lookup(parent, name).ok().map(|i| i.ino);
        match op {
            Op::SetAttr { ino, .. }
            | Op::Write { ino, .. }
            | Op::Append { ino, .. }
            | Op::Fallocate { ino, .. }
            | Op::SetXattr { ino, .. }
            | Op::RemoveXattr { ino, .. } => vec![*ino],
            Op::Create { parent, .. }
            | Op::Symlink { parent, .. }
            | Op::CreateAt { parent, .. }
            | Op::SymlinkAt { parent, .. } => vec![*parent],
            Op::Link { ino, parent, .. } => vec![*ino, *parent],
            Op::Unlink { parent, name } | Op::Rmdir { parent, name } => {
                std::iter::once(*parent).chain(look(*parent, name)).collect()
            }
            Op::Rename { parent, name, new_parent, new_name, .. } => {
                let moved = look(*parent, name);
                let replaced = look(*new_parent, new_name);
                [Some(*parent), Some(*new_parent), moved, replaced].into_iter().flatten().collect()
            }
            // Taking a directory whole: whoever cached it or its entries must let go first.
            Op::Acquire { ino } => {
                let entries = self.store.readdir(*ino, 0, p::MAX_ACQUIRE_ENTRIES + 1).unwrap_or_default();
                std::iter::once(*ino).chain(entries.into_iter().map(|(e, _)| e.ino)).collect()
            }
            _ => Vec::new(),
        }
    }

    /// Lets the store commit on its schedule, releases change replies whose recalls went
    /// unanswered too long, and drops restored sessions whose clients
    /// did not come back within `RESTORED_SESSION_GRACE_MS`.
    pub fn tick(&mut self, now_ms: u64) -> Result<(), s::Error> {
        if self.replaying.is_empty() {
            if !self.grace_parked.is_empty() {
                self.end_grace(time_of_millis(now_ms));
            }
        } else {
            let until = *self.grace_until.get_or_insert(now_ms + crate::caps::GRACE_MS);
            if now_ms >= until {
                tracing::warn!(
                    sessions = ?self.replaying,
                    "grace period over; clients of these sessions did not come back to replay"
                );
                // Those still away are fenced, as a session silent past its lease is: what
                // they answered themselves and had not shipped (or had acknowledged and not
                // replayed) must not land after others have moved on without it. Their
                // clients are told when they come back (the fenced marker).
                let mut away: Vec<SessionId> = self
                    .replaying
                    .iter()
                    .copied()
                    .filter(|id| {
                        self.disconnected.contains_key(id)
                            || self.sessions.get(id).is_some_and(|s| s.awaiting_resume.is_some())
                    })
                    .collect();
                away.sort_unstable();
                for id in away {
                    self.fence(id, "did not come back within the grace period after a restart");
                }
                self.end_grace(time_of_millis(now_ms));
            }
        }
        let mut stale_markers: Vec<SessionId> = Vec::new();
        for (id, deadline) in &mut self.fenced_markers {
            if now_ms >= *deadline.get_or_insert(now_ms + RESTORED_SESSION_GRACE_MS) {
                stale_markers.push(*id);
            }
        }
        stale_markers.sort_unstable();
        for id in stale_markers {
            self.fenced_markers.remove(&id);
            if let Err(e) = self.store.delete_session_record(id) {
                tracing::warn!(session = id, "cannot drop a fenced session's marker: {e}");
            }
        }
        let mut expired = Vec::new();
        for (id, s) in &mut self.sessions {
            if let Some(deadline) = &mut s.awaiting_resume {
                let at = *deadline.get_or_insert(now_ms + RESTORED_SESSION_GRACE_MS);
                if now_ms >= at {
                    expired.push(*id);
                }
            }
        }
        // Sessions are kept in a hash map: sort, so that what this sends comes out in
        // the same order every time (a simulator seed must replay exactly).
        expired.sort_unstable();
        for id in expired {
            tracing::warn!(session = id, "client did not come back after the restart; its session is dropped");
            self.end_session(id);
        }
        // Leases: silent past LEASE_MS, or disconnected past DISCONNECTED_FENCE_MS, or
        // holding exclusive rights a recall asked for a whole lease ago: fenced. (Sessions
        // restored after a restart are not counted until their client comes back.)
        let mut fence: Vec<(SessionId, &str)> = Vec::new();
        for (&id, &at) in &self.last_heard {
            if let Some(&gone) = self.disconnected.get(&id) {
                if now_ms >= gone + crate::caps::DISCONNECTED_FENCE_MS {
                    fence.push((id, "disconnected past the fencing delay"));
                    continue;
                }
            }
            if now_ms >= at + crate::caps::LEASE_MS {
                fence.push((id, "silent past its lease"));
            }
        }
        for id in self.caps.late_exclusive_holders(now_ms) {
            fence.push((id, "did not return exclusive rights within a lease"));
        }
        fence.sort_unstable();
        fence.dedup_by_key(|f| f.0);
        for (id, why) in fence {
            if self.sessions.contains_key(&id) {
                self.fence(id, why);
            } else {
                self.last_heard.remove(&id);
            }
        }
        let mut gone: Vec<SessionId> = self
            .disconnected
            .iter()
            .filter(|(_, &at)| now_ms >= at + crate::caps::DISCONNECTED_HOLDER_MS)
            .map(|(s, _)| *s)
            .collect();
        gone.sort_unstable();
        for s in gone {
            // Its shared rights lapse (its cache has expired by now); its locks and
            // exclusive rights wait for the fencing delay, in case it comes back.
            let out = self.caps.forget_shared(s);
            self.outbox.extend(out);
        }
        let late = self.caps.expire(now_ms);
        self.outbox.extend(late);
        self.release_pins();
        if !self.parked.is_empty() {
            self.run_parked(time_of_millis(now_ms));
        }
        let r = self.store.tick(now_ms);
        self.note_commits();
        self.watch_space(now_ms);
        r
    }

    /// Recalls every exclusive right when the image has just run short of space.
    fn watch_space(&mut self, now_ms: u64) {
        let clients = self.sessions.len().saturating_sub(self.disconnected.len());
        if self.space.update(&self.store.statfs(), clients) {
            let all = self.caps.exclusive_inodes();
            let mut out = Vec::new();
            self.caps.recall_exclusive(NO_SESSION, &all, now_ms, &mut out);
            self.outbox.extend(out);
        }
    }

    /// A session that changes something or takes a lock gets a durable record if it has
    /// none yet, so that after a restart it is restored and the grace period waits for its
    /// client: to replay its acknowledged changes, to take its locks again. Committed at
    /// once (once per session): a crash before the next periodic commit must not lose the
    /// record while the client holds a lock or an acknowledged change.
    fn record_session(&mut self, session: SessionId, what: &str) {
        let Some(s) = self.sessions.get_mut(&session) else { return };
        if s.recorded {
            return;
        }
        s.recorded = true;
        // No unit is open here (a changing request calls this before its unit begins),
        // so this commit never cuts a unit in two.
        let record = encode_record(s.secret, s.top, &s.holes_below_top(), &s.client_name);
        if let Err(e) = self.store.put_session_record(session, &record).and_then(|()| self.store.commit()) {
            tracing::error!(session, "cannot record the session of {what}: {e}");
        }
        // What was applied before is durable now; what the caller applies next is not.
        self.note_commits();
    }

    /// Drops every lock of `session`, saying why in the log.
    fn release_locks(&mut self, session: SessionId, why: &str) {
        let n = self.locks.release_session(session);
        if n > 0 {
            tracing::info!(session, "{why}: {n} locks released");
        }
    }

    /// After `session`'s request that involved `inodes` ran: if it changed something and
    /// one of them holds another session's change not yet durable, commits before it is
    /// answered; then counts what the request left not durable as `session`'s.
    fn settle(&mut self, session: SessionId, mutates: bool, inodes: &[u64]) {
        let builds_on_other = mutates && inodes.iter().any(|i| self.unsettled.get(i).is_some_and(|&s| s != session));
        if builds_on_other {
            self.settling_commits += 1;
            if let Err(e) = self.store.commit() {
                tracing::error!(
                    session,
                    "commit before answering a request that builds on another session's change failed: {e}"
                );
            }
        }
        self.note_commits();
        if mutates && self.store.is_dirty() {
            for &ino in inodes {
                self.unsettled.insert(ino, session);
            }
        }
    }

    /// After a commit, every change applied so far is durable.
    fn note_commits(&mut self) {
        let generation = self.store.generation();
        if generation != self.seen_generation {
            self.seen_generation = generation;
            self.unsettled.clear();
            self.written_since_commit = 0;
            for s in self.sessions.values_mut() {
                s.durable = s.top;
            }
        }
    }

    fn dir_items(&mut self, dir: u64, from: u64, limit: usize) -> Result<Vec<p::DirItem>, s::Error> {
        Ok(self
            .store
            .readdir(dir, from, limit)?
            .into_iter()
            .map(|(e, i)| p::DirItem { name: e.name, index: e.index, attr: attr_out(&i) })
            .collect())
    }

    /// Fills in ownership of a new inode: a set-group-ID directory passes on its group
    /// (and, to subdirectories, the bit itself).
    fn new_owner(&mut self, parent: u64, cred: p::Cred, kind: s::FileKind, mode: u32) -> Result<(u32, u32), s::Error> {
        let dir = self.store.getattr(parent)?;
        if dir.mode & 0o2000 != 0 {
            let mode = if kind == s::FileKind::Directory { mode | 0o2000 } else { mode };
            return Ok((dir.gid, mode));
        }
        Ok((cred.gid, mode))
    }

    fn apply(&mut self, session: SessionId, op: Op, now: p::Time) -> Result<Reply, p::OpError> {
        match self.apply_inner(session, op, now) {
            Ok(r) => Ok(r),
            Err(Failure::Wire(e)) => Err(e),
            Err(Failure::Store(e)) => {
                if e.is_corruption() || matches!(e, s::Error::Io { .. } | s::Error::Poisoned(_)) {
                    tracing::error!("{e}");
                }
                Err(error_out(&e))
            }
        }
    }

    fn apply_inner(&mut self, session: SessionId, op: Op, now: p::Time) -> Result<Reply, Failure> {
        if !self.pins.is_empty() && !matches!(op, Op::Open { .. } | Op::Release { .. }) {
            if let Some(ino) = op_inodes(&op).into_iter().find(|&i| self.only_pinned(i)) {
                return Err(Failure::Wire(errno(2, format!("inode {ino} was removed"))));
            }
        }
        let now_s = time_in(now);
        let st = &mut self.store;
        match op {
            // A client decoding a file handle asks for an inode by number ("." of it) or
            // for a directory's parent (".."); neither is an entry: no leaf.
            Op::Lookup { parent, name } if name == b"." || name == b".." => {
                let dir = st.getattr(parent)?;
                let ino = if name == b"." {
                    parent
                } else if dir.kind == s::FileKind::Directory {
                    dir.parent
                } else {
                    return Err(Failure::Wire(errno(20, format!("inode {parent} is not a directory"))));
                };
                let attr = attr_out(&st.getattr(ino)?);
                Ok(Reply::Lookup { attr: Some(attr), leaf: p::DirLeaf { hash_lo: 1, hash_hi: 0, items: Vec::new() } })
            }
            Op::Lookup { parent, name } => {
                let l = st.lookup_leaf(parent, &name, LOOKUP_NEIGHBOURS)?;
                let items = l.neighbours.iter().map(|(e, i)| p::DirItem {
                    name: e.name.clone(),
                    index: e.index,
                    attr: attr_out(i),
                });
                let leaf = p::DirLeaf { hash_lo: l.hash_lo, hash_hi: l.hash_hi, items: items.collect() };
                Ok(Reply::Lookup { attr: l.found.as_ref().map(attr_out), leaf })
            }
            Op::GetAttr { ino } => Ok(Reply::Attr(attr_out(&st.getattr(ino)?))),
            Op::Acquire { ino } => {
                if self.space.low() {
                    return Err(Failure::Wire(errno(28, "space is short: changes go to the server one by one")));
                }
                let dir = st.getattr(ino)?;
                if dir.kind != s::FileKind::Directory {
                    return Err(Failure::Wire(errno(20, format!("acquire of inode {ino}: not a directory"))));
                }
                let items = self.dir_items(ino, 0, p::MAX_ACQUIRE_ENTRIES + 1)?;
                let name_bytes: usize = items.iter().map(|i| i.name.len()).sum();
                if items.len() > p::MAX_ACQUIRE_ENTRIES || name_bytes > p::MAX_ACQUIRE_BYTES {
                    return Err(Failure::Wire(errno(7, format!("directory {ino} is too large to hold exclusively"))));
                }
                let leaf = p::DirLeaf { hash_lo: 0, hash_hi: u64::MAX, items };
                Ok(Reply::Lookup { attr: Some(attr_out(&dir)), leaf })
            }
            Op::SetAttr { ino, set } => {
                let t = |x: Option<p::SetTime>| {
                    x.map(|x| match x {
                        p::SetTime::Now => now_s,
                        p::SetTime::At(t) => time_in(t),
                    })
                };
                let sa = s::SetAttr {
                    mode: set.mode,
                    uid: set.uid,
                    gid: set.gid,
                    size: set.size_bytes,
                    atime: t(set.atime),
                    mtime: t(set.mtime),
                    ctime: set.ctime.map(time_in),
                };
                let inode = st.setattr(ino, &sa, now_s)?;
                if let Some(mode) = set.mode {
                    acl::chmod(st, ino, mode, now_s)?;
                }
                Ok(Reply::Attr(attr_out(&inode)))
            }
            Op::ReadDir { ino, from_index, limit } => {
                let limit = limit.clamp(1, READDIR_MAX_ITEMS) as usize;
                let next_index = self.store.getattr(ino)?.next_index;
                let mut items = self.dir_items(ino, from_index, limit + 1)?;
                let end = items.len() <= limit;
                items.truncate(limit);
                Ok(Reply::Dir { items, end, next_index })
            }
            Op::Create { parent, name, kind, mode, rdev, cred } => {
                let kind = kind_in(kind);
                let got = acl::inherit(&mut self.store, parent, kind, mode, cred.umask)?;
                let (gid, mode) = self.new_owner(parent, cred, kind, got.mode)?;
                let inode = self.store.create(parent, &name, kind, mode, cred.uid, gid, rdev, now_s)?;
                Ok(Reply::Entry(attr_out(&acl::store_inherited(&mut self.store, inode, &got, now_s)?)))
            }
            Op::Symlink { parent, name, target, cred } => {
                let (gid, _) = self.new_owner(parent, cred, s::FileKind::Symlink, 0)?;
                let inode = self.store.symlink(parent, &name, &target, cred.uid, gid, now_s)?;
                Ok(Reply::Entry(attr_out(&inode)))
            }
            Op::Link { ino, parent, name } => {
                let inode = st.link(ino, parent, &name, now_s)?;
                Ok(Reply::Entry(attr_out(&inode)))
            }
            Op::Unlink { parent, name } => Ok(st.unlink(parent, &name, now_s).map(|_| Reply::Done)?),
            Op::Rmdir { parent, name } => Ok(st.rmdir(parent, &name, now_s).map(|_| Reply::Done)?),
            Op::Rename { parent, name, new_parent, new_name, flags } => {
                let whiteout = flags & p::RENAME_WHITEOUT != 0;
                if flags & !(p::RENAME_NOREPLACE | p::RENAME_EXCHANGE | p::RENAME_WHITEOUT) != 0
                    || (whiteout && flags & p::RENAME_EXCHANGE != 0)
                {
                    return Err(Failure::Wire(errno(22, format!("unsupported rename flags {flags:#x}"))));
                }
                let f = s::RenameFlags {
                    noreplace: flags & p::RENAME_NOREPLACE != 0,
                    exchange: flags & p::RENAME_EXCHANGE != 0,
                };
                st.rename(parent, &name, new_parent, &new_name, f, now_s)?;
                if whiteout {
                    // In the same unit as the rename: a crash keeps both or neither.
                    st.create(parent, &name, s::FileKind::CharDevice, 0, 0, 0, 0, now_s)?;
                }
                Ok(Reply::Done)
            }
            Op::ReadLink { ino } => Ok(st.readlink(ino).map(Reply::Data)?),
            Op::Open { ino, handle } => {
                let inode = self.open_handle(session, ino, handle)?;
                if inode.nlink == 0 {
                    // Recorded once the request is done (a record commits: not inside a unit).
                    self.opened_orphans.push(ino);
                }
                Ok(Reply::Attr(attr_out(&inode)))
            }
            Op::Release { ino, handle } => {
                let held = self.sessions.get_mut(&session).is_some_and(|s| {
                    let Some(handles) = s.open.get_mut(&ino) else { return false };
                    let held = handles.remove(&handle);
                    if handles.is_empty() {
                        s.open.remove(&ino);
                    }
                    held
                });
                if !held {
                    return Ok(Reply::Done); // already released (a retry), or never opened
                }
                Ok(self.store.release_handle(ino).map(|()| Reply::Done)?)
            }
            Op::Read { ino, offset, len } => {
                Ok(st.read(ino, offset, u64::from(len.min(p::MAX_IO_BYTES))).map(Reply::Data)?)
            }
            Op::Write { ino, offset, data } | Op::WriteBack { ino, offset, data } => {
                if data.len() > p::MAX_IO_BYTES as usize {
                    return Err(Failure::Wire(errno(27, "write larger than the protocol allows")));
                }
                self.written_since_commit += data.len() as u64;
                let st = &mut self.store;
                Ok(st.write(ino, offset, &data, now_s).map(|i| Reply::Attr(attr_out(&i)))?)
            }
            Op::Append { ino, data } => {
                if data.len() > p::MAX_IO_BYTES as usize {
                    return Err(Failure::Wire(errno(27, "write larger than the protocol allows")));
                }
                self.written_since_commit += data.len() as u64;
                let end = self.store.getattr(ino)?.size;
                Ok(self.store.write(ino, end, &data, now_s).map(|i| Reply::Attr(attr_out(&i)))?)
            }
            Op::Fallocate { ino, offset, len, flags } => {
                let known = p::FALLOC_FL_KEEP_SIZE | p::FALLOC_FL_PUNCH_HOLE | p::FALLOC_FL_ZERO_RANGE;
                if flags & !known != 0 {
                    return Err(Failure::Wire(errno(95, format!("fallocate mode {flags:#x}"))));
                }
                let mode = s::FallocateMode {
                    keep_size: flags & p::FALLOC_FL_KEEP_SIZE != 0,
                    punch_hole: flags & p::FALLOC_FL_PUNCH_HOLE != 0,
                    zero_range: flags & p::FALLOC_FL_ZERO_RANGE != 0,
                };
                Ok(st.fallocate(ino, offset, len, mode, now_s).map(|i| Reply::Attr(attr_out(&i)))?)
            }
            Op::Fsync { ino } => Ok(st.fsync(ino).map(|()| Reply::Done)?),
            Op::StatFs => {
                let f = st.statfs();
                Ok(Reply::StatFs(p::StatFs {
                    block_size: f.block_size,
                    total_blocks: f.total_blocks,
                    free_blocks: f.free_blocks,
                    avail_blocks: f.avail_blocks,
                    files: f.files,
                    files_free: f.files_free,
                    name_max: f.name_max,
                }))
            }
            Op::SetXattr { ino, name, value, flags } => {
                // Linux refuses a bad name or an oversized value before looking at flags.
                s::fs::xattr::check(&name, value.len())?;
                if flags & (p::XATTR_CREATE | p::XATTR_REPLACE) != 0 {
                    let exists = match st.getxattr(ino, &name) {
                        Ok(_) => true,
                        Err(s::Error::NoXattr(_)) => false,
                        Err(e) => return Err(e.into()),
                    };
                    if flags & p::XATTR_CREATE != 0 && exists {
                        return Err(Failure::Wire(errno(17, "xattr exists")));
                    }
                    if flags & p::XATTR_REPLACE != 0 && !exists {
                        return Err(Failure::Wire(errno(61, "no such xattr")));
                    }
                }
                if p::acl::flag_of(&name) != 0 {
                    return acl::set(st, ino, &name, &value, flags, now_s).map(|()| Reply::Done);
                }
                Ok(st.setxattr(ino, &name, &value, now_s).map(|()| Reply::Done)?)
            }
            // Handled by `handle_request` (it sets the clock for what follows).
            Op::At { .. } => Ok(Reply::Done),
            // Answered by `Server::reassert` before the store is reached.
            Op::Reassert { ino, .. } => {
                Err(Failure::Wire(errno(22, format!("re-assert of inode {ino} inside a changing request"))))
            }
            Op::AllocInodes { count } => {
                let count = count.clamp(1, p::MAX_INODE_GRANT);
                let first = st.reserve_inode_numbers(u64::from(count))?;
                Ok(Reply::Inodes { first, count })
            }
            Op::CreateAt { ino, generation, parent, name, kind, mode, rdev, cred } => {
                let kind = kind_in(kind);
                let got = acl::inherit(&mut self.store, parent, kind, mode, cred.umask)?;
                let (gid, mode) = self.new_owner(parent, cred, kind, got.mode)?;
                let at = Some(s::NewInode { ino, generation });
                let inode = self.store.create_at(at, parent, &name, kind, mode, cred.uid, gid, rdev, now_s)?;
                Ok(Reply::Entry(attr_out(&acl::store_inherited(&mut self.store, inode, &got, now_s)?)))
            }
            Op::SymlinkAt { ino, generation, parent, name, target, cred } => {
                let (gid, _) = self.new_owner(parent, cred, s::FileKind::Symlink, 0)?;
                let at = Some(s::NewInode { ino, generation });
                let inode = self.store.symlink_at(at, parent, &name, &target, cred.uid, gid, now_s)?;
                Ok(Reply::Entry(attr_out(&inode)))
            }
            Op::GetXattr { ino, name } => Ok(st.getxattr(ino, &name).map(Reply::Data)?),
            Op::ListXattr { ino } => Ok(st.listxattr(ino).map(Reply::Names)?),
            Op::RemoveXattr { ino, name } => match st.removexattr(ino, &name, now_s) {
                // Removing an ACL is setting none: done when there is none (as ext4 says).
                Err(s::Error::NoXattr(_)) if p::acl::flag_of(&name) != 0 => Ok(Reply::Done),
                r => Ok(r.map(|()| Reply::Done)?),
            },
            Op::SetLock { ino, owner, start, end, kind, flock, pid } => {
                if start > end {
                    return Err(Failure::Wire(errno(22, format!("lock range {start}..={end} on inode {ino}"))));
                }
                if kind != p::LockKind::Unlock {
                    st.getattr(ino)?; // no locks on inodes that do not exist
                }
                let req = locks::Request { holder: locks::Holder { session, owner }, start, end, kind, flock, pid };
                match self.locks.set(ino, &req) {
                    Ok(()) => {
                        if kind != p::LockKind::Unlock {
                            self.record_session(session, "a lock holder");
                        }
                        Ok(Reply::Done)
                    }
                    Err(locks::Refusal::Conflict(c)) => Err(Failure::Wire(errno(
                        11,
                        format!(
                            "inode {ino}: bytes {}..={} {:?}-locked by pid {} of another owner",
                            c.start, c.end, c.kind, c.pid
                        ),
                    ))),
                    Err(locks::Refusal::TooMany) => Err(Failure::Wire(errno(
                        37,
                        format!("inode {ino} already carries {} locks", locks::MAX_LOCKS_PER_FILE),
                    ))),
                }
            }
            Op::GetLock { ino, owner, start, end, kind, flock } => {
                if start > end {
                    return Err(Failure::Wire(errno(22, format!("lock range {start}..={end} on inode {ino}"))));
                }
                st.getattr(ino)?;
                Ok(Reply::Lock(self.locks.test(ino, locks::Holder { session, owner }, start, end, kind, flock)))
            }
        }
    }
}

/// The inode an operation is about, for the rights its reply grants.
fn op_inode(op: &Op) -> Option<u64> {
    match op {
        Op::Lookup { parent, .. } => Some(*parent),
        Op::ReadDir { ino, .. } | Op::Read { ino, .. } | Op::GetAttr { ino } | Op::Open { ino, .. } => Some(*ino),
        _ => None,
    }
}

/// Every inode an operation involves, for rights: what it names, but for these.
/// Turns `req`'s write-backs into plain writes (what runs is the same) and returns the
/// inodes they write (which decide whether the request waits: `park_for_flush`).
fn take_write_backs(req: &mut p::Request) -> Vec<u64> {
    let mut inos = Vec::new();
    for op in &mut req.ops {
        if let Op::WriteBack { ino, offset, data } = op {
            inos.push(*ino);
            *op = Op::Write { ino: *ino, offset: *offset, data: std::mem::take(data) };
        }
    }
    inos
}

/// Destroys the files unlinked while open that nobody holds open any more.
fn reclaim_orphans(store: &mut Store) {
    if let Err(e) = store.reclaim_orphans() {
        tracing::error!("cannot reclaim unlinked files: {e}");
    }
}

fn op_inodes(op: &Op) -> Vec<u64> {
    match op {
        // fsync commits everything; it involves no one inode's rights. Locks live only on
        // the server: no client caches them. A re-assert never waits for anyone: it is
        // refused instead when another session holds the inode.
        Op::Fsync { .. } | Op::SetLock { .. } | Op::GetLock { .. } | Op::Reassert { .. } => Vec::new(),
        // The new inode's number was reserved for the creator: nobody else holds it.
        Op::CreateAt { parent, .. } | Op::SymlinkAt { parent, .. } => vec![*parent],
        other => other.named_inodes(),
    }
}

/// Inodes whose state a reply carries: the client may cache them from now on.
fn carried(op_inode: Option<u64>, reply: &Reply) -> Vec<u64> {
    let mut v: Vec<u64> = op_inode.into_iter().collect();
    match reply {
        Reply::Attr(a) | Reply::Entry(a) => v.push(a.ino),
        Reply::Lookup { attr, leaf } => {
            v.extend(attr.iter().map(|a| a.ino));
            v.extend(leaf.items.iter().map(|i| i.attr.ino));
        }
        Reply::Dir { items, .. } => v.extend(items.iter().map(|i| i.attr.ino)),
        Reply::Data(_) | Reply::Names(_) | Reply::StatFs(_) | Reply::Done | Reply::Inodes { .. } | Reply::Lock(_) => {}
    }
    v
}

/// Why an operation failed: in the store, or refused here with an errno.
pub(crate) enum Failure {
    Store(s::Error),
    Wire(p::OpError),
}

impl From<s::Error> for Failure {
    fn from(e: s::Error) -> Failure {
        Failure::Store(e)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crest_store::{MemDisk, MkfsOptions};

    /// A new file system on a shared in-memory disk (to reopen after a simulated crash).
    fn fresh_disk() -> MemDisk {
        let disk = MemDisk::new(16 << 20);
        Store::mkfs(Box::new(disk.clone()), &MkfsOptions { now: s::Timespec::new(1, 0), fsid: None }).expect("mkfs");
        disk
    }

    fn server() -> Server {
        Server::new(Store::open(Box::new(fresh_disk())).expect("open"))
    }

    /// A server with two sessions, a and b.
    fn two_sessions() -> (Server, SessionId, SessionId) {
        let mut srv = server();
        let (a, _) = srv.handle_hello(&hello(None));
        let (b, _) = srv.handle_hello(&hello(None));
        (srv, a.expect("a"), b.expect("b"))
    }

    /// Request `id` carrying `ops` at the server's clock.
    fn req(id: u64, ops: Vec<Op>) -> p::Request {
        p::Request { id, ops, time: None }
    }

    /// The first result of the one response the last step sent (and nothing else).
    fn sole_result(srv: &mut Server) -> Result<Reply, p::OpError> {
        let out = srv.take_outgoing();
        let [Outgoing::Response { response, .. }] = &out[..] else { panic!("{out:?}") };
        response.results[0].clone()
    }

    /// Request `id`: create regular file `name` in the root.
    fn create_in_root(id: u64, name: &str) -> p::Request {
        p::Request {
            id,
            ops: vec![Op::Create {
                parent: 1,
                name: name.as_bytes().to_vec(),
                kind: p::FileType::Regular,
                mode: 0o644,
                rdev: 0,
                cred: p::Cred::default(),
            }],
            time: None,
        }
    }

    fn hello(resume: Option<p::SessionToken>) -> p::Hello {
        p::Hello { magic: p::HELLO_MAGIC, version: p::PROTOCOL_VERSION, client_name: "test".into(), resume }
    }

    const NOW: p::Time = p::Time { sec: 5, nsec: 0 };

    #[test]
    fn retried_create_applies_once() {
        let mut srv = server();
        let (sid, w) = srv.handle_hello(&hello(None));
        let sid = sid.expect("session");
        let token = match w {
            p::ServerMessage::Welcome(w) => w.session,
            other => panic!("{other:?}"),
        };
        let create = create_in_root(1, "f");
        let first = srv.handle_request(sid, create.clone(), NOW);
        assert!(first.results[0].is_ok());
        // The connection drops; the client resumes and retries the same id.
        let (sid2, w) = srv.handle_hello(&hello(Some(token)));
        assert!(matches!(w, p::ServerMessage::Welcome(p::Welcome { resumed: true, .. })));
        let again = srv.handle_request(sid2.expect("resumed"), create.clone(), NOW);
        assert_eq!(again, first, "the retry is answered from the cache, not re-applied (EEXIST)");
        // A new request id with the same op does run again (and fails: EEXIST).
        let fresh = srv.handle_request(sid, p::Request { id: 2, ..create.clone() }, NOW);
        assert_eq!(fresh.results[0].as_ref().err().map(|e| e.errno), Some(17));
    }

    #[test]
    fn xattrs_up_to_the_linux_limits_and_their_errors() {
        let mut srv = server();
        let (sid, _) = srv.handle_hello(&hello(None));
        let sid = sid.expect("session");
        let r = srv.handle_request(sid, create_in_root(1, "f"), NOW);
        let Ok(Reply::Entry(a)) = &r.results[0] else { panic!("{r:?}") };
        let ino = a.ino;
        let set = |name: Vec<u8>, len: usize, flags| Op::SetXattr { ino, name, value: vec![9; len], flags };
        let errno_of = |srv: &mut Server, id, op| {
            srv.handle_request(sid, req(id, vec![op]), NOW).results[0].as_ref().err().map(|e| e.errno)
        };
        // Linux checks the name and the value's size before the flags: ERANGE, E2BIG.
        assert_eq!(errno_of(&mut srv, 2, set(vec![b'a'; 256], 1, p::XATTR_REPLACE)), Some(34));
        assert_eq!(errno_of(&mut srv, 3, set(Vec::new(), 1, 0)), Some(34));
        assert_eq!(errno_of(&mut srv, 4, set(b"user.a".to_vec(), 65_537, p::XATTR_REPLACE)), Some(7));
        assert_eq!(errno_of(&mut srv, 5, set(b"user.a".to_vec(), 65_536, p::XATTR_CREATE)), None);
        let r = srv.handle_request(sid, req(6, vec![Op::GetXattr { ino, name: b"user.a".to_vec() }]), NOW);
        assert_eq!(r.results[0], Ok(Reply::Data(vec![9; 65_536])), "a 64 KiB value travels whole");
    }

    #[test]
    fn wrong_version_and_bad_tokens() {
        let mut srv = server();
        let mut h = hello(None);
        h.version = 42;
        let (sid, msg) = srv.handle_hello(&h);
        assert!(sid.is_none());
        assert!(matches!(msg, p::ServerMessage::Refused { reason, .. } if reason.contains("42")));
        let (_, msg) = srv.handle_hello(&hello(Some(p::SessionToken { id: 1, secret: 0 })));
        assert!(matches!(msg, p::ServerMessage::Welcome(p::Welcome { resumed: false, .. })));
    }

    #[test]
    fn setgid_directories_pass_on_their_group() {
        let mut srv = server();
        let (sid, _) = srv.handle_hello(&hello(None));
        let sid = sid.expect("session");
        let mk = |name: &str, kind, parent, uid, gid| Op::Create {
            parent,
            name: name.as_bytes().to_vec(),
            kind,
            mode: 0o755,
            rdev: 0,
            cred: p::Cred { uid, gid, umask: 0 },
        };
        let r = srv.handle_request(
            sid,
            p::Request { id: 1, ops: vec![mk("d", p::FileType::Directory, 1, 0, 50)], time: None },
            NOW,
        );
        let Ok(Reply::Entry(d)) = &r.results[0] else { panic!("{r:?}") };
        let set = p::SetAttr { mode: Some(0o2775), ..Default::default() };
        srv.handle_request(sid, p::Request { id: 2, ops: vec![Op::SetAttr { ino: d.ino, set }], time: None }, NOW);
        let r = srv.handle_request(
            sid,
            p::Request {
                id: 3,
                ops: vec![mk("f", p::FileType::Regular, d.ino, 7, 7), mk("sub", p::FileType::Directory, d.ino, 7, 7)],
                time: None,
            },
            NOW,
        );
        let Ok(Reply::Entry(f)) = &r.results[0] else { panic!("{r:?}") };
        let Ok(Reply::Entry(sub)) = &r.results[1] else { panic!("{r:?}") };
        assert_eq!((f.gid, f.mode & 0o2000), (50, 0));
        assert_eq!((sub.gid, sub.mode & 0o2000), (50, 0o2000));
    }

    #[test]
    fn the_protocol_hash_is_the_stores_hash() {
        // Clients judge leaf ranges with the protocol's hash; the store orders entries by
        // its own. They must be the same function.
        for name in [&b""[..], b"a", b"Makefile", &[0xff, 0x80, 0x01], &[b'x'; 255]] {
            assert_eq!(p::name_hash(name), s::key::name_hash(name), "{name:?}");
        }
    }

    #[test]
    fn session_records_round_trip_and_bad_ones_are_refused() {
        let r = encode_record(42, 7, &[3, 5], "host-a");
        let want = Record { secret: 42, seq: 7, holes: vec![3, 5], name: "host-a".into() };
        assert_eq!(decode_record(&r), Some(want));
        for cut in 0..r.len() {
            assert_eq!(decode_record(&r[..cut]), None, "truncated at {cut}");
        }
        let mut bad = r.clone();
        bad[0] = 3;
        assert_eq!(decode_record(&bad), None, "unknown version");
        let mut long = r.clone();
        long.push(b'x');
        assert_eq!(decode_record(&long), None, "name length disagrees");
        assert_eq!(decode_record(&encode_record(42, 5, &[5], "h")), None, "a hole at or above its seq");
        let mut many = encode_record(42, 7, &[], "h");
        many[17] = (MAX_RECORD_HOLES + 1) as u8;
        assert_eq!(decode_record(&many), None, "more holes than a record names");
        // A version 1 record (no holes), as written before.
        let mut v1 = vec![1];
        v1.extend_from_slice(&42u64.to_le_bytes());
        v1.extend_from_slice(&7u64.to_le_bytes());
        v1.push(1);
        v1.push(b'h');
        assert_eq!(decode_record(&v1), Some(Record { secret: 42, seq: 7, holes: vec![], name: "h".into() }));
        let holes: Vec<u64> = (1..=MAX_RECORD_HOLES as u64 + 5).collect();
        let huge = encode_record(1, u64::MAX, &holes, &"n".repeat(1000));
        assert!(huge.len() <= s::sessions::MAX_SESSION_RECORD_BYTES);
    }

    #[test]
    fn after_a_crash_a_resumed_session_learns_exactly_which_changes_survived() {
        let disk = fresh_disk();
        let mut srv = Server::new(Store::open(Box::new(disk.clone())).expect("open"));
        let (sid, w) = srv.handle_hello(&hello(None));
        let sid = sid.expect("session");
        let p::ServerMessage::Welcome(w) = w else { panic!("{w:?}") };
        let mk = create_in_root;
        let r1 = srv.handle_request(sid, mk(1, "one"), NOW);
        assert_eq!((r1.seq, r1.durable), (1, 0));
        let read = srv.handle_request(sid, p::Request { id: 2, ops: vec![Op::GetAttr { ino: 1 }], time: None }, NOW);
        assert_eq!(read.seq, 0, "reads take no place in the order");
        let r2 = srv.handle_request(sid, p::Request { id: 3, ops: vec![Op::Fsync { ino: 1 }], time: None }, NOW);
        assert_eq!((r2.seq, r2.durable), (2, 2), "fsync makes everything so far durable");
        let r3 = srv.handle_request(sid, mk(4, "two"), NOW);
        assert_eq!((r3.seq, r3.durable), (3, 2));
        // Power cut: nothing after the fsync is on disk.
        drop(srv.into_store().abandon());
        let mut srv = Server::new(Store::open(Box::new(disk.clone())).expect("reopen"));
        let (sid2, msg) = srv.handle_hello(&hello(Some(w.session)));
        assert_eq!(sid2, Some(sid));
        let p::ServerMessage::Welcome(w2) = msg else { panic!("{msg:?}") };
        assert!(w2.resumed);
        assert_eq!(w2.durable_seq, Some(2), "changes up to seq 2 survived");
        // Replaying the lost change applies it (once), with the next seq.
        let again = srv.handle_request(sid, mk(4, "two"), NOW);
        assert!(again.results[0].is_ok(), "{again:?}");
        assert_eq!(again.seq, 3);
        // A later reconnect (no restart) says nothing about durability.
        let (_, msg) = srv.handle_hello(&hello(Some(w.session)));
        assert!(matches!(msg, p::ServerMessage::Welcome(p::Welcome { resumed: true, durable_seq: None, .. })));
        // A clean goodbye drops the record.
        srv.end_session(sid);
        let mut store = srv.into_store();
        store.commit().expect("commit");
        assert!(store.session_records().expect("records").is_empty());
    }

    #[test]
    fn a_file_unlinked_while_open_outlives_a_restart_for_a_client_that_opens_it_again() {
        for reopens in [false, true] {
            let disk = fresh_disk();
            let mut srv = Server::new(Store::open_keeping_orphans(Box::new(disk.clone())).expect("open"));
            let (a, wa) = srv.handle_hello(&hello(None));
            let (b, wb) = srv.handle_hello(&hello(None));
            let (a, b) = (a.expect("a"), b.expect("b"));
            let (p::ServerMessage::Welcome(wa), p::ServerMessage::Welcome(wb)) = (wa, wb) else { panic!() };
            let Ok(Reply::Entry(x)) = run_answering_recalls(&mut srv, a, 1, create_in_root(1, "x").ops) else {
                panic!("create")
            };
            // b opens x, changes nothing (so far it has no record); a unlinks x: b's open
            // gives it a record; a's fsync makes it all durable.
            assert!(run_answering_recalls(&mut srv, b, 1, vec![Op::Open { ino: x.ino, handle: 4 }]).is_ok());
            let unlink = vec![Op::Unlink { parent: 1, name: b"x".to_vec() }, Op::Fsync { ino: 1 }];
            assert!(run_answering_recalls(&mut srv, a, 2, unlink).is_ok());
            drop(srv.into_store().abandon());
            let mut srv = Server::new(Store::open_keeping_orphans(Box::new(disk.clone())).expect("reopen"));
            let (b2, msg) = srv.handle_hello(&hello(Some(wb.session)));
            assert_eq!(b2, Some(b), "b's session is restored: {msg:?}");
            if reopens {
                let r = srv.handle_request(b, req(2, vec![Op::Open { ino: x.ino, handle: 4 }]), NOW);
                assert!(matches!(&r.results[0], Ok(Reply::Attr(o)) if o.nlink == 0), "{r:?}");
            }
            srv.replayed(b, NOW);
            assert_eq!(srv.handle_hello(&hello(Some(wa.session))).0, Some(a));
            srv.replayed(a, NOW);
            let _ = srv.take_outgoing();
            let r = srv.handle_request(b, req(3, vec![Op::Read { ino: x.ino, offset: 0, len: 10 }]), NOW);
            assert_eq!(r.results[0].is_ok(), reopens, "the orphan lives exactly while b opened it again: {r:?}");
        }
    }

    #[test]
    fn a_stall_of_the_server_itself_does_not_count_against_leases() {
        for forgiven in [false, true] {
            let (mut srv, a, _) = two_sessions();
            srv.handle(a, req(1, vec![Op::GetAttr { ino: 1 }]), p::Time { sec: 1, nsec: 0 });
            srv.tick(1_000).expect("tick");
            // One operation held the server's thread for 14 s: a's heartbeats wait unread.
            if forgiven {
                srv.forgive_stall(15_000, 14_000);
            }
            srv.tick(15_000).expect("tick");
            assert_eq!(srv.is_fenced(a), !forgiven, "forgiven: {forgiven}");
        }
    }

    #[test]
    fn restored_sessions_whose_client_never_returns_are_fenced_and_forgotten() {
        let disk = fresh_disk();
        let mut srv = Server::new(Store::open(Box::new(disk.clone())).expect("open"));
        let (sid, _) = srv.handle_hello(&hello(None));
        let req = p::Request { id: 1, ops: vec![Op::Fsync { ino: 1 }], time: None };
        srv.handle_request(sid.expect("session"), req, NOW);
        drop(srv.into_store().abandon());
        let mut srv = Server::new(Store::open(Box::new(disk)).expect("reopen"));
        assert_eq!(srv.sessions.len(), 1);
        srv.tick(1_000).expect("tick");
        assert_eq!(srv.sessions.len(), 1, "within the grace period");
        srv.tick(1_000 + crate::caps::GRACE_MS).expect("tick");
        assert!(srv.sessions.is_empty() && srv.is_fenced(sid.expect("session")), "fenced when the grace ends");
        let records = srv.store.session_records().expect("records");
        assert!(records.len() == 1 && is_fenced_marker(&records[0].1), "a marker tells its client later");
        srv.tick(1_000 + crate::caps::GRACE_MS + RESTORED_SESSION_GRACE_MS).expect("tick");
        assert!(srv.store.session_records().expect("records").is_empty(), "then it goes too");
    }

    #[test]
    fn locks_hold_across_sessions_and_go_with_their_session() {
        let (mut srv, a, b) = two_sessions();
        let lock = |id, owner, kind| p::Request {
            id,
            ops: vec![Op::SetLock { ino: 1, owner, start: 0, end: p::LOCK_TO_EOF, kind, flock: false, pid: 42 }],
            time: None,
        };
        let get = |id| p::Request {
            id,
            ops: vec![Op::GetLock { ino: 1, owner: 5, start: 10, end: 10, kind: p::LockKind::Read, flock: false }],
            time: None,
        };
        let r = srv.handle_request(a, lock(1, 5, p::LockKind::Write), NOW);
        assert_eq!((&r.results[0], r.seq), (&Ok(Reply::Done), 0), "a lock is no stored change");
        let again = srv.handle_request(a, lock(1, 5, p::LockKind::Write), NOW);
        assert_eq!(again.results[0], Ok(Reply::Done), "a retried lock is granted again");
        let r = srv.handle_request(b, lock(1, 5, p::LockKind::Read), NOW);
        assert_eq!(r.results[0].as_ref().err().map(|e| e.errno), Some(11), "the same owner id in another session");
        let r = srv.handle_request(b, get(2), NOW);
        let want = p::LockInfo { kind: p::LockKind::Write, start: 0, end: p::LOCK_TO_EOF, pid: 42 };
        assert_eq!(r.results[0], Ok(Reply::Lock(Some(want))));
        let bad = p::Request {
            id: 3,
            ops: vec![Op::SetLock {
                ino: 1,
                owner: 1,
                start: 9,
                end: 8,
                kind: p::LockKind::Read,
                flock: false,
                pid: 1,
            }],
            time: None,
        };
        assert_eq!(srv.handle_request(b, bad, NOW).results[0].as_ref().err().map(|e| e.errno), Some(22));
        let missing = p::Request {
            id: 4,
            ops: vec![Op::SetLock {
                ino: 999,
                owner: 1,
                start: 0,
                end: 0,
                kind: p::LockKind::Read,
                flock: false,
                pid: 1,
            }],
            time: None,
        };
        assert!(srv.handle_request(b, missing, NOW).results[0].is_err(), "no such inode");
        // a's connection drops: its locks stay while it may come back…
        srv.heard(a, 10_000);
        srv.disconnected(a, 10_000);
        srv.tick(10_000 + crate::caps::DISCONNECTED_FENCE_MS - 1).expect("tick");
        assert_eq!(srv.handle_request(b, get(5), NOW).results[0], Ok(Reply::Lock(Some(want))));
        // …and go once it has been away too long (it is fenced).
        srv.tick(10_000 + crate::caps::DISCONNECTED_FENCE_MS).expect("tick");
        assert_eq!(srv.handle_request(b, get(6), NOW).results[0], Ok(Reply::Lock(None)));
        // A clean end of b's session drops b's.
        let r = srv.handle_request(b, lock(7, 1, p::LockKind::Write), NOW);
        assert_eq!(r.results[0], Ok(Reply::Done));
        srv.end_session(b);
        assert!(srv.locks.is_empty());
    }

    #[test]
    fn a_change_to_what_another_session_read_waits_for_its_recall() {
        let (mut srv, a, b) = two_sessions();
        let lookup = |id| p::Request { id, ops: vec![Op::Lookup { parent: 1, name: b"x".to_vec() }], time: None };
        srv.handle(b, lookup(1), NOW);
        assert!(matches!(&srv.take_outgoing()[..], [Outgoing::Response { session, .. }] if *session == b));
        let create = create_in_root(1, "x");
        srv.handle(a, create, NOW);
        let out = srv.take_outgoing();
        let [Outgoing::Notify { session, notify: p::Notify::Recall { recall_id, inodes } }] = &out[..] else {
            panic!("expected one recall to b: {out:?}")
        };
        assert_eq!((*session, inodes.as_slice()), (b, &[1u64][..]), "b's copy of the root directory");
        srv.recall_done(b, *recall_id, NOW);
        let out = srv.take_outgoing();
        assert!(
            matches!(&out[..], [Outgoing::Response { session, response }] if *session == a && response.results[0].is_ok())
        );
        // A read by a changes nothing and recalls nobody.
        srv.handle(a, lookup(2), NOW);
        assert!(matches!(&srv.take_outgoing()[..], [Outgoing::Response { .. }]));
    }

    /// Runs `ops` for `session` and answers every recall it sends at once; returns the
    /// first result of `session`'s response.
    fn run_answering_recalls(srv: &mut Server, session: SessionId, id: u64, ops: Vec<Op>) -> Result<Reply, p::OpError> {
        srv.handle(session, req(id, ops), NOW);
        loop {
            let out = srv.take_outgoing();
            let mut result = None;
            for o in out {
                match o {
                    Outgoing::Notify { session: t, notify: p::Notify::Recall { recall_id, .. } } => {
                        srv.recall_done(t, recall_id, NOW)
                    }
                    Outgoing::Response { session: s, response } if s == session => {
                        result = Some(response.results[0].clone())
                    }
                    _ => {}
                }
            }
            if let Some(r) = result {
                return r;
            }
        }
    }

    #[test]
    fn a_file_another_session_cached_outlives_its_unlink_until_that_session_answers() {
        for opens in [false, true] {
            let (mut srv, a, b) = two_sessions();
            let Ok(Reply::Entry(x)) = run_answering_recalls(&mut srv, a, 1, create_in_root(1, "x").ops) else {
                panic!("create")
            };
            let lookup = vec![Op::Lookup { parent: 1, name: b"x".to_vec() }];
            assert!(run_answering_recalls(&mut srv, b, 1, lookup).is_ok());
            // b caches x: it may open it without asking, and send the open behind.
            srv.handle(a, req(2, vec![Op::Unlink { parent: 1, name: b"x".to_vec() }]), NOW);
            let out = srv.take_outgoing();
            let [Outgoing::Notify { session, notify: p::Notify::Recall { recall_id, .. } }] = &out[..] else {
                panic!("expected a recall to b: {out:?}")
            };
            assert_eq!(*session, b);
            let recall_id = *recall_id;
            if opens {
                srv.handle(b, req(2, vec![Op::Open { ino: x.ino, handle: 9 }]), NOW);
                let Ok(Reply::Attr(open)) = sole_result(&mut srv) else { panic!("b's open of the unlinked x") };
                assert_eq!(open.nlink, 0);
            }
            srv.recall_done(b, recall_id, NOW);
            assert!(matches!(&srv.take_outgoing()[..], [Outgoing::Response { session, .. }] if *session == a));
            srv.handle(b, req(3, vec![Op::GetAttr { ino: x.ino }]), NOW);
            let after = sole_result(&mut srv);
            assert_eq!(after.is_ok(), opens, "x lives on exactly while b holds it open: {after:?}");
            if opens {
                srv.handle(b, req(4, vec![Op::Release { ino: x.ino, handle: 9 }]), NOW);
                assert!(sole_result(&mut srv).is_ok());
                srv.handle(b, req(5, vec![Op::GetAttr { ino: x.ino }]), NOW);
                assert_eq!(sole_result(&mut srv).err().map(|e| e.errno), Some(2), "the last close frees it");
            }
        }
    }

    #[test]
    fn a_write_waits_for_other_openers_to_write_back_first() {
        let (mut srv, a, b) = two_sessions();
        let Ok(Reply::Entry(x)) = run_answering_recalls(&mut srv, b, 1, create_in_root(1, "x").ops) else {
            panic!("create")
        };
        let ino = x.ino;
        assert!(run_answering_recalls(&mut srv, b, 2, vec![Op::Write { ino, offset: 0, data: vec![b'0'; 64] }]).is_ok());
        assert!(run_answering_recalls(&mut srv, a, 1, vec![Op::Open { ino, handle: 1 }]).is_ok());
        // a holds x open (it may have dirtied a shared mapping): b's write waits.
        srv.handle(b, req(3, vec![Op::Write { ino, offset: 10, data: b"BB".to_vec() }]), NOW);
        let out = srv.take_outgoing();
        let [Outgoing::Notify { session, notify: p::Notify::Recall { recall_id, inodes } }] = &out[..] else {
            panic!("expected a flush recall to a: {out:?}")
        };
        assert_eq!((*session, inodes.as_slice()), (a, &[ino][..]));
        let recall_id = *recall_id;
        // a writes its dirty page back before answering: that runs at once, b's waits on.
        srv.handle(a, req(2, vec![Op::Write { ino, offset: 0, data: b"AAAAAAAAAAAAAAAA".to_vec() }]), NOW);
        let out = srv.take_outgoing();
        assert!(out.iter().any(|o| matches!(o, Outgoing::Response { session, .. } if *session == a)), "{out:?}");
        assert!(!out.iter().any(|o| matches!(o, Outgoing::Response { session, .. } if *session == b)), "{out:?}");
        srv.recall_done(a, recall_id, NOW);
        let out = srv.take_outgoing();
        for o in out {
            if let Outgoing::Notify { session, notify: p::Notify::Recall { recall_id, .. } } = o {
                srv.recall_done(session, recall_id, NOW);
            }
        }
        srv.handle(b, req(4, vec![Op::Read { ino, offset: 0, len: 16 }]), NOW);
        let out = srv.take_outgoing();
        let data = out.iter().find_map(|o| match o {
            Outgoing::Response { session, response } if *session == b && response.id == 4 => {
                response.results[0].clone().ok()
            }
            _ => None,
        });
        assert_eq!(data, Some(Reply::Data(b"AAAAAAAAAABBAAAA".to_vec())), "b's write lands after a's write-back");
    }

    #[test]
    fn an_open_parked_behind_exclusive_rights_holds_the_file_before_the_holders_unlink() {
        let (mut srv, a, b) = two_sessions();
        let Ok(Reply::Entry(x)) = run_answering_recalls(&mut srv, a, 1, create_in_root(1, "x").ops) else {
            panic!("create")
        };
        // a holds x exclusively (it made it): b's open waits for a's rights, yet it is
        // already an open when a's unlink, sent before a answered, runs.
        srv.handle(b, req(1, vec![Op::Open { ino: x.ino, handle: 3 }]), NOW);
        let out = srv.take_outgoing();
        let [Outgoing::Notify { session, notify: p::Notify::Recall { recall_id, .. } }] = &out[..] else {
            panic!("expected a recall of a's rights: {out:?}")
        };
        assert_eq!(*session, a);
        let recall_id = *recall_id;
        srv.handle(a, req(2, vec![Op::Unlink { parent: 1, name: b"x".to_vec() }]), NOW);
        assert!(matches!(&srv.take_outgoing()[..], [Outgoing::Response { session, .. }] if *session == a));
        srv.recall_done(a, recall_id, NOW);
        let out = srv.take_outgoing();
        let [Outgoing::Response { session, response }] = &out[..] else { panic!("{out:?}") };
        assert_eq!(*session, b);
        assert!(matches!(&response.results[0], Ok(Reply::Attr(o)) if o.nlink == 0), "{response:?}");
    }

    #[test]
    fn another_sessions_request_waits_until_exclusive_rights_are_flushed_and_returned() {
        let (mut srv, a, b) = two_sessions();
        // a makes a directory: it holds it exclusively from birth.
        let mkdir = Op::Create {
            parent: 1,
            name: b"d".to_vec(),
            kind: p::FileType::Directory,
            mode: 0o755,
            rdev: 0,
            cred: p::Cred::default(),
        };
        srv.handle(a, req(1, vec![mkdir, Op::AllocInodes { count: 8 }]), NOW);
        let out = srv.take_outgoing();
        let [Outgoing::Response { response, .. }] = &out[..] else { panic!("{out:?}") };
        let (Ok(Reply::Entry(d)), Ok(Reply::Inodes { first, .. })) = (&response.results[0], &response.results[1])
        else {
            panic!("{response:?}")
        };
        let (d, first) = (d.ino, *first);
        // b looks inside: its request waits and a is asked to give d up.
        srv.handle(b, req(1, vec![Op::Lookup { parent: d, name: b"x".to_vec() }]), NOW);
        let out = srv.take_outgoing();
        let [Outgoing::Notify { session, notify: p::Notify::Recall { recall_id, inodes } }] = &out[..] else {
            panic!("expected a recall to a: {out:?}")
        };
        assert_eq!((*session, inodes.as_slice()), (a, &[d][..]));
        let recall_id = *recall_id;
        // a's writeback, sent before its answer, arrives first and is applied at a's time.
        let client_time = p::Time { sec: 1234, nsec: 5 };
        let create_at = Op::CreateAt {
            ino: first + 2,
            generation: 9,
            parent: d,
            name: b"x".to_vec(),
            kind: p::FileType::Regular,
            mode: 0o600,
            rdev: 0,
            cred: p::Cred { uid: 3, gid: 4, umask: 0 },
        };
        srv.handle(a, p::Request { id: 2, ops: vec![create_at], time: Some(client_time) }, NOW);
        let out = srv.take_outgoing();
        let [Outgoing::Response { response, .. }] = &out[..] else { panic!("{out:?}") };
        let Ok(Reply::Entry(x)) = &response.results[0] else { panic!("{response:?}") };
        assert_eq!((x.ino, x.generation, x.uid, x.gid, x.mtime), (first + 2, 9, 3, 4, client_time));
        // a answers: b's lookup runs, but its reply would carry x, which a also holds
        // (it created it): that is recalled too before b hears anything.
        srv.recall_done(a, recall_id, NOW);
        let out = srv.take_outgoing();
        let [Outgoing::Notify { session, notify: p::Notify::Recall { recall_id, inodes } }] = &out[..] else {
            panic!("expected a recall of x to a: {out:?}")
        };
        assert_eq!((*session, inodes.as_slice()), (a, &[first + 2][..]));
        srv.recall_done(a, *recall_id, NOW);
        let out = srv.take_outgoing();
        let [Outgoing::Response { session, response }] = &out[..] else { panic!("{out:?}") };
        assert_eq!(*session, b);
        assert!(matches!(&response.results[0], Ok(Reply::Lookup { attr: Some(found), .. }) if found.ino == first + 2));
        // A holder that does not answer delays b only until its time runs out.
        let create = Op::Create {
            parent: d,
            name: b"y".to_vec(),
            kind: p::FileType::Regular,
            mode: 0o600,
            rdev: 0,
            cred: p::Cred::default(),
        };
        srv.handle(a, req(3, vec![create]), NOW);
        // (b caches d now: a's create is answered once b dropped it.)
        let out = srv.take_outgoing();
        let [Outgoing::Notify { session, notify: p::Notify::Recall { recall_id, .. } }] = &out[..] else {
            panic!("{out:?}")
        };
        assert_eq!(*session, b);
        srv.recall_done(b, *recall_id, NOW);
        let out = srv.take_outgoing();
        let [Outgoing::Response { response, .. }] = &out[..] else { panic!("{out:?}") };
        let Ok(Reply::Entry(y)) = &response.results[0] else { panic!("{response:?}") };
        let y = y.ino;
        srv.handle(b, req(2, vec![Op::GetAttr { ino: y }]), NOW);
        let out = srv.take_outgoing();
        assert!(matches!(&out[..], [Outgoing::Notify { session, .. }] if *session == a), "{out:?}");
        // b stays in touch; a stays silent for a whole lease: it is fenced.
        let later = millis(NOW) + crate::caps::LEASE_MS;
        srv.heard(b, later);
        srv.tick(later - 1).expect("tick");
        assert!(srv.take_outgoing().is_empty(), "a's lease has not lapsed yet");
        srv.tick(later).expect("tick");
        let out = srv.take_outgoing();
        assert!(matches!(&out[..], [Outgoing::Response { session, .. }] if *session == b), "{out:?}");
        // Nobody holds y exclusively now: b's next look at it does not wait.
        srv.handle(b, req(3, vec![Op::GetAttr { ino: y }]), time_of_millis(later));
        assert!(matches!(&srv.take_outgoing()[..], [Outgoing::Response { .. }]));
        // a's late writeback is refused, not applied, and a is told it was fenced.
        let late_write = Op::SetAttr { ino: y, set: p::SetAttr { mode: Some(0o777), ..Default::default() } };
        srv.handle(a, req(4, vec![late_write]), time_of_millis(later));
        let out = srv.take_outgoing();
        assert!(matches!(&out[..], [Outgoing::Notify { notify: p::Notify::Fenced, .. }]), "{out:?}");
        srv.handle(b, req(4, vec![Op::GetAttr { ino: y }]), time_of_millis(later));
        let out = srv.take_outgoing();
        let [Outgoing::Response { response, .. }] = &out[..] else { panic!("{out:?}") };
        assert!(matches!(&response.results[0], Ok(Reply::Attr(attr)) if attr.mode == 0o600));
        // Its client's resume starts a new session and says the old one was fenced.
        let (_, msg) = srv.handle_hello(&hello(Some(p::SessionToken { id: a, secret: 0 })));
        assert!(matches!(msg, p::ServerMessage::Welcome(p::Welcome { resumed: false, fenced: true, .. })));
    }

    #[test]
    fn open_and_release_are_idempotent_by_handle() {
        // A retried Open or Release (its connection broke) runs again: handles, not
        // counts, keep an unlinked file alive exactly until its last handle goes.
        let mut srv = server();
        let (a, _) = srv.handle_hello(&hello(None));
        let a = a.expect("a");
        let answer = |srv: &mut Server, id, ops| {
            srv.handle(a, req(id, ops), NOW);
            sole_result(srv)
        };
        srv.handle(a, create_in_root(1, "f"), NOW);
        let Ok(Reply::Entry(f)) = sole_result(&mut srv) else { panic!("create f") };
        let ino = f.ino;
        for (id, handle) in [(2, 7), (3, 7), (4, 8)] {
            assert!(matches!(answer(&mut srv, id, vec![Op::Open { ino, handle }]), Ok(Reply::Attr(_))));
        }
        assert!(answer(&mut srv, 5, vec![Op::Unlink { parent: 1, name: b"f".to_vec() }]).is_ok());
        for id in [6, 7] {
            assert!(answer(&mut srv, id, vec![Op::Release { ino, handle: 7 }]).is_ok());
        }
        assert!(
            matches!(answer(&mut srv, 8, vec![Op::GetAttr { ino }]), Ok(Reply::Attr(x)) if x.nlink == 0),
            "handle 8 keeps it"
        );
        assert!(answer(&mut srv, 9, vec![Op::Release { ino, handle: 8 }]).is_ok());
        assert_eq!(
            answer(&mut srv, 10, vec![Op::GetAttr { ino }]).err().map(|e| e.errno),
            Some(2),
            "gone with its last handle"
        );
        assert_eq!(answer(&mut srv, 11, vec![Op::Open { ino, handle: 9 }]).err().map(|e| e.errno), Some(2));
    }

    #[test]
    fn short_of_space_no_session_answers_changes_itself() {
        let (mut srv, a, b) = two_sessions();
        srv.handle(b, req(1, vec![Op::Acquire { ino: 1 }]), NOW);
        assert!(matches!(sole_result(&mut srv), Ok(Reply::Lookup { .. })));
        assert_eq!(srv.caps.exclusive_elsewhere(a, 1), Some(b));
        // a fills the image to within an eighth of its size (the limit for a small one).
        srv.handle(a, create_in_root(1, "spc"), NOW);
        let out = srv.take_outgoing();
        let [Outgoing::Notify { session, notify: p::Notify::Recall { recall_id, .. } }, ..] = &out[..] else {
            panic!("a's create in b's directory recalls it: {out:?}")
        };
        assert_eq!(*session, b);
        srv.recall_done(b, *recall_id, NOW);
        let Ok(Reply::Entry(spc)) = sole_result(&mut srv) else { panic!() };
        let st = srv.store.statfs();
        let len = (st.avail_blocks - st.total_blocks / 8 + 16) * u64::from(st.block_size);
        srv.handle(a, req(2, vec![Op::Fallocate { ino: spc.ino, offset: 0, len, flags: 0 }]), NOW);
        assert!(sole_result(&mut srv).is_ok());
        // b takes the root again; its next request finds space short: what it holds is
        // recalled, and it cannot take a directory whole again.
        srv.handle(b, create_in_root(2, "g"), NOW);
        let out = srv.take_outgoing();
        let recalled: Vec<u64> = out
            .iter()
            .filter_map(|o| match o {
                Outgoing::Notify { session, notify: p::Notify::Recall { inodes, .. } } if *session == a => {
                    Some(inodes.clone())
                }
                _ => None,
            })
            .flatten()
            .collect();
        assert!(recalled.contains(&spc.ino), "a's exclusive rights on what it made are recalled: {out:?}");
        let created = out.iter().find_map(|o| match o {
            Outgoing::Response { response, .. } => Some(response.results[0].clone()),
            _ => None,
        });
        let Some(Ok(Reply::Entry(g))) = created else { panic!("{out:?}") };
        let recall_of_g = out.iter().any(|o| {
            matches!(o, Outgoing::Notify { session, notify: p::Notify::Recall { inodes, .. } }
                if *session == b && inodes == &vec![g.ino])
        });
        assert!(recall_of_g, "what a create grants is recalled at once: {out:?}");
        for o in &out {
            if let Outgoing::Notify { session, notify: p::Notify::Recall { recall_id, .. } } = o {
                srv.recall_done(*session, *recall_id, NOW);
            }
        }
        assert!(srv.take_outgoing().is_empty());
        assert_eq!(srv.caps.exclusive_inodes(), Vec::<u64>::new());
        srv.handle(b, req(3, vec![Op::Acquire { ino: 1 }]), NOW);
        let out = srv.take_outgoing();
        let refused = out.iter().any(|o| {
            matches!(o, Outgoing::Response { response, .. }
                if matches!(&response.results[0], Err(e) if e.errno == 28))
        });
        assert!(refused, "{out:?}");
    }

    #[test]
    fn acquiring_a_directory_recalls_its_readers_and_makes_others_wait() {
        let (mut srv, a, b) = two_sessions();
        // b makes two files in the root and forgets its exclusive rights by a recall
        // (a's look at them); a then reads the root, so both cache it.
        srv.handle(b, create_in_root(1, "f"), NOW);
        let Ok(Reply::Entry(f)) = sole_result(&mut srv) else { panic!() };
        srv.handle(b, create_in_root(2, "g"), NOW);
        let Ok(Reply::Entry(g)) = sole_result(&mut srv) else { panic!() };
        srv.handle(a, req(1, vec![Op::Lookup { parent: 1, name: b"f".to_vec() }]), NOW);
        let out = srv.take_outgoing();
        let [Outgoing::Notify { notify: p::Notify::Recall { recall_id, .. }, .. }] = &out[..] else {
            panic!("{out:?}")
        };
        srv.recall_done(b, *recall_id, NOW);
        assert!(matches!(sole_result(&mut srv), Ok(Reply::Lookup { attr: Some(_), .. })));
        // A file is not a directory; a directory too large for one reply is refused.
        srv.handle(a, req(2, vec![Op::Acquire { ino: f.ino }]), NOW);
        assert_eq!(sole_result(&mut srv).err().map(|e| e.errno), Some(20));
        // b's acquire of the root waits until a dropped what it read of it.
        srv.handle(b, req(3, vec![Op::Acquire { ino: 1 }]), NOW);
        let out = srv.take_outgoing();
        let [Outgoing::Notify { session, notify: p::Notify::Recall { recall_id, inodes } }] = &out[..] else {
            panic!("expected a recall to a: {out:?}")
        };
        assert_eq!(*session, a);
        assert!(inodes.contains(&1) && inodes.contains(&f.ino), "{inodes:?}");
        srv.recall_done(a, *recall_id, NOW);
        let Ok(Reply::Lookup { attr: Some(root), leaf }) = sole_result(&mut srv) else { panic!() };
        assert_eq!(root.ino, 1);
        assert_eq!((leaf.hash_lo, leaf.hash_hi), (0, u64::MAX));
        let mut names: Vec<_> = leaf.items.iter().map(|i| (i.name.clone(), i.attr.ino)).collect();
        names.sort();
        assert_eq!(names, vec![(b"f".to_vec(), f.ino), (b"g".to_vec(), g.ino)]);
        for ino in [1, f.ino, g.ino] {
            assert_eq!(srv.caps.exclusive_elsewhere(a, ino), Some(b), "inode {ino}");
        }
        // Now a's look into the root, or at g, waits for b to give them up.
        srv.handle(a, req(4, vec![Op::GetAttr { ino: g.ino }]), NOW);
        let out = srv.take_outgoing();
        let [Outgoing::Notify { session, notify: p::Notify::Recall { recall_id, inodes } }] = &out[..] else {
            panic!("expected a recall to b: {out:?}")
        };
        assert_eq!((*session, inodes.as_slice()), (b, &[g.ino][..]));
        srv.recall_done(b, *recall_id, NOW);
        assert!(matches!(sole_result(&mut srv), Ok(Reply::Attr(x)) if x.ino == g.ino));
        // b takes the root back: a, which read g meanwhile, is asked to drop it first.
        srv.handle(b, req(5, vec![Op::Acquire { ino: 1 }]), NOW);
        let out = srv.take_outgoing();
        let [Outgoing::Notify { session, notify: p::Notify::Recall { recall_id, inodes } }] = &out[..] else {
            panic!("expected a recall to a: {out:?}")
        };
        assert_eq!((*session, inodes.as_slice()), (a, &[g.ino][..]));
        srv.recall_done(a, *recall_id, NOW);
        assert!(matches!(sole_result(&mut srv), Ok(Reply::Lookup { leaf, .. }) if leaf.items.len() == 2));
        assert_eq!(srv.caps.exclusive_elsewhere(a, g.ino), Some(b));
    }

    #[test]
    fn an_acquire_waits_for_the_recall_of_its_own_sessions_exclusive_rights() {
        // (Found by the simulator, seed 14630225732569651823.) a holds f exclusively (it
        // made it); b's look at f recalls it. Before a's answer, a acquires the root,
        // which names f: run at once, it would grant f again, a's client (seeing the
        // recall first, then the grant) would hold f, and a's answer to the recall would
        // then end a's rights here: a would answer changes of f itself unseen by b.
        let (mut srv, a, b) = two_sessions();
        srv.handle(a, create_in_root(1, "f"), NOW);
        let out = srv.take_outgoing();
        let [Outgoing::Response { response, .. }] = &out[..] else { panic!("{out:?}") };
        let Ok(Reply::Entry(f)) = &response.results[0] else { panic!("{response:?}") };
        srv.handle(b, req(1, vec![Op::GetAttr { ino: f.ino }]), NOW);
        let out = srv.take_outgoing();
        let [Outgoing::Notify { session, notify: p::Notify::Recall { recall_id, .. } }] = &out[..] else {
            panic!("expected a recall to a: {out:?}")
        };
        assert_eq!(*session, a);
        let recall_id = *recall_id;
        srv.handle(a, req(2, vec![Op::Acquire { ino: 1 }]), NOW);
        assert_eq!(srv.take_outgoing(), vec![], "the acquire waits for a's answer to the recall");
        srv.recall_done(a, recall_id, NOW);
        // b's look runs first (it came first), then a's acquire, which recalls what b
        // read of f and answers once b has dropped it.
        let out = srv.take_outgoing();
        let b_answered = out.iter().any(|o| matches!(o, Outgoing::Response { session, .. } if *session == b));
        assert!(b_answered, "{out:?}");
        let recall = out.iter().find_map(|o| match o {
            Outgoing::Notify { session, notify: p::Notify::Recall { recall_id, .. } } if *session == b => {
                Some(*recall_id)
            }
            _ => None,
        });
        let Some(recall) = recall else { panic!("expected a recall to b: {out:?}") };
        srv.recall_done(b, recall, NOW);
        let out = srv.take_outgoing();
        let [Outgoing::Response { session, response }] = &out[..] else { panic!("{out:?}") };
        assert_eq!(*session, a);
        assert!(matches!(&response.results[0], Ok(Reply::Lookup { leaf, .. }) if leaf.items.len() == 1));
        assert_eq!(srv.caps.exclusive_elsewhere(b, f.ino), Some(a), "a holds f again, as its client does");
    }

    #[test]
    fn after_a_restart_no_one_sees_older_state_than_another_clients_lost_acknowledged_change() {
        let disk = fresh_disk();
        let mut srv = Server::new(Store::open(Box::new(disk.clone())).expect("open"));
        let token = |m: p::ServerMessage| match m {
            p::ServerMessage::Welcome(w) => w.session,
            other => panic!("{other:?}"),
        };
        let (a, wa) = srv.handle_hello(&hello(None));
        let (b, wb) = srv.handle_hello(&hello(None));
        let (a, b, ta, tb) = (a.expect("a"), b.expect("b"), token(wa), token(wb));
        let mk = create_in_root;
        let lookup = |id, name: &str| p::Request {
            id,
            ops: vec![Op::Lookup { parent: 1, name: name.as_bytes().to_vec() }],
            time: None,
        };
        srv.handle_request(a, mk(1, "w"), NOW);
        srv.handle_request(b, mk(1, "y"), NOW);
        srv.handle_request(b, p::Request { id: 2, ops: vec![Op::Fsync { ino: 1 }], time: None }, NOW);
        // a's create of x is acknowledged, then the server dies before committing it.
        let lost = srv.handle_request(a, mk(2, "x"), NOW);
        assert!(lost.results[0].is_ok() && lost.seq > lost.durable);
        drop(srv.into_store().abandon());
        let mut srv = Server::new(Store::open(Box::new(disk)).expect("reopen"));
        srv.tick(millis(NOW)).expect("tick");
        // b comes back first, has nothing to replay, and looks for x: it must wait.
        srv.handle_hello(&hello(Some(tb)));
        srv.replayed(b, NOW);
        srv.handle(b, lookup(3, "x"), NOW);
        assert!(srv.take_outgoing().is_empty(), "b's look waits while a has not replayed");
        // a comes back and replays its acknowledged create, then says so.
        let (_, msg) = srv.handle_hello(&hello(Some(ta)));
        assert!(matches!(msg, p::ServerMessage::Welcome(p::Welcome { durable_seq: Some(1), .. })));
        srv.handle(a, mk(2, "x"), NOW);
        let out = srv.take_outgoing();
        assert!(matches!(&out[..], [Outgoing::Response { session, .. }] if *session == a), "a's replay runs: {out:?}");
        srv.replayed(a, NOW);
        // (The replayed create made x a's alone again: b's look recalls it first.)
        let out = srv.take_outgoing();
        let [Outgoing::Notify { session, notify: p::Notify::Recall { recall_id, .. } }] = &out[..] else {
            panic!("{out:?}")
        };
        assert_eq!(*session, a);
        srv.recall_done(a, *recall_id, NOW);
        let out = srv.take_outgoing();
        let [Outgoing::Response { session, response }] = &out[..] else { panic!("{out:?}") };
        assert_eq!(*session, b);
        assert!(matches!(&response.results[0], Ok(Reply::Lookup { attr: Some(_), .. })), "b sees a's x: {response:?}");
    }

    #[test]
    fn a_refused_oversized_change_still_takes_its_place_in_the_sessions_order() {
        let mut srv = Server::new(Store::open(Box::new(fresh_disk())).expect("open"));
        let (a, _) = srv.handle_hello(&hello(None));
        let a = a.expect("a");
        assert_eq!(srv.handle_request(a, create_in_root(1, "x"), NOW).seq, 1);
        let unlink = Op::Unlink { parent: 1, name: b"nothing".to_vec() };
        let big = p::Request { id: 2, ops: vec![unlink; p::MAX_OPS_PER_REQUEST + 1], time: None };
        let r = srv.handle_request(a, big, NOW);
        assert!(matches!(&r.results[..], [Err(e)] if e.errno == 7), "{r:?}");
        assert_eq!(r.seq, 2, "the client counted it as its second change");
        assert_eq!(srv.handle_request(a, create_in_root(3, "y"), NOW).seq, 3);
    }

    #[test]
    fn no_session_builds_on_another_sessions_change_that_a_crash_could_take_back() {
        let disk = fresh_disk();
        let mut srv = Server::new(Store::open(Box::new(disk.clone())).expect("open"));
        let (a, _) = srv.handle_hello(&hello(None));
        let (b, _) = srv.handle_hello(&hello(None));
        let (a, b) = (a.expect("a"), b.expect("b"));
        let look = |id, name: &str| p::Request {
            id,
            ops: vec![Op::Lookup { parent: 1, name: name.as_bytes().to_vec() }],
            time: None,
        };
        let found = |r: &p::Response| matches!(&r.results[0], Ok(Reply::Lookup { attr: Some(_), .. }));
        // (Each session's first change commits its record first: get those out of the way.)
        srv.handle_request(a, create_in_root(10, "a0"), NOW);
        srv.handle_request(b, create_in_root(10, "b0"), NOW);
        srv.handle_request(b, p::Request { id: 11, ops: vec![Op::Fsync { ino: 1 }], time: None }, NOW);
        let settled = srv.settling_commits;
        // a's own changes pile up without a commit, and b may look at them...
        assert!(srv.handle_request(a, create_in_root(1, "x"), NOW).results[0].is_ok());
        let r = srv.handle_request(a, create_in_root(2, "y"), NOW);
        assert!(r.seq > r.durable, "not durable yet");
        assert!(found(&srv.handle_request(b, look(1, "x"), NOW)));
        assert_eq!(srv.settling_commits, settled, "a look changes nothing a replay could reorder");
        // ...but b's change in the same directory is committed, with a's, before b is answered.
        let r = srv.handle_request(b, create_in_root(2, "z"), NOW);
        assert!(r.results[0].is_ok() && r.seq == r.durable, "{r:?}");
        assert_eq!(srv.settling_commits, settled + 1);
        // a's next change finds nothing of b's unsettled; w is a's alone, lost in the crash.
        assert!(srv.handle_request(a, create_in_root(4, "w"), NOW).results[0].is_ok());
        assert_eq!(srv.settling_commits, settled + 1);
        let r = srv.handle_request(b, p::Request { id: 3, ops: vec![Op::GetAttr { ino: 1 }], time: None }, NOW);
        assert!(r.results[0].is_ok());
        drop(srv.into_store().abandon());
        let mut srv = Server::new(Store::open(Box::new(disk)).expect("reopen"));
        let (c, _) = srv.handle_hello(&hello(None));
        let c = c.expect("c");
        for (id, name) in [(1, "x"), (2, "y"), (3, "z")] {
            assert!(found(&srv.handle_request(c, look(id, name), NOW)), "{name} was seen by another session: durable");
        }
        assert!(!found(&srv.handle_request(c, look(4, "w"), NOW)), "w was a's alone");
    }

    #[test]
    fn rights_held_before_a_restart_are_given_back_while_their_session_replays() {
        let disk = fresh_disk();
        let mut srv = Server::new(Store::open(Box::new(disk.clone())).expect("open"));
        let (a, wa) = srv.handle_hello(&hello(None));
        let p::ServerMessage::Welcome(wa) = wa else { panic!("{wa:?}") };
        let a = a.expect("a");
        let made = srv.handle_request(a, create_in_root(1, "f"), NOW);
        let Ok(Reply::Entry(f)) = &made.results[0] else { panic!("{made:?}") };
        let f = f.ino;
        srv.handle_request(a, p::Request { id: 2, ops: vec![Op::Fsync { ino: 1 }], time: None }, NOW);
        drop(srv.into_store().abandon());
        let mut srv = Server::new(Store::open(Box::new(disk)).expect("reopen"));
        srv.tick(millis(NOW)).expect("tick");
        assert_eq!(srv.caps.exclusive_elsewhere(0, f), None, "rights live in memory only");
        // b is new: re-asserting is not for it, and its look at f waits for the grace.
        let (b, _) = srv.handle_hello(&hello(None));
        let b = b.expect("b");
        let reassert = |id, ino, exclusive| p::Request { id, ops: vec![Op::Reassert { ino, exclusive }], time: None };
        srv.handle(b, reassert(1, 1, false), NOW);
        srv.handle(b, p::Request { id: 2, ops: vec![Op::GetAttr { ino: f }], time: None }, NOW);
        assert!(srv.take_outgoing().is_empty(), "b's requests wait for a's replay");
        // a resumes and takes back X on f and S on the root.
        srv.handle_hello(&hello(Some(wa.session)));
        let r = srv.handle_request(
            a,
            p::Request {
                id: 10,
                ops: vec![Op::Reassert { ino: f, exclusive: true }, Op::Reassert { ino: 1, exclusive: false }],
                time: None,
            },
            NOW,
        );
        assert_eq!(r.results, vec![Ok(Reply::Done), Ok(Reply::Done)]);
        assert_eq!(r.seq, 0, "no change: no place in the order");
        assert_eq!(srv.caps.exclusive_elsewhere(b, f), Some(a));
        srv.replayed(a, NOW);
        // Grace over: b's re-assert is refused, and b's look at f recalls a first.
        let out = srv.take_outgoing();
        let refused = out.iter().any(|o| matches!(o, Outgoing::Response { session, response } if *session == b && response.id == 1 && matches!(&response.results[0], Err(e) if e.errno == 22)));
        assert!(refused, "{out:?}");
        let recall = out.iter().find_map(|o| match o {
            Outgoing::Notify { session, notify: p::Notify::Recall { recall_id, inodes } }
                if *session == a && inodes.contains(&f) =>
            {
                Some(*recall_id)
            }
            _ => None,
        });
        let recall = recall.unwrap_or_else(|| panic!("a is asked to give f up: {out:?}"));
        assert!(
            !out.iter().any(|o| matches!(o, Outgoing::Response { response, .. } if response.id == 2)),
            "b waits for a"
        );
        srv.recall_done(a, recall, NOW);
        let out = srv.take_outgoing();
        assert!(
            matches!(&out[..], [Outgoing::Response { session, response }] if *session == b && response.results[0].is_ok()),
            "{out:?}"
        );
    }

    #[test]
    fn a_reassert_is_refused_when_another_session_holds_the_inode() {
        let mut caps = crate::caps::Caps::default();
        caps.grant(2, [7]);
        assert_eq!(caps.reassert(1, 7, true), Err(2), "X conflicts with b's S");
        assert_eq!(caps.reassert(1, 7, false), Ok(()), "S does not");
        caps.grant_exclusive(2, 8);
        assert_eq!(caps.reassert(1, 8, false), Err(2), "nothing is given back over b's X");
        assert_eq!(caps.reassert(2, 8, true), Ok(()), "b's own again");
    }

    #[test]
    fn the_grace_period_ends_without_clients_that_never_come_back() {
        let disk = fresh_disk();
        let mut srv = Server::new(Store::open(Box::new(disk.clone())).expect("open"));
        let (a, _) = srv.handle_hello(&hello(None));
        srv.handle_request(a.expect("a"), p::Request { id: 1, ops: vec![Op::Fsync { ino: 1 }], time: None }, NOW);
        drop(srv.into_store().abandon());
        let mut srv = Server::new(Store::open(Box::new(disk)).expect("reopen"));
        srv.tick(0).expect("tick");
        let (c, _) = srv.handle_hello(&hello(None));
        let c = c.expect("c");
        srv.handle(c, p::Request { id: 1, ops: vec![Op::GetAttr { ino: 1 }], time: None }, NOW);
        srv.tick(crate::caps::GRACE_MS - 1).expect("tick");
        assert!(srv.take_outgoing().is_empty(), "held during the grace period");
        srv.heard(c, crate::caps::GRACE_MS);
        srv.tick(crate::caps::GRACE_MS).expect("tick");
        assert!(matches!(&srv.take_outgoing()[..], [Outgoing::Response { session, .. }] if *session == c));
    }

    /// Request `id`: a `kind` lock of `owner` on the whole of inode 1 (fcntl, or flock).
    fn lock_root(id: u64, owner: u64, kind: p::LockKind, flock: bool) -> p::Request {
        p::Request {
            id,
            ops: vec![Op::SetLock { ino: 1, owner, start: 0, end: p::LOCK_TO_EOF, kind, flock, pid: 42 }],
            time: None,
        }
    }

    /// A server with session a holding an fcntl write lock and an flock lock on inode 1
    /// (and having changed nothing), restarted after a commit: a's token.
    fn restarted_with_a_lock_holder(disk: &MemDisk) -> (Server, SessionId, p::SessionToken) {
        let mut srv = Server::new(Store::open(Box::new(disk.clone())).expect("open"));
        let (a, w) = srv.handle_hello(&hello(None));
        let p::ServerMessage::Welcome(w) = w else { panic!("{w:?}") };
        let a = a.expect("a");
        for (id, flock) in [(1, false), (2, true)] {
            let r = srv.handle_request(a, lock_root(id, 7, p::LockKind::Write, flock), NOW);
            assert_eq!(r.results[0], Ok(Reply::Done));
        }
        // The lock gave a its record (it changed nothing), committed at once.
        drop(srv.into_store().abandon());
        let mut srv = Server::new(Store::open(Box::new(disk.clone())).expect("reopen"));
        assert!(srv.locks.is_empty(), "locks live in memory only");
        srv.tick(millis(NOW)).expect("tick");
        (srv, a, w.session)
    }

    #[test]
    fn a_lock_taken_again_in_the_grace_period_beats_a_new_sessions_conflicting_lock() {
        let disk = fresh_disk();
        let (mut srv, a, ta) = restarted_with_a_lock_holder(&disk);
        // b is first back and wants both locks: new work, held for the grace period.
        let (b, _) = srv.handle_hello(&hello(None));
        let b = b.expect("b");
        srv.handle(b, lock_root(1, 9, p::LockKind::Write, false), NOW);
        srv.handle(b, lock_root(2, 9, p::LockKind::Read, true), NOW);
        let test = Op::GetLock { ino: 1, owner: 9, start: 0, end: 0, kind: p::LockKind::Read, flock: false };
        srv.handle(b, p::Request { id: 3, ops: vec![test], time: None }, NOW);
        assert!(srv.take_outgoing().is_empty(), "b waits while a has not taken its locks again");
        // a resumes (its record was restored) and takes its locks again: they run at once,
        // as no change: no seq, nothing in the reply cache.
        let (_, msg) = srv.handle_hello(&hello(Some(ta)));
        assert!(matches!(msg, p::ServerMessage::Welcome(p::Welcome { resumed: true, durable_seq: Some(0), .. })));
        let relock = p::Request {
            id: 100,
            ops: vec![
                Op::SetLock {
                    ino: 1,
                    owner: 7,
                    start: 0,
                    end: p::LOCK_TO_EOF,
                    kind: p::LockKind::Write,
                    flock: false,
                    pid: 42,
                },
                Op::SetLock {
                    ino: 1,
                    owner: 7,
                    start: 0,
                    end: p::LOCK_TO_EOF,
                    kind: p::LockKind::Write,
                    flock: true,
                    pid: 42,
                },
            ],
            time: None,
        };
        srv.handle(a, relock, NOW);
        let out = srv.take_outgoing();
        let [Outgoing::Response { session, response }] = &out[..] else { panic!("{out:?}") };
        assert_eq!(*session, a);
        assert_eq!(response.results, vec![Ok(Reply::Done), Ok(Reply::Done)]);
        assert_eq!(response.seq, 0, "a lock is no stored change");
        assert!(srv.sessions[&a].replies.is_empty(), "nor is it kept for a retry");
        // a has replayed: b's requests run now, and meet a's locks.
        srv.replayed(a, NOW);
        let out = srv.take_outgoing();
        let answers: Vec<(u64, &p::Response)> = out
            .iter()
            .map(|o| match o {
                Outgoing::Response { session, response } => (*session, response),
                other => panic!("{other:?}"),
            })
            .collect();
        assert_eq!(answers.iter().map(|(s, r)| (*s, r.id)).collect::<Vec<_>>(), vec![(b, 1), (b, 2), (b, 3)]);
        for (_, r) in &answers[..2] {
            assert_eq!(r.results[0].as_ref().err().map(|e| e.errno), Some(11), "{r:?}");
        }
        let want = p::LockInfo { kind: p::LockKind::Write, start: 0, end: p::LOCK_TO_EOF, pid: 42 };
        assert_eq!(answers[2].1.results[0], Ok(Reply::Lock(Some(want))));
        // Once a lets go, b gets them.
        srv.handle(a, lock_root(101, 7, p::LockKind::Unlock, false), NOW);
        srv.handle(a, lock_root(102, 7, p::LockKind::Unlock, true), NOW);
        srv.handle(b, lock_root(4, 9, p::LockKind::Write, false), NOW);
        srv.handle(b, lock_root(5, 9, p::LockKind::Read, true), NOW);
        let out = srv.take_outgoing();
        assert_eq!(out.len(), 4);
        for o in &out {
            assert!(matches!(o, Outgoing::Response { response, .. } if response.results[0].is_ok()), "{o:?}");
        }
    }

    #[test]
    fn a_lock_not_taken_again_within_the_grace_period_is_lost() {
        let disk = fresh_disk();
        let (mut srv, a, ta) = restarted_with_a_lock_holder(&disk);
        let (b, _) = srv.handle_hello(&hello(None));
        let b = b.expect("b");
        srv.handle(b, lock_root(1, 9, p::LockKind::Write, false), NOW);
        srv.tick(millis(NOW) + crate::caps::GRACE_MS - 1).expect("tick");
        assert!(srv.take_outgoing().is_empty(), "held during the grace period");
        srv.heard(b, millis(NOW) + crate::caps::GRACE_MS);
        srv.tick(millis(NOW) + crate::caps::GRACE_MS).expect("tick");
        let out = srv.take_outgoing();
        assert!(
            matches!(&out[..], [Outgoing::Response { session, response }] if *session == b && response.results[0].is_ok()),
            "a never came back: b gets the lock: {out:?}"
        );
        // a's client comes back late: it was fenced when the grace period ended, and is
        // told so (its locks are lost, as a client's cut off past its lease).
        let (_, msg) = srv.handle_hello(&hello(Some(ta)));
        assert!(matches!(msg, p::ServerMessage::Welcome(p::Welcome { resumed: false, fenced: true, .. })), "{msg:?}");
        srv.handle(a, lock_root(100, 7, p::LockKind::Write, false), NOW);
        let out = srv.take_outgoing();
        assert!(matches!(&out[..], [Outgoing::Notify { notify: p::Notify::Fenced, .. }]), "{out:?}");
    }

    #[test]
    fn a_fenced_session_is_not_restored_after_a_restart() {
        // Its record's removal is committed with the fencing: a restart right after it
        // (well inside the commit interval) does not bring it back.
        let disk = fresh_disk();
        let mut srv = Server::new(Store::open(Box::new(disk.clone())).expect("open"));
        let (a, w) = srv.handle_hello(&hello(None));
        let (a, p::ServerMessage::Welcome(w)) = (a.expect("a"), w) else { panic!("no welcome") };
        let a_token = w.session;
        srv.handle_request(a, lock_root(1, 7, p::LockKind::Write, false), NOW);
        srv.heard(a, 1_000);
        srv.disconnected(a, 1_000);
        srv.tick(1_000 + crate::caps::DISCONNECTED_FENCE_MS).expect("tick");
        assert!(srv.is_fenced(a));
        drop(srv.into_store().abandon());
        let mut srv = Server::new(Store::open(Box::new(disk.clone())).expect("reopen"));
        assert!(srv.sessions.is_empty() && srv.replaying.is_empty(), "nothing to wait for");
        // Its client, back after the restart, is told its session was fenced (it must not
        // send its unanswered work again in a new session), and told once.
        let (_, msg) = srv.handle_hello(&hello(Some(a_token)));
        assert!(matches!(msg, p::ServerMessage::Welcome(p::Welcome { resumed: false, fenced: true, .. })), "{msg:?}");
        srv.store_mut().commit().expect("commit");
        drop(srv.into_store().abandon());
        let mut srv = Server::new(Store::open(Box::new(disk)).expect("reopen"));
        let (_, msg) = srv.handle_hello(&hello(Some(a_token)));
        assert!(matches!(msg, p::ServerMessage::Welcome(p::Welcome { resumed: false, fenced: false, .. })), "{msg:?}");
        assert!(srv.store.session_records().expect("records").len() <= 1, "only the new session's, if any");
    }

    #[test]
    fn a_restart_welcome_lost_with_its_connection_is_given_again() {
        // Found by `tests/sim.rs` with server crashes: the client never saw the first
        // welcome, took the second for a plain resume and sent a kept change again.
        let disk = fresh_disk();
        let mut srv = Server::new(Store::open(Box::new(disk.clone())).expect("open"));
        let (a, w) = srv.handle_hello(&hello(None));
        let (a, p::ServerMessage::Welcome(w)) = (a.expect("a"), w) else { panic!("no welcome") };
        let chmod = Op::SetAttr { ino: 1, set: p::SetAttr { mode: Some(0o700), ..Default::default() } };
        srv.handle(a, p::Request { id: 1, ops: vec![chmod], time: None }, NOW);
        srv.store_mut().commit().expect("commit");
        drop(srv.into_store().abandon());
        let mut srv = Server::new(Store::open(Box::new(disk)).expect("reopen"));
        let durable = |m: p::ServerMessage| match m {
            p::ServerMessage::Welcome(w) => (w.resumed, w.durable_seq),
            other => panic!("{other:?}"),
        };
        let resume = hello(Some(w.session));
        assert_eq!(durable(srv.handle_hello(&resume).1), (true, Some(1)));
        assert_eq!(durable(srv.handle_hello(&resume).1), (true, Some(1)), "nothing heard since: told again");
        srv.replayed(a, NOW);
        assert_eq!(durable(srv.handle_hello(&resume).1), (true, None), "the client had it: a plain resume");
    }

    /// a holds d exclusively; b's lookup in d recalls it, but a's connection is gone, so
    /// the notice is lost (the shell has nowhere to send it). Found by `tests/sim.rs`.
    fn recall_lost_with_the_connection() -> (Server, SessionId, SessionId, p::SessionToken, u64) {
        let mut srv = server();
        let (a, w) = srv.handle_hello(&hello(None));
        let p::ServerMessage::Welcome(w) = w else { panic!("{w:?}") };
        let (b, _) = srv.handle_hello(&hello(None));
        let (a, b) = (a.expect("a"), b.expect("b"));
        let mkdir = Op::Create {
            parent: 1,
            name: b"d".to_vec(),
            kind: p::FileType::Directory,
            mode: 0o755,
            rdev: 0,
            cred: p::Cred::default(),
        };
        srv.handle(a, p::Request { id: 1, ops: vec![mkdir], time: None }, NOW);
        let out = srv.take_outgoing();
        let [Outgoing::Response { response, .. }] = &out[..] else { panic!("{out:?}") };
        let Ok(Reply::Entry(d)) = &response.results[0] else { panic!("{response:?}") };
        let d = d.ino;
        srv.disconnected(a, millis(NOW));
        let lookup = p::Request { id: 1, ops: vec![Op::Lookup { parent: d, name: b"x".to_vec() }], time: None };
        srv.handle(b, lookup, NOW);
        let out = srv.take_outgoing();
        assert!(matches!(&out[..], [Outgoing::Notify { session, .. }] if *session == a), "{out:?}");
        (srv, a, b, w.session, d)
    }

    #[test]
    fn a_recall_lost_with_the_connection_is_sent_again_when_the_session_resumes() {
        let (mut srv, a, b, token, d) = recall_lost_with_the_connection();
        // a comes back within the deadline: it must hear the recall again, or it keeps
        // answering from d as its own while the server waits for nothing.
        let (again, _) = srv.handle_hello(&hello(Some(token)));
        assert_eq!(again, Some(a));
        let out = srv.take_outgoing();
        let [Outgoing::Notify { session, notify: p::Notify::Recall { recall_id, inodes } }] = &out[..] else {
            panic!("expected the recall again: {out:?}")
        };
        assert_eq!((*session, inodes.as_slice()), (a, &[d][..]));
        srv.recall_done(a, *recall_id, NOW);
        let out = srv.take_outgoing();
        assert!(matches!(&out[..], [Outgoing::Response { session, .. }] if *session == b), "{out:?}");
    }

    #[test]
    fn an_exclusive_recall_is_sent_again_on_a_late_resume_and_its_holder_fenced_if_it_stays_away() {
        let (mut srv, a, b, token, d) = recall_lost_with_the_connection();
        // Past a shared recall's deadline b's lookup still waits: exclusive rights are not
        // taken back unanswered (a may still write back what it answered itself)…
        srv.tick(millis(NOW) + crate::caps::RECALL_TIMEOUT_MS).expect("tick");
        assert!(srv.take_outgoing().is_empty());
        // …and a, back before the fencing delay, hears the recall again.
        srv.handle_hello(&hello(Some(token)));
        srv.heard(a, millis(NOW) + crate::caps::RECALL_TIMEOUT_MS);
        let out = srv.take_outgoing();
        let [Outgoing::Notify { session, notify: p::Notify::Recall { recall_id, inodes } }] = &out[..] else {
            panic!("expected the recall again: {out:?}")
        };
        assert_eq!((*session, inodes.as_slice()), (a, &[d][..]));
        let recall_id = *recall_id;
        // Its connection goes again before it answers, and it stays away: it is fenced,
        // b's lookup runs, and a's resume is told (it drops everything, replays nothing).
        let gone = millis(NOW) + crate::caps::RECALL_TIMEOUT_MS + 1;
        srv.disconnected(a, gone);
        srv.heard(b, gone + crate::caps::DISCONNECTED_FENCE_MS);
        srv.tick(gone + crate::caps::DISCONNECTED_FENCE_MS).expect("tick");
        let out = srv.take_outgoing();
        assert!(matches!(&out[..], [Outgoing::Response { session, .. }] if *session == b), "{out:?}");
        let (_, msg) = srv.handle_hello(&hello(Some(token)));
        assert!(matches!(msg, p::ServerMessage::Welcome(p::Welcome { resumed: false, fenced: true, .. })));
        assert!(srv.take_outgoing().is_empty(), "nothing is recalled from a new session");
        // Its late answer to the old recall changes nothing.
        srv.recall_done(a, recall_id, NOW);
        assert!(srv.take_outgoing().is_empty());
    }

    #[test]
    fn a_resent_change_whose_reply_waits_on_recalls_is_not_answered_before_they_are() {
        // Found by tests/sim.rs: b caches the root; a's mkdir changes it and its reply
        // waits for b's answer. a's connection breaks and a resends the mkdir: the reply
        // cache must not answer it before b has dropped what it cached.
        let (mut srv, a, b) = two_sessions();
        srv.handle(b, p::Request { id: 1, ops: vec![Op::GetAttr { ino: 1 }], time: None }, NOW);
        srv.take_outgoing();
        let mkdir = p::Request {
            id: 1,
            ops: vec![Op::Create {
                parent: 1,
                name: b"d".to_vec(),
                kind: p::FileType::Directory,
                mode: 0o755,
                rdev: 0,
                cred: p::Cred::default(),
            }],
            time: None,
        };
        srv.handle(a, mkdir.clone(), NOW);
        let out = srv.take_outgoing();
        let [Outgoing::Notify { session, notify: p::Notify::Recall { recall_id, .. } }] = &out[..] else {
            panic!("{out:?}")
        };
        assert_eq!(*session, b);
        let recall_id = *recall_id;
        srv.disconnected(a, millis(NOW));
        srv.handle(a, mkdir, NOW);
        assert!(srv.take_outgoing().is_empty(), "the resend waits with the original");
        srv.recall_done(b, recall_id, NOW);
        let out = srv.take_outgoing();
        assert!(
            matches!(&out[..], [Outgoing::Response { session, response }] if *session == a && response.id == 1),
            "{out:?}"
        );
    }
}
